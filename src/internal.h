#pragma once

#include <d2l/backend.h>
#include <torch/types.h>

namespace d2l::detail {

/// Boolean (rows, cols) mask, true where the column index is below the row's
/// length; `lens` holds `rows` lengths in any shape.
torch::Tensor length_mask(const torch::Tensor& lens, int64_t rows, int64_t cols);

/// Softmax over the last dimension, accumulating float16/bfloat16 in float.
torch::Tensor softmax_last_dim(const torch::Tensor& X);

/// composite::masked_softmax without the argument checks, for callers that
/// have already checked them.
torch::Tensor composite_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens);

/// d2l::masked_softmax without the argument checks, by the implementation
/// `impl` asks for.
torch::Tensor masked_softmax_nocheck(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                     Impl impl = Impl::kAuto);

/// The fused CPU masked softmax of softmax(scale * X) (autograd-aware).
torch::Tensor fused_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                   double scale = 1.0);

/// fused_masked_softmax for scores the caller owns and no longer needs (a
/// fresh bmm result): when nothing records a graph through them and they are
/// contiguous float or double, the weights overwrite them (one B·n·m buffer
/// instead of two); otherwise the same as fused_masked_softmax.
torch::Tensor fused_masked_softmax_consuming(torch::Tensor X, const torch::Tensor& valid_lens,
                                             double scale = 1.0);

}  // namespace d2l::detail

namespace d2l::detail {

/// functional::additive_scores without the argument checks.
torch::Tensor additive_scores_nocheck(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys,
                                      const torch::Tensor& w_v, Impl impl = Impl::kAuto);

/// Masked softmax of the additive scores, by the implementation `impl` asks for.
torch::Tensor additive_weights_nocheck(const torch::Tensor& projected_queries,
                                       const torch::Tensor& projected_keys,
                                       const torch::Tensor& w_v, const torch::Tensor& valid_lens,
                                       Impl impl = Impl::kAuto);

/// The fused CPU additive kernel: scores, or with `softmax` their masked softmax.
torch::Tensor fused_additive(const torch::Tensor& projected_queries,
                             const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                             const torch::Tensor& valid_lens, bool softmax);

/// Additive scores by blocks of queries with ATen ops (any device), backward
/// recomputing tanh: memory stays bounded by a block's features.
/// `chunk_bytes` bounds one block's (B, c, m, h) features.
torch::Tensor chunked_additive_scores(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys,
                                      const torch::Tensor& w_v,
                                      int64_t chunk_bytes = int64_t{64} << 20);

/// Dropout of attention weights; no dispatcher call when it is the identity.
torch::Tensor dropout_weights(const torch::Tensor& weights, double p, bool training);

/// Whether `impl` runs the fused CPU kernels for tensors on `device`; throws
/// (naming `fn`) for kFused off the CPU and for kSdpa.
bool use_fused(const char* fn, Impl impl, const c10::Device& device);

/// The path functional::dot_product_attention runs for these arguments:
/// kSdpa, kFused or kComposite (never kAuto). Throws, naming `fn`, for
/// kSdpa on LibTorch older than 2.1 or with `need_weights`.
Impl choose_dot_product_impl(const char* fn, Impl impl, const torch::Tensor& queries,
                             const torch::Tensor& keys, const torch::Tensor& values,
                             double dropout, bool training, bool need_weights);

/// Keys (from this many on) at which Impl::kAuto runs LibTorch's SDPA on the
/// CPU for attention without weights (README, "Choosing a path").
constexpr int64_t kSdpaMinKeysCpu = 1024;

}  // namespace d2l::detail
