// The choice of implementation for every op (Note [Choosing a path]).

#include "select.h"

#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cpu/dot_product_attention_kernel.h"
#include "linear.h"

namespace d2l {

std::string to_string(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kAuto: return "auto";
    case AttentionBackend::kComposite: return "composite";
    case AttentionBackend::kFused: return "fused";
    case AttentionBackend::kSdpa: return "sdpa";
  }
  return fmt::format("AttentionBackend({})", static_cast<int>(backend));
}

std::string PathExplanation::to_string() const {
  auto line = fmt::format("{} (backend {}): {}", op, d2l::to_string(backend), path);
  for (const auto& reason : reasons) line += "; " + reason;
  return line;
}

namespace detail {
namespace {

bool non_empty(const torch::Tensor& queries, const torch::Tensor& keys,
               const torch::Tensor& values) {
  return queries.numel() > 0 && keys.numel() > 0 && values.numel() > 0;
}

// Appends "<path>: <why>" for each of `paths` when the caller asked why.
void refuse(std::vector<std::string>* reasons, const std::vector<const char*>& paths,
            const std::string& why) {
  if (reasons == nullptr) return;
  for (const char* path : paths) reasons->push_back(fmt::format("{}: {}", path, why));
}

std::string off_cpu(const torch::Tensor& t) {
  return fmt::format("tensors on {} (the fused kernels run on the CPU)", t.device().str());
}

constexpr const char* kCompositeAsked = "AttentionBackend::kComposite asks for the book's ops";
constexpr const char* kTrainingDropout = "dropout {} in training";

}  // namespace

MaskedSoftmaxPath select_masked_softmax(const char* fn, AttentionBackend backend,
                                        const c10::Device& device) {
  TORCH_CHECK(backend != AttentionBackend::kSdpa,
              fmt::format("{}: AttentionBackend::kSdpa (LibTorch's scaled_dot_product_attention) "
                          "is only for dot-product attention (DotProductAttention, "
                          "MultiHeadAttention); set the backend to AttentionBackend::kAuto, "
                          "kFused or kComposite here",
                          fn));
  TORCH_CHECK(backend != AttentionBackend::kFused || device.is_cpu(),
              fmt::format("{}: AttentionBackend::kFused runs on the CPU, got tensors on {}; set "
                          "the backend to AttentionBackend::kAuto to pick a path for the device",
                          fn, device.str()));
  return backend != AttentionBackend::kComposite && device.is_cpu() ? MaskedSoftmaxPath::kFused
                                                                    : MaskedSoftmaxPath::kComposite;
}

namespace {

bool use_fused(const char* fn, AttentionBackend backend, const c10::Device& device) {
  return select_masked_softmax(fn, backend, device) == MaskedSoftmaxPath::kFused;
}

}  // namespace

LinearPath select_linear(const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b,
                         AttentionBackend backend) {
  const bool bias_fits =
      !b.defined() || (b.dim() == 1 && b.size(0) == W.size(0) && b.device().is_cpu() &&
                       b.scalar_type() == W.scalar_type());
  return backend != AttentionBackend::kComposite && bias_fits && linear_splits_over_threads(x, W)
             ? LinearPath::kSplit
             : LinearPath::kFunctional;
}

const char* to_string(DotProductPath path) {
  switch (path) {
    case DotProductPath::kComposite: return "composite";
    case DotProductPath::kFusedSoftmax: return "fused_softmax";
    case DotProductPath::kFlash: return "flash";
    case DotProductPath::kFlashBf16: return "flash_bf16";
    case DotProductPath::kSdpa: return "sdpa";
  }
  return "?";
}

// AttentionBackend::kAuto runs dot-product attention that draws no dropout
// with the flash kernel on the CPU: it skips the padding that valid lengths
// mark, never builds the (B, n, m) scores when no weights are asked, and
// calls no BLAS, whose own thread pool fights OpenMP's (docs/api.md,
// "Choosing a backend", and `make bench-sdpa`). On CUDA, without weights, it
// runs LibTorch's SDPA (2.1+).
namespace {

// Why bfloat16 inputs on the flash kernel run widened to float rather than on
// its bfloat16 kernel, or empty when that kernel takes them.
std::string why_not_flash_bf16(const DotProductParams& p) {
  const CpuIsa isa = cpu_isa();
  if (isa < CpuIsa::kAvx512Bf16) {
    if (cpu_isa_available(CpuIsa::kAvx512Bf16)) {
      return fmt::format(
          "the kernels' instruction set is {} (D2L_CPU_ISA or d2l::set_cpu_isa; the bfloat16 "
          "kernel needs avx512_bf16)",
          to_string(isa));
    }
    return "this CPU or build has no AVX512-BF16 (the bfloat16 kernel multiplies with "
           "VDPBF16PS)";
  }
  if (p.need_weights) return "attention weights asked for (the bfloat16 kernel writes none)";
  return {};
}

// The flash kernel for these inputs: its bfloat16 kernel or the float one,
// saying why a reduced precision runs widened to float.
DotProductPath flash_kernel(const DotProductParams& p, std::vector<std::string>* reasons) {
  const auto type = p.queries.scalar_type();
  if (type == torch::kBFloat16) {
    const auto why = why_not_flash_bf16(p);
    if (why.empty()) {
      // On a CPU with AMX: why its tiles are not what the products run on.
      if (reasons != nullptr) {
        const std::string amx = cpu::amx_unused_reason();
        if (!amx.empty())
          refuse(reasons, {"flash_bf16_amx"}, amx + "; the products run in VDPBF16PS");
      }
      return DotProductPath::kFlashBf16;
    }
    refuse(reasons, {"flash_bf16"}, why + "; bfloat16 is widened to float");
  } else if (type == torch::kHalf) {
    refuse(reasons, {"flash_fp16"},
           "no float16 kernel (AVX512-FP16 and AMX-FP16 are not used); float16 is widened to "
           "float");
  }
  return DotProductPath::kFlash;
}

DotProductPath choose_dot_product(const char* fn, const DotProductParams& p,
                                  std::vector<std::string>* reasons) {
  const auto backend = p.backend;
  const auto& queries = p.queries;
  const double dropout = p.dropout;
  const bool training = p.training, need_weights = p.need_weights;
  const auto& general_mask = p.mask.general_because;
  const bool drops = training && dropout > 0;
  const bool empty = !non_empty(queries, p.keys, p.values);
  // Empty sizes take the softmax paths, which keep the autograd graph; the
  // flash kernel draws no dropout.
  const auto why_not_flash = [&](const std::vector<const char*>& paths) {
    if (drops)
      refuse(reasons, paths,
             fmt::format(kTrainingDropout, dropout) + " (no dropout in the kernel)");
    if (empty) refuse(reasons, paths, "a size is zero (the softmax paths keep the autograd graph)");
  };
  if (backend == AttentionBackend::kSdpa) {
    TORCH_CHECK(D2L_HAS_SDPA,
                fmt::format("{}: AttentionBackend::kSdpa needs LibTorch 2.1 or newer "
                            "(at::scaled_dot_product_attention); this build of d2l_attention "
                            "uses LibTorch {}",
                            fn, torch_version()));
    TORCH_CHECK(!need_weights,
                fmt::format("{}: AttentionBackend::kSdpa returns no attention weights; call it "
                            "with need_weights=false (DotProductAttentionOptions::"
                            "record_attention_weights(false) in the modules)",
                            fn));
    if (!empty) return DotProductPath::kSdpa;
    refuse(reasons, {"sdpa"}, "a size is zero (the composite path keeps the autograd graph)");
    return DotProductPath::kComposite;
  }
  if (use_fused(fn, backend, queries.device())) {
    if (!general_mask.empty()) {
      refuse(reasons, {"flash", "fused_softmax"},
             general_mask +
                 " (the fused kernels mask by lengths; the composite path applies "
                 "the boolean mask)");
      return DotProductPath::kComposite;
    }
    if (!drops && !empty) return flash_kernel(p, reasons);
    why_not_flash({"flash"});
    return DotProductPath::kFusedSoftmax;
  }
  if (backend == AttentionBackend::kComposite) {
    refuse(reasons, {"flash", "sdpa", "fused_softmax"}, kCompositeAsked);
    return DotProductPath::kComposite;
  }
  // kAuto off the CPU. Dropout keeps its semantics (and random stream) on
  // our own paths.
  if (D2L_HAS_SDPA && queries.is_cuda() && !drops && !empty && !need_weights) {
    return DotProductPath::kSdpa;
  }
  if (!D2L_HAS_SDPA) {
    refuse(reasons, {"sdpa"},
           fmt::format("LibTorch {} has no scaled_dot_product_attention (2.1+)", torch_version()));
  } else if (!queries.is_cuda()) {
    refuse(reasons, {"sdpa"},
           fmt::format("AttentionBackend::kAuto runs it on CUDA only, got tensors on {}",
                       queries.device().str()));
  } else {
    if (drops) {
      refuse(reasons, {"sdpa"},
             fmt::format(kTrainingDropout, dropout) +
                 " (SDPA draws from its own random stream; AttentionBackend::kSdpa accepts that)");
    }
    if (empty)
      refuse(reasons, {"sdpa"}, "a size is zero (the composite path keeps the autograd graph)");
    if (need_weights) refuse(reasons, {"sdpa"}, "attention weights asked for (SDPA returns none)");
  }
  refuse(reasons, {"flash", "fused_softmax"}, off_cpu(queries));
  return DotProductPath::kComposite;
}

}  // namespace

Selection<DotProductPath> select_dot_product(const char* fn, const DotProductParams& params,
                                             bool explain) {
  Selection<DotProductPath> selection{DotProductPath::kComposite, {}};
  selection.path = choose_dot_product(fn, params, explain ? &selection.reasons : nullptr);
  return selection;
}

Selection<DotProductPath> select_scaled_dot_product(const char* fn, const DotProductParams& p,
                                                    bool explain) {
  if (p.backend == AttentionBackend::kAuto && p.queries.is_cuda() && D2L_HAS_SDPA) {
    return {DotProductPath::kSdpa, {}};
  }
  // kSdpa asked: select_dot_product's check of LibTorch's version.
  if (p.backend == AttentionBackend::kSdpa) return select_dot_product(fn, p, explain);
  if (use_fused(fn, p.backend, p.queries.device()) && !p.mask.general_because.empty()) {
    Selection<DotProductPath> selection{DotProductPath::kComposite, {}};
    refuse(explain ? &selection.reasons : nullptr, {"flash", "fused_softmax"},
           p.mask.general_because + " (the composite path is Python's math path)");
    return selection;
  }
  return select_dot_product(fn, p, explain);
}

const char* to_string(AdditivePath path) {
  switch (path) {
    case AdditivePath::kFusedProjections: return "fused_projections";
    case AdditivePath::kFusedValues: return "fused_values";
    case AdditivePath::kFusedScores: return "fused_scores";
    case AdditivePath::kChunked: return "chunked";
    case AdditivePath::kComposite: return "composite";
  }
  return "?";
}

// The fused kernel multiplies by the values too when no dropout is drawn: the
// whole op then runs on ATen's threads, with no bmm through OpenBLAS's pool
// (docs/performance.md, "Two thread pools"); in float and double the
// projections join its autograd node. Dropout keeps weights, dropout, bmm.
namespace {

AdditivePath choose_additive(const char* fn, const AdditiveParams& p,
                             std::vector<std::string>* reasons) {
  const auto backend = p.backend;
  const auto stage = p.stage;
  const auto& queries = p.queries;
  const auto fused_paths = [stage]() -> std::vector<const char*> {
    switch (stage) {
      case AdditiveStage::kFull: return {"fused_projections", "fused_values", "fused_scores"};
      case AdditiveStage::kProjected: return {"fused_values", "fused_scores"};
      default: return {"fused_scores"};
    }
  };
  if (!use_fused(fn, backend, queries.device())) {
    refuse(
        reasons, fused_paths(),
        backend == AttentionBackend::kComposite ? std::string(kCompositeAsked) : off_cpu(queries));
    if (backend != AttentionBackend::kComposite) return AdditivePath::kChunked;
    refuse(reasons, {"chunked"}, kCompositeAsked);
    return AdditivePath::kComposite;
  }
  if (!p.mask.general_because.empty()) {
    refuse(reasons, fused_paths(),
           p.mask.general_because +
               " (the fused kernels mask by lengths; the chunked path applies the boolean mask)");
    return AdditivePath::kChunked;
  }
  if (stage == AdditiveStage::kScores) return AdditivePath::kFusedScores;
  if (p.training && p.dropout > 0) {
    refuse(reasons,
           stage == AdditiveStage::kFull
               ? std::vector<const char*>{"fused_projections", "fused_values"}
               : std::vector<const char*>{"fused_values"},
           fmt::format(kTrainingDropout, p.dropout) + " (drawn on the weights before the values)");
    return AdditivePath::kFusedScores;
  }
  if (stage == AdditiveStage::kProjected) {
    refuse(reasons, {"fused_projections"}, "the caller projected the queries and keys");
    return AdditivePath::kFusedValues;
  }
  const auto type = queries.scalar_type();
  if (type == torch::kFloat || type == torch::kDouble) return AdditivePath::kFusedProjections;
  refuse(reasons, {"fused_projections"},
         fmt::format("dtype {} (float and double only)", c10::toString(type)));
  return AdditivePath::kFusedValues;
}

// Why the heads of this call do not run as one node (Note [Small heads]), or
// empty when they do.
std::string why_not_small_heads(const MultiHeadParams& p) {
  if (p.backend == AttentionBackend::kComposite) return kCompositeAsked;
  if (p.backend == AttentionBackend::kSdpa) return "AttentionBackend::kSdpa asks for SDPA per head";
  if (p.kv_heads != p.heads) return "grouped-query heads (the per-head path folds them)";
  const auto& queries = p.queries;
  if (!queries.device().is_cpu()) {
    return fmt::format("tensors on {} (the kernels run on the CPU)", queries.device().str());
  }
  if (p.mask.allowed.defined()) return p.mask.general_because + " (the kernels mask by lengths)";
  const auto type = queries.scalar_type();
  if (type != torch::kFloat && type != torch::kDouble && type != torch::kBFloat16) {
    return fmt::format("dtype {} (the node runs in float, double, or bfloat16 with float heads)",
                       c10::toString(type));
  }
  const int64_t n = queries.size(1), m = p.keys.size(1), d = p.head_features;
  if (queries.size(0) == 0 || n == 0 || m == 0) return "a size is zero";
  if (!small_heads(n, m, d)) {
    return fmt::format(
        "heads of {} queries x {} keys x {} features (the kernels take up to 64 x 64 pairs "
        "with at most 16 features, 32 x 32 with more)",
        n, m, d);
  }
  if (p.grad_through_cache) {
    return "autograd through a cache (its node differentiates from the raw keys and values; the "
           "per-head path differentiates the cached projections)";
  }
  return {};
}

}  // namespace

Selection<AdditivePath> select_additive(const char* fn, const AdditiveParams& params,
                                        bool explain) {
  Selection<AdditivePath> selection{AdditivePath::kComposite, {}};
  selection.path = choose_additive(fn, params, explain ? &selection.reasons : nullptr);
  return selection;
}

ResolvedMask per_head_mask(const MultiHeadParams& params) {
  return params.mask_per_head ? params.mask : repeat_per_head(params.mask, params.heads);
}

MultiHeadSelection select_multi_head(const char* fn, const MultiHeadParams& params, bool explain) {
  MultiHeadSelection selection;
  const auto why = why_not_small_heads(params);
  selection.path = why.empty() ? MultiHeadPath::kSmallHeads : MultiHeadPath::kPerHead;
  if (why.empty()) return selection;
  if (explain) selection.reasons.push_back("small_heads: " + why);
  // The heads' shapes, one element expanded, grouped heads folded (Note
  // [Grouped heads as longer entries]).
  const auto& q = params.queries;
  const int64_t batch = q.size(0) * params.kv_heads, group = params.heads / params.kv_heads;
  const auto head_shaped = [&](int64_t rows) {
    return torch::empty({1}, q.options()).expand({batch, rows, params.head_features});
  };
  const auto keys = head_shaped(params.keys.size(1));
  auto inner =
      select_dot_product(fn,
                         {head_shaped(group * q.size(1)), keys, keys, per_head_mask(params),
                          params.backend, params.dropout, params.training, params.need_weights},
                         explain);
  selection.per_head = inner.path;
  selection.reasons.insert(selection.reasons.end(), inner.reasons.begin(), inner.reasons.end());
  return selection;
}

bool logging_paths() {
  static const bool on = [] {
    const char* value = std::getenv("D2L_LOG_PATH");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  return on;
}

void log_path(const char* fn, AttentionBackend backend, const char* path,
              const std::vector<std::string>& reasons) {
  const auto line = PathExplanation{fn, backend, path, reasons}.to_string();
  std::fprintf(stderr, "[d2l] %s\n", line.c_str());
}

}  // namespace detail
}  // namespace d2l
