// Checked loading: detail::checked_load, which the `load` override of every
// module of the library (in the module's own file) delegates to.
//
// LibTorch's Module::load reads each parameter and buffer with
// InputArchive::read, which `set_`s the tensor to whatever the archive holds:
// an archive saved from a module built with other options loads silently and
// leaves the module with tensors of other shapes. Here the whole tree is read
// and checked first, and only then assigned, exactly as InputArchive::read
// assigns (set_ on the same device, set_data across devices, without grad), so
// a good load behaves as before and a bad one changes nothing.

#include "checked_load.h"

#include <d2l/lazy.h>
#include <d2l/multi_head_attention.h>
#include <fmt/format.h>

#include <torch/utils.h>

#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checks.h"

namespace d2l {
namespace detail {
namespace {

// A tensor of the module and the archive's tensor that will replace it.
struct Assignment {
  torch::Tensor target;
  torch::Tensor source;
};

std::string describe(const torch::Tensor& t) {
  std::ostringstream s;
  s << c10::toString(t.scalar_type()) << ' ' << shape_of(t);
  if (t.layout() != torch::kStrided) s << " (" << t.layout() << ')';
  return s.str();
}

class ArchiveChecker {
 public:
  ArchiveChecker(const char* fn, const torch::nn::Module& root) : fn_(fn), root_(root) {}

  // Checks `module` against `archive`, the archive of the module at `prefix`
  // ("" for the root, else a dotted path ending in '.'), recursively; records
  // what to assign.
  void check(const torch::nn::Module& module, torch::serialize::InputArchive& archive,
             const std::string& prefix) {
    std::set<std::string> expected;
    materialize_from_archive(module, archive, prefix);
    // Multi-head attention's head count shapes no tensor: its save writes it
    // (an archive without it, from before, is taken as it is).
    if (const auto* mha = dynamic_cast<const MultiHeadAttentionImpl*>(&module)) {
      c10::IValue heads;
      if (archive.try_read(kNumHeadsKey, heads)) {
        if (!heads.isInt()) {
          fail(fmt::format("{}{}: the archive holds a {}, not a head count", prefix, kNumHeadsKey,
                           heads.tagKind()));
        }
        if (heads.toInt() != mha->options.num_heads()) {
          fail(fmt::format("{}{}: the archive was saved with {} heads, the module has {}", prefix,
                           kNumHeadsKey, heads.toInt(), mha->options.num_heads()));
        }
      }
      expected.insert(kNumHeadsKey);
    }
    for (const auto& p : module.named_parameters(/*recurse=*/false)) {
      check_tensor(archive, prefix, p.key(), p.value(), "parameter");
      expected.insert(p.key());
    }
    for (const auto& b : module.named_buffers(/*recurse=*/false)) {
      check_tensor(archive, prefix, b.key(), b.value(), "buffer");
      expected.insert(b.key());
    }
    for (const auto& child : module.named_children()) {
      // Module::save skips them, so Module::load does too.
      if (!child.value()->is_serializable()) continue;
      torch::serialize::InputArchive child_archive;
      if (!archive.try_read(child.key(), child_archive)) {
        fail(fmt::format("the archive has no submodule {}{} (expected a {})", prefix, child.key(),
                         child.value()->name()));
      }
      check(*child.value(), child_archive, prefix + child.key() + ".");
      expected.insert(child.key());
    }
    for (const auto& key : archive.keys()) {
      if (expected.count(key) != 0) continue;
      torch::Tensor extra;
      fail(fmt::format("the archive holds {}{}{}, which the module does not have", prefix, key,
                       archive.try_read(key, extra) ? " (" + describe(extra) + ")" : ""));
    }
  }

  std::vector<Assignment> assignments;
  /// Lazy layers given their width by the archive, to be emptied again if
  /// the load fails.
  std::vector<LazyModule*> materialized;

 private:
  // A lazy layer still waiting for its width takes it from the archive's
  // weight (include/d2l/lazy.h).
  void materialize_from_archive(const torch::nn::Module& module,
                                torch::serialize::InputArchive& archive,
                                const std::string& prefix) {
    auto* lazy = dynamic_cast<LazyModule*>(const_cast<torch::nn::Module*>(&module));
    if (lazy == nullptr || !lazy->has_uninitialized_params()) return;
    torch::Tensor weight;
    if (!archive.try_read("weight", weight)) return;  // reported as missing below
    std::string why;
    const auto width = lazy->width_for(weight.sizes(), why);
    if (!width) fail(fmt::format("{}weight: {}", prefix, why));
    lazy->materialize_uninitialized(*width);
    materialized.push_back(lazy);
  }

  void check_tensor(torch::serialize::InputArchive& archive, const std::string& prefix,
                    const std::string& key, const torch::Tensor& target, const char* kind) {
    torch::Tensor source;
    if (!archive.try_read(key, source)) {
      fail(fmt::format("the archive has no tensor {}{} (the module's {} is {})", prefix, key, kind,
                       describe(target)));
    }
    if (source.sizes() != target.sizes() || source.scalar_type() != target.scalar_type() ||
        source.layout() != target.layout()) {
      fail(fmt::format("{}{}: the archive holds {}, the module expects {}", prefix, key,
                       describe(source), describe(target)));
    }
    assignments.push_back({target, std::move(source)});
  }

  [[noreturn]] void fail(const std::string& what) const {
    std::ostringstream module;
    root_.pretty_print(module);
    TORCH_CHECK(false, fmt::format("{}: {}, in {}; nothing was loaded (was the archive saved "
                                   "from a module built with other options?)",
                                   fn_, what, module.str()));
  }

  const char* fn_;
  const torch::nn::Module& root_;
};

}  // namespace

void checked_load(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                  const char* fn) {
  ArchiveChecker checker(fn, module);
  try {
    checker.check(module, archive, "");
  } catch (...) {
    for (auto* lazy : checker.materialized) lazy->dematerialize();
    throw;
  }
  // What InputArchive::read does with each tensor, once all are known to fit.
  torch::NoGradGuard no_grad;
  for (auto& a : checker.assignments) {
    if (a.target.device() != a.source.device()) {
      a.target.set_data(a.source);
    } else {
      a.target.set_(a.source);
    }
  }
}

}  // namespace detail

}  // namespace d2l
