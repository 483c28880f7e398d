// The choice of implementation for every op (Note [Choosing a path]).

#include "path.h"

#include <d2l/torch_version.h>

#include <fmt/format.h>

namespace d2l {

std::string to_string(Path path) {
  switch (path) {
    case Path::kAuto: return "auto";
    case Path::kComposite: return "composite";
    case Path::kFused: return "fused";
    case Path::kSdpa: return "sdpa";
  }
  return fmt::format("Path({})", static_cast<int>(path));
}

namespace detail {
namespace {

bool non_empty(const torch::Tensor& queries, const torch::Tensor& keys,
               const torch::Tensor& values) {
  return queries.numel() > 0 && keys.numel() > 0 && values.numel() > 0;
}

}  // namespace

bool use_fused(const char* fn, Path path, const c10::Device& device) {
  TORCH_CHECK(path != Path::kSdpa,
              fmt::format("{}: Path::kSdpa (LibTorch's scaled_dot_product_attention) is only for "
                          "dot-product attention (DotProductAttention, MultiHeadAttention); use "
                          "Path::kAuto, kFused or kComposite here",
                          fn));
  TORCH_CHECK(path != Path::kFused || device.is_cpu(),
              fmt::format("{}: Path::kFused runs on the CPU, got tensors on {}; use Path::kAuto "
                          "to pick a path for the device",
                          fn, device.str()));
  return path != Path::kComposite && device.is_cpu();
}

// Path::kAuto runs dot-product attention that draws no dropout with the flash
// kernel on the CPU: it skips the padding that valid lengths mark, never
// builds the (B, n, m) scores when no weights are asked, and calls no BLAS,
// whose own thread pool fights OpenMP's (README, "Choosing a path", and
// `make bench-sdpa`). On CUDA, without weights, it runs LibTorch's SDPA (2.1+).
DotProductPath choose_dot_product_path(const char* fn, Path path, const torch::Tensor& queries,
                                       const torch::Tensor& keys, const torch::Tensor& values,
                                       double dropout, bool training, bool need_weights) {
  // Empty sizes take the softmax paths, which keep the autograd graph; the
  // flash kernel draws no dropout.
  const bool flash_eligible = !(training && dropout > 0) && non_empty(queries, keys, values);
  if (path == Path::kSdpa) {
    TORCH_CHECK(D2L_HAS_SDPA,
                fmt::format("{}: Path::kSdpa needs LibTorch 2.1 or newer "
                            "(at::scaled_dot_product_attention); this build of d2l_attention "
                            "uses LibTorch {}",
                            fn, torch_version()));
    TORCH_CHECK(!need_weights,
                fmt::format("{}: Path::kSdpa returns no attention weights; call it with "
                            "need_weights=false (DotProductAttentionOptions::"
                            "record_attention_weights(false) in the modules)",
                            fn));
    return non_empty(queries, keys, values) ? DotProductPath::kSdpa : DotProductPath::kComposite;
  }
  if (use_fused(fn, path, queries.device())) {
    return flash_eligible ? DotProductPath::kFlash : DotProductPath::kFusedSoftmax;
  }
  // Dropout keeps its semantics (and random stream) on our own paths.
  const bool sdpa =
      path == Path::kAuto && D2L_HAS_SDPA && queries.is_cuda() && flash_eligible && !need_weights;
  return sdpa ? DotProductPath::kSdpa : DotProductPath::kComposite;
}

}  // namespace detail
}  // namespace d2l
