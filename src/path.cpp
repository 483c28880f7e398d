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

bool records_graph(const torch::Tensor& queries, const torch::Tensor& keys,
                   const torch::Tensor& values) {
  return torch::GradMode::is_enabled() &&
         (queries.requires_grad() || keys.requires_grad() || values.requires_grad());
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

// Path::kAuto hands dot-product attention that returns no weights to
// LibTorch's SDPA on CUDA, and on the CPU from kSdpaMinKeysCpu keys on: its
// flash kernel never builds the (B, n, m) scores, and it outruns bmm + fused
// softmax + bmm once the key rows no longer fit in cache (README, "Choosing a
// path", and `make bench-sdpa`).
Path choose_dot_product_path(const char* fn, Path path, const torch::Tensor& queries,
                             const torch::Tensor& keys, const torch::Tensor& values, double dropout,
                             bool training, bool need_weights) {
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
    // Empty sizes take the composite path, which keeps the autograd graph.
    return non_empty(queries, keys, values) ? Path::kSdpa : Path::kComposite;
  }
  const bool fused = use_fused(fn, path, queries.device());
  if (path != Path::kAuto || !D2L_HAS_SDPA || need_weights) {
    return fused ? Path::kFused : Path::kComposite;
  }
  // Dropout keeps its semantics (and random stream) on our own paths. While
  // a graph is recorded on the CPU, SDPA is taken only where its double
  // backward is tested (2.11); elsewhere the fused softmax keeps it.
  const bool sdpa =
      !(training && dropout > 0) && non_empty(queries, keys, values) &&
      (queries.is_cuda() ||
       (queries.device().is_cpu() && keys.size(1) >= kSdpaMinKeysCpu &&
        (D2L_TORCH_VERSION_AT_LEAST(2, 11) || !records_graph(queries, keys, values))));
  return sdpa ? Path::kSdpa : fused ? Path::kFused : Path::kComposite;
}

}  // namespace detail
}  // namespace d2l
