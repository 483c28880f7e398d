#pragma once

// Additive attention's layers, for the modules built on it: checks, paths
// and the module in additive_attention.cpp, the autograd functions in
// autograd/additive_attention.cpp, the kernels in
// cpu/additive_attention_{forward,backward}_kernel.cpp (the table in
// cpu/additive_attention_kernel.cpp); the choice of path in select.cpp.

#include <torch/types.h>

#include <d2l/backend.h>

#include <cstdint>
#include <tuple>

namespace d2l::detail {

/// functional::additive_scores without the argument checks.
torch::Tensor additive_scores_nocheck(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                                      AttentionBackend backend = AttentionBackend::kAuto);

/// Masked softmax of the additive scores, by the the backend asks for.
torch::Tensor additive_weights_nocheck(const torch::Tensor& projected_queries,
                                       const torch::Tensor& projected_keys,
                                       const torch::Tensor& w_v, const torch::Tensor& valid_lens,
                                       AttentionBackend backend = AttentionBackend::kAuto);

/// Additive attention after the checks and the projections: (output, weights
/// before dropout). Apart so that a decoder can project its keys once per
/// sequence and reuse them at every step.
std::tuple<torch::Tensor, torch::Tensor> additive_attention_projected(
    const torch::Tensor& projected_queries, const torch::Tensor& projected_keys,
    const torch::Tensor& values, const torch::Tensor& w_v, const torch::Tensor& valid_lens,
    double dropout, bool training, AttentionBackend backend);

/// Additive scores by blocks of queries with ATen ops (any device), backward
/// recomputing tanh: memory stays bounded by a block's features.
/// `chunk_bytes` bounds one block's (B, c, m, h) features.
torch::Tensor chunked_additive_scores(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                                      int64_t chunk_bytes = int64_t{64} << 20);

/// The autograd functions (autograd/additive_attention.cpp): the fused CPU
/// kernel (scores, or with `softmax` their masked softmax; `w` flat (h),
/// `lens` from lengths_arg) and the chunked ATen path.
torch::Tensor additive_autograd(const torch::Tensor& projected_queries,
                                const torch::Tensor& projected_keys, const torch::Tensor& w,
                                const torch::Tensor& lens, bool softmax);
/// The fused CPU kernel through the values: (weights · values, weights), the
/// weights being the masked softmax of the scores.
std::tuple<torch::Tensor, torch::Tensor> additive_values_autograd(
    const torch::Tensor& projected_queries, const torch::Tensor& projected_keys,
    const torch::Tensor& values, const torch::Tensor& w, const torch::Tensor& lens);
/// The module's whole op on the CPU in float or double without dropout: the
/// projections by W_q (h, q) and W_k (h, k) and the fused kernel through the
/// values, as one autograd node; (output, weights), w_v (1, h).
std::tuple<torch::Tensor, torch::Tensor> additive_projected_autograd(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& W_q, const torch::Tensor& W_k, const torch::Tensor& w_v,
    const torch::Tensor& lens);
torch::Tensor chunked_additive_autograd(const torch::Tensor& projected_queries,
                                        const torch::Tensor& projected_keys,
                                        const torch::Tensor& w_v, int64_t chunk_bytes);

}  // namespace d2l::detail
