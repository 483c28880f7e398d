// fuzz_attention's archive area: torch::load on each module of the library,
// from the archive of a module built with the same or other options, kept,
// with bytes changed, truncated, replaced by arbitrary bytes, or written by
// hand with hostile entries (other shapes, dtypes, layouts, strides, missing,
// extra or misplaced keys).
//
// The contract: LibTorch's reader either refuses the bytes or gives an
// archive; then the module's load either throws c10::Error and leaves its
// tensors bit-identical, or succeeds with every tensor of the module's own
// shape and dtype, after which the module still runs (or throws c10::Error).
// An archive that fits must load, and one that does not must be refused.

#include <d2l/attention.h>

#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "fuzz_common.h"

namespace d2l_fuzz {
namespace {

struct Made {
  std::shared_ptr<torch::nn::Module> module;
  std::function<void()> run;  // a forward call that uses every tensor
};

// Module `kind` (0 to 7) built from the sizes a, b, c (1 to 3) and `flag`.
Made make_module(int64_t kind, int64_t a, int64_t b, int64_t c, bool flag) {
  const auto seq = d2l::Seq2SeqOptions(a + 1, b, c, flag ? 2 : 1);
  const auto tokens = torch::tensor({{1, 0, a}});
  const auto enc = d2l::EncoderOutput{torch::randn({3, 1, c}), torch::randn({flag ? 2 : 1, 1, c})};
  switch (kind) {
    case 0: {
      d2l::AdditiveAttention m(a, b, c, 0.0);
      return {m.ptr(), [=]() mutable {
                m(torch::randn({1, 2, b}), torch::randn({1, 3, a}), torch::randn({1, 3, 2}));
              }};
    }
    case 1: {
      d2l::DotProductAttention m(0.0);
      return {m.ptr(), [=]() mutable {
                m(torch::randn({1, 2, 2}), torch::randn({1, 3, 2}), torch::randn({1, 3, 2}));
              }};
    }
    case 2: {
      d2l::MultiHeadAttention m(a, b, c, 2 * c, 2, 0.0, flag);
      return {m.ptr(), [=]() mutable {
                m(torch::randn({1, 2, b}), torch::randn({1, 3, a}), torch::randn({1, 3, c}));
              }};
    }
    case 3: {
      d2l::NWKernelRegression m;
      return {m.ptr(), [=]() mutable {
                m(torch::randn({2}), torch::randn({2, 3}), torch::randn({2, 3}));
              }};
    }
    case 4: {
      d2l::Seq2SeqEncoder m(seq);
      return {m.ptr(), [=]() mutable { m(tokens); }};
    }
    case 5: {
      d2l::Seq2SeqDecoder m(seq);
      return {m.ptr(), [=]() mutable { m(tokens, m->init_state(enc)); }};
    }
    case 6: {
      d2l::Seq2SeqAttentionDecoder m(seq);
      return {m.ptr(), [=]() mutable { m(tokens, m->init_state(enc)); }};
    }
    default: {
      d2l::Seq2SeqEncoder encoder(seq);
      auto m = a == 1 ? d2l::EncoderDecoder(encoder, d2l::Seq2SeqDecoder(seq))
                      : d2l::EncoderDecoder(encoder, d2l::Seq2SeqAttentionDecoder(seq));
      return {m.ptr(), [=]() mutable { m(tokens, tokens); }};
    }
  }
}

std::map<std::string, torch::Tensor> snapshot(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& p : module.named_parameters()) tensors[p.key()] = p.value().detach().clone();
  for (const auto& b : module.named_buffers()) tensors[b.key()] = b.value().detach().clone();
  return tensors;
}

bool same_kind(const std::map<std::string, torch::Tensor>& a,
               const std::map<std::string, torch::Tensor>& b, bool and_values) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto other = b.find(name);
    if (other == b.end() || t.sizes() != other->second.sizes() ||
        t.scalar_type() != other->second.scalar_type() ||
        (and_values && !torch::equal(t, other->second))) {
      return false;
    }
  }
  return true;
}

// The same values behind another memory layout, or non-finite values: an
// archive that still fits.
torch::Tensor relaid(Bytes& in, const torch::Tensor& t) {
  const int64_t n = t.numel();
  switch (in.below(4)) {
    case 0:
      return torch::cat({torch::zeros({3}, t.options()), t.reshape(-1)})
          .narrow(0, 3, n)
          .view(t.sizes());
    case 1: return t.dim() > 1 ? t.transpose(0, 1).contiguous().transpose(0, 1) : t.clone();
    case 2: return t.dim() > 0 && n > 0 ? t.select(0, 0).unsqueeze(0).expand(t.sizes()) : t;
    default: return torch::full_like(t, in.pick<double>({kNaN, kInf, -kInf, 1e38}));
  }
}

// Writes the tensors of `module` (recursively) into `archive` as Module::save
// does, with some entries made hostile; `misfit` tells whether any of them
// makes the archive not fit the module.
void write_hostile(Bytes& in, const torch::nn::Module& module,
                   torch::serialize::OutputArchive& archive, bool& misfit) {
  auto tensors = module.named_parameters(/*recurse=*/false);
  for (const auto& b : module.named_buffers(/*recurse=*/false)) tensors.insert(b.key(), b.value());
  for (const auto& item : tensors) {
    const auto& key = item.key();
    const auto t = item.value().detach();
    switch (in.below(24)) {
      case 0: misfit = true; break;  // missing
      case 1: {
        auto shape = t.sizes().vec();
        shape.push_back(1);
        archive.write(key, torch::zeros(in.flag() ? shape : std::vector<int64_t>{t.numel() + 1}));
        misfit = true;
        break;
      }
      case 2:
        archive.write(
            key,
            t.to(in.pick<torch::Dtype>({torch::kDouble, torch::kHalf, torch::kInt, torch::kBool})));
        misfit = true;
        break;
      case 3:
        archive.write(key, t.to_sparse());
        misfit = true;
        break;
      case 4:
        archive.write(key, c10::IValue(int64_t{3}));
        misfit = true;
        break;
      case 5: {
        torch::serialize::OutputArchive nested(archive.compilation_unit());
        archive.write(key, nested);
        misfit = true;
        break;
      }
      case 6:
      case 7:
      case 8: archive.write(key, relaid(in, t)); break;
      default: archive.write(key, t); break;
    }
  }
  for (const auto& child : module.named_children()) {
    if (in.below(32) == 0) {
      misfit = true;
      continue;
    }
    torch::serialize::OutputArchive nested(archive.compilation_unit());
    write_hostile(in, *child.value(), nested, misfit);
    archive.write(child.key(), nested);
  }
  if (in.below(32) == 0) {
    archive.write("extra", torch::zeros({1}));
    misfit = true;
  }
}

std::string archive_of(const torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  module.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

void fuzz_loading(Bytes& in) {
  const int64_t kind = in.below(8);
  const int64_t a = 1 + in.below(3), b = 1 + in.below(3), c = 1 + in.below(3);
  const bool flag = in.flag();
  const auto source = make_module(kind, a, b, c, flag);
  // Mostly the same options; sometimes one size or the flag differs.
  int64_t a2 = a, b2 = b, c2 = c;
  bool flag2 = flag;
  switch (in.below(8)) {
    case 0: a2 = 1 + in.below(3); break;
    case 1: b2 = 1 + in.below(3); break;
    case 2: c2 = 1 + in.below(3); break;
    case 3: flag2 = !flag; break;
    default: break;
  }
  const auto target = make_module(in.below(16) == 0 ? in.below(8) : kind, a2, b2, c2, flag2);
  const auto source_tensors = snapshot(*source.module);
  const auto before = snapshot(*target.module);
  const bool fits = same_kind(source_tensors, before, /*and_values=*/false);
  std::string bytes = archive_of(*source.module);
  int64_t mode = in.below(6);
  // Changed and arbitrary bytes can make LibTorch's own reader allocate
  // without bound (16 GB seen; docs/reliability.md, "Loading archives"): an
  // out-of-memory finding in LibTorch, not in us, that would fail the bounded
  // run of `make test` by chance. They are fuzzed on request only
  // (D2L_FUZZ_ARCHIVE_BYTES=1, for long runs under a memory limit).
  static const bool archive_bytes = std::getenv("D2L_FUZZ_ARCHIVE_BYTES") != nullptr;
  if (!archive_bytes && (mode == 1 || mode == 3)) mode = 2;
  bool misfit = !fits;
  switch (mode) {
    case 0: break;
    case 1: {
      const int64_t edits = 1 + in.below(4);
      for (int64_t e = 0; e < edits && !bytes.empty(); ++e) {
        bytes[in.u16() % bytes.size()] ^= static_cast<char>(1 + in.below(255));
      }
      break;
    }
    case 2: bytes.resize(in.u16() % (bytes.size() + 1)); break;
    case 3: {
      bytes.clear();
      for (int64_t n = in.u16(); n > 0; --n) bytes.push_back(static_cast<char>(in.byte()));
      break;
    }
    default: {
      torch::serialize::OutputArchive archive;
      misfit = false;
      write_hostile(in, *target.module, archive, misfit);
      std::ostringstream out;
      archive.save_to(out);
      bytes = out.str();
      break;
    }
  }
  current.description = "torch::load kind=" + std::to_string(kind) +
                        " mode=" + std::to_string(mode) + " fits=" + std::to_string(fits) +
                        " misfit=" + std::to_string(misfit) + " " + target.module->name();
  // What torch::load does, in its two steps: LibTorch's reader, which
  // reports some broken archives as std::runtime_error or
  // torch::jit::ErrorReport (not c10::Error; docs/reliability.md, "Loading
  // archives"), then
  // the module's load, ours.
  torch::serialize::InputArchive archive;
  try {
    std::istringstream stream(bytes);
    archive.load_from(stream);
  } catch (const std::exception&) {
    return;
  }
  try {
    target.module->load(archive);
  } catch (const c10::Error&) {
    FUZZ_CHECK(same_kind(snapshot(*target.module), before, /*and_values=*/true),
               "a refused load changed the module");
    if (mode == 0 || mode >= 4) FUZZ_CHECK(misfit, "an archive that fits was refused");
    return;
  }
  const auto after = snapshot(*target.module);
  FUZZ_CHECK(same_kind(after, before, /*and_values=*/false),
             "a load changed the module's shapes or dtypes");
  if (mode == 0 || mode >= 4) FUZZ_CHECK(!misfit, "an archive that does not fit was loaded");
  if (mode == 0) {
    FUZZ_CHECK(same_kind(after, source_tensors, /*and_values=*/true),
               "the loaded values differ from the saved ones");
  }
  target.run();
}

}  // namespace d2l_fuzz
