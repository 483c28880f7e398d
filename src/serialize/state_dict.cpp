// The public state-dict functions: a torch.save'd zip archive read through
// zip.h and pickle.h and checked against a module before anything is
// assigned; and the writer of the same format.

#include <d2l/state_dict.h>

#include <d2l/lazy.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <torch/utils.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string_view>

#include "checks.h"
#include "serialize/file_bytes.h"
#include "serialize/pickle.h"
#include "serialize/zip.h"

namespace d2l {
namespace {

using serialize::Source;
using serialize::StateDict;

constexpr const char* kStream = "<stream>";

std::ofstream open_for_writing(const Source& source) {
  if (const auto why = detail::unwritable_file_reason(source.path); !why.empty()) {
    source.fail("cannot write the file: it " + why);
  }
  std::ofstream out(source.path, std::ios::binary | std::ios::trunc);
  if (!out) source.fail("cannot open the file for writing");
  return out;
}

// Checks that the file can be read (the library's reasons), then maps or
// reads it.
void check_readable(const Source& source) {
  if (const auto why = detail::unreadable_file_reason(source.path); !why.empty()) {
    source.fail("cannot read the file: it " + why);
  }
}

// The folder that holds data.pkl: torch.save names it after the file (1.13)
// or "archive" (2.x).
std::string record_prefix(const serialize::ZipReader& zip, const Source& source) {
  for (const auto& e : zip.entries()) {
    const auto slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      return e.name.substr(0, slash + 1);
    }
  }
  source.fail("the zip archive has no <folder>/data.pkl record: not a file written by torch.save");
}

// A storage's tensor: a copy of its record, or, with `borrow` (a load into a
// module, whose parameters copy the values and which drops the file's
// tensors before the bytes go), the record's bytes themselves where they
// are aligned for the dtype. A base-size Transformer's 238 MB were copied
// twice otherwise, the first time into fresh memory.
torch::Tensor load_storage(const serialize::ZipReader& zip, const std::string& prefix,
                           const std::string& key, c10::ScalarType dtype, int64_t numel,
                           const Source& source, bool borrow) {
  const std::string name = prefix + "data/" + key;
  const auto* entry = zip.find(name);
  if (entry == nullptr) source.fail(fmt::format("storage record '{}' is missing", name));
  const auto bytes = zip.read(*entry);
  const auto item = static_cast<int64_t>(c10::elementSize(dtype));
  if (numel > static_cast<int64_t>(bytes.size()) / item) {
    source.fail(fmt::format("storage record '{}' holds {} bytes, too few for {} elements of {}",
                            name, bytes.size(), numel, c10::toString(dtype)));
  }
  const auto options = torch::TensorOptions().dtype(dtype);
  if (borrow && dtype != c10::kBool &&
      reinterpret_cast<uintptr_t>(bytes.data()) % static_cast<uintptr_t>(item) == 0) {
    return torch::from_blob(const_cast<char*>(bytes.data()), {numel}, options);
  }
  auto storage = torch::empty({numel}, options);
  if (numel > 0) std::memcpy(storage.data_ptr(), bytes.data(), static_cast<size_t>(numel * item));
  // Any nonzero byte is True to Python; a bool tensor must hold 0 or 1.
  if (dtype == c10::kBool) storage = storage.view(c10::kByte).ne(0);
  return storage;
}

StateDict read_bytes(std::string_view bytes, const Source& source, bool borrow = false) {
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80) {
    source.fail(
        "this is the legacy torch.save format (before PyTorch 1.6, a bare pickle), which is not "
        "supported; re-save it in Python with torch.save(..., "
        "_use_new_zipfile_serialization=True)");
  }
  if (bytes.size() < 4 || bytes.compare(0, 4, "PK\x03\x04") != 0) {
    source.fail("not a zip archive (torch.save's format starts with \"PK\\x03\\x04\")");
  }
  const serialize::ZipReader zip(bytes, source);
  const std::string prefix = record_prefix(zip, source);
  if (const auto* order = zip.find(prefix + "byteorder")) {
    const auto value = zip.read(*order);
    if (value != "little") {
      source.fail(fmt::format("byteorder '{}' is not supported (only little-endian files)", value));
    }
  }
  const auto pkl = zip.read(*zip.find(prefix + "data.pkl"));
  return serialize::unpickle_state_dict(
      pkl,
      [&](const std::string& key, c10::ScalarType dtype, int64_t numel) {
        return load_storage(zip, prefix, key, dtype, numel, source, borrow);
      },
      source);
}

// Python's state_dict() order: a module's parameters, its buffers, then each
// child's, recursively.
// Saving a lazy layer without its width would write empty tensors that no
// module loads.
void check_materialized(const torch::nn::Module& module, const std::string& prefix) {
  if (const auto* lazy = dynamic_cast<const LazyModule*>(&module)) {
    TORCH_CHECK(!lazy->has_uninitialized_params(),
                fmt::format("d2l::save_state_dict: {} ({}) has no input width yet: run one batch "
                            "through the model (the book's apply_init) before saving",
                            prefix.empty() ? std::string("the module") : prefix, module.name()));
  }
  for (const auto& c : module.named_children()) {
    check_materialized(*c.value(), prefix + c.key() + ".");
  }
}

void collect(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& p : module.named_parameters(/*recurse=*/false))
    out.emplace_back(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    out.emplace_back(prefix + b.key(), b.value());
  for (const auto& c : module.named_children()) collect(*c.value(), prefix + c.key() + ".", out);
}

std::string describe(const torch::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), detail::shape_of(t));
}

void check_and_copy(torch::nn::Module& module, const StateDict& entries, bool strict,
                    const Source& source, std::vector<std::string>& mismatched,
                    const std::set<const void*>& converted);

// Lazy layers still waiting for their width take it from the file's weight
// (include/d2l/lazy.h); those materialised are returned, to be emptied again
// if the load fails. A weight that fits no width is reported in `mismatched`.
std::vector<LazyModule*> materialize_lazy(torch::nn::Module& module, const std::string& prefix,
                                          const std::map<std::string, torch::Tensor>& file,
                                          std::vector<std::string>& mismatched,
                                          std::map<LazyModule*, std::string>& prefixes) {
  std::vector<LazyModule*> done;
  auto* lazy = dynamic_cast<LazyModule*>(&module);
  if (lazy != nullptr && lazy->has_uninitialized_params()) {
    const auto it = file.find(prefix + "weight");
    if (it != file.end()) {
      std::string why;
      if (const auto width = lazy->width_for(it->second.sizes(), why)) {
        lazy->materialize_uninitialized(*width);
        done.push_back(lazy);
        prefixes[lazy] = prefix;
      } else {
        mismatched.push_back(fmt::format("{}weight ({})", prefix, why));
      }
    }
  }
  for (const auto& c : module.named_children()) {
    auto more = materialize_lazy(*c.value(), prefix + c.key() + ".", file, mismatched, prefixes);
    done.insert(done.end(), more.begin(), more.end());
  }
  return done;
}

void apply(torch::nn::Module& module, const StateDict& entries, bool strict, const Source& source) {
  std::vector<std::string> mismatched;
  const std::map<std::string, torch::Tensor> file(entries.begin(), entries.end());
  std::map<LazyModule*, std::string> lazy_prefixes;
  const auto lazy = materialize_lazy(module, "", file, mismatched, lazy_prefixes);
  // The layers materialised here were given their dtype by `to` before the
  // load, as PyTorch's lazy layers are: the file's values are converted.
  std::set<const void*> converted;
  for (auto* m : lazy) {
    for (const auto& p : dynamic_cast<torch::nn::Module*>(m)->parameters(/*recurse=*/false)) {
      converted.insert(p.unsafeGetTensorImpl());
    }
  }
  try {
    // A layer given its width here whose other parameters the file leaves
    // out (a non-strict load) draws them as its first forward would, rather
    // than keep uninitialised memory; the file's then overwrite theirs.
    for (auto* m : strict ? std::vector<LazyModule*>() : lazy) {
      auto& layer = *dynamic_cast<torch::nn::Module*>(m);
      const auto& prefix = lazy_prefixes.at(m);
      for (const auto& p : layer.named_parameters(/*recurse=*/false)) {
        if (file.count(prefix + p.key()) == 0) {
          m->reset_parameters();
          break;
        }
      }
    }
    check_and_copy(module, entries, strict, source, mismatched, converted);
  } catch (...) {
    for (auto* m : lazy) m->dematerialize();
    throw;
  }
}

// d2l 1.0 wraps the seq2seq encoder's and decoder's GRU in d2l.GRU, so their
// keys gain a level (`encoder.rnn.rnn.weight_ih_l0` for 0.17's
// `encoder.rnn.weight_ih_l0`): where the missing and unexpected keys differ
// just so, say which edition the file is from.
std::string edition_hint(const std::vector<std::string>& missing,
                         const std::vector<std::string>& unexpected) {
  constexpr std::string_view wrapped = "rnn.rnn.";
  const auto unwrapped = [&](const std::string& key) {
    const auto at = key.find(wrapped);
    return at == std::string::npos ? std::string()
                                   : key.substr(0, at) + key.substr(at + wrapped.size() - 4);
  };
  const std::set<std::string> missing_set(missing.begin(), missing.end());
  const std::set<std::string> unexpected_set(unexpected.begin(), unexpected.end());
  for (const auto& key : unexpected) {
    if (missing_set.count(unwrapped(key)) != 0) {
      return fmt::format(
          ". The file's GRU keys are d2l 1.0's ({}, its d2l.GRU wrapper) where the module has "
          "d2l 0.17's ({}): load it into the d2l::v1 modules (<d2l/v1/seq2seq.h>)",
          key, unwrapped(key));
    }
  }
  for (const auto& key : missing) {
    if (unexpected_set.count(unwrapped(key)) != 0) {
      return fmt::format(
          ". The file's GRU keys are d2l 0.17's ({}) where the module has d2l 1.0's ({}, its "
          "d2l.GRU wrapper): load it into the 0.17 modules (d2l::Seq2SeqEncoder, "
          "d2l::Seq2SeqDecoder of <d2l/seq2seq.h>)",
          unwrapped(key), key);
    }
  }
  return {};
}

void check_and_copy(torch::nn::Module& module, const StateDict& entries, bool strict,
                    const Source& source, std::vector<std::string>& mismatched,
                    const std::set<const void*>& converted) {
  StateDict own;
  collect(module, "", own);
  std::map<std::string, torch::Tensor> targets(own.begin(), own.end());
  std::set<std::string> seen;
  std::vector<std::string> missing, unexpected;
  for (const auto& [key, value] : entries) {
    seen.insert(key);
    const auto it = targets.find(key);
    if (it == targets.end()) {
      unexpected.push_back(key);
    } else if (value.sizes() != it->second.sizes() ||
               (value.scalar_type() != it->second.scalar_type() &&
                converted.count(it->second.unsafeGetTensorImpl()) == 0)) {
      mismatched.push_back(
          fmt::format("{} (file {}, module {})", key, describe(value), describe(it->second)));
    }
  }
  for (const auto& [key, value] : own) {
    if (seen.count(key) == 0) missing.push_back(key);
  }
  std::string problems;
  const auto add = [&](const char* what, const std::vector<std::string>& keys) {
    if (keys.empty()) return;
    problems += fmt::format("{}{} ({}): {}", problems.empty() ? "" : "; ", what, keys.size(),
                            fmt::join(keys, ", "));
  };
  add("shape or dtype mismatch", mismatched);
  if (strict) {
    add("missing keys", missing);
    add("unexpected keys", unexpected);
    if (!problems.empty()) problems += edition_hint(missing, unexpected);
  }
  if (!problems.empty()) source.fail("the state dict does not fit the module: " + problems);
  torch::NoGradGuard no_grad;
  for (const auto& [key, value] : entries) {
    const auto it = targets.find(key);
    if (it != targets.end()) it->second.copy_(value);
  }
}

void write(const StateDict& entries, std::ostream& out, const Source& source) {
  StateDict copies;
  std::set<std::string> keys;
  for (const auto& [key, t] : entries) {
    if (!keys.insert(key).second) source.fail(fmt::format("key '{}' appears twice", key));
    if (!t.defined()) source.fail(fmt::format("tensor '{}' is undefined", key));
    if (t.layout() != torch::kStrided || t.is_quantized() ||
        serialize::storage_class(t.scalar_type()) == nullptr) {
      source.fail(fmt::format(
          "tensor '{}' is {} ({}): only dense tensors of float32/64, float16, bfloat16, "
          "int8/16/32/64, uint8 or bool can be written",
          key, c10::toString(t.scalar_type()), fmt::streamed(t.layout())));
    }
    copies.emplace_back(key, t.detach().to(torch::kCPU).contiguous());
  }
  serialize::ZipWriter zip(out, source);
  const std::string folder = "archive/";
  zip.add(folder + "data.pkl", serialize::pickle_state_dict(copies));
  zip.add(folder + "byteorder", "little");
  for (size_t i = 0; i < copies.size(); ++i) {
    const auto& t = copies[i].second;
    zip.add(folder + "data/" + std::to_string(i),
            std::string_view(static_cast<const char*>(t.data_ptr()), t.nbytes()));
  }
  zip.add(folder + "version", "3\n");
  zip.finish();
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> read_state_dict(const std::string& path) {
  const Source source{"d2l::read_state_dict", path};
  check_readable(source);
  const serialize::FileBytes file(source);
  return read_bytes(file.view(), source);
}

std::vector<std::pair<std::string, torch::Tensor>> read_state_dict(std::istream& in) {
  const Source source{"d2l::read_state_dict", kStream};
  return read_bytes(serialize::read_all(in, source), source);
}

void load_state_dict(torch::nn::Module& module, const std::string& path, bool strict) {
  const Source source{"d2l::load_state_dict", path};
  check_readable(source);
  const serialize::FileBytes file(source);
  apply(module, read_bytes(file.view(), source, /*borrow=*/true), strict, source);
}

void load_state_dict(torch::nn::Module& module, std::istream& in, bool strict) {
  const Source source{"d2l::load_state_dict", kStream};
  const std::string bytes = serialize::read_all(in, source);
  apply(module, read_bytes(bytes, source, /*borrow=*/true), strict, source);
}

void write_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& entries,
                      const std::string& path) {
  const Source source{"d2l::write_state_dict", path};
  std::ofstream out = open_for_writing(source);
  write(entries, out, source);
}

void write_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& entries,
                      std::ostream& out) {
  write(entries, out, Source{"d2l::write_state_dict", kStream});
}

void save_state_dict(const torch::nn::Module& module, const std::string& path) {
  check_materialized(module, "");
  StateDict entries;
  collect(module, "", entries);
  const Source source{"d2l::save_state_dict", path};
  std::ofstream out = open_for_writing(source);
  write(entries, out, source);
}

void save_state_dict(const torch::nn::Module& module, std::ostream& out) {
  check_materialized(module, "");
  StateDict entries;
  collect(module, "", entries);
  write(entries, out, Source{"d2l::save_state_dict", kStream});
}

}  // namespace d2l
