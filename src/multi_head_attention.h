#pragma once

// Multi-head attention's fused node, for multi_head_attention.cpp: the
// projections, the small-head kernels and the output projection as one
// autograd function (autograd/multi_head_attention.cpp; the kernels in
// cpu/multi_head_attention_kernel.cpp, Note [Small heads]).

#include <torch/types.h>

#include <cstdint>
#include <tuple>

namespace d2l::detail {

/// Heads of at most this many (query, key) pairs (24 × 24) run on the
/// small-head kernels: each holds its scores row by row, and its weights
/// (n × m) are kept for the backward. Larger heads run on the flash kernel,
/// whose blocks pay for themselves from about this size: self-attention of 4
/// heads, batch 16, forward+backward at 1 thread (`bench_transformer`'s
/// mha_size cases, against a build with this limit at 0) took 0.97 to 0.85
/// of the flash path's time at 24 × 24 (h 32 to 256), and 1.02 to 1.15 of it
/// at 32 × 32. Rows of at most one vector of keys (16 floats with AVX-512)
/// are much faster still: 0.37 to 0.80 of it at 8 × 8 and 16 × 16.
constexpr int64_t kSmallHeadScores = 576;

/// The parameters of one multi-head attention call. Biases may be undefined.
struct MultiHeadWeights {
  torch::Tensor W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o;
};

/// {W_o · join(attention(split(W_q q), split(W_k k), split(W_v v))) + b_o,
/// weights (B·heads, n, m) or undefined without need_weights}: the book's
/// multi-head attention with the lengths `lens` (undefined, (L) or (L, n),
/// L = B or B·heads), and dropout p on the weights in training, drawn as
/// torch::dropout draws it (the same random stream as the composite path).
/// One autograd node; a double backward recomputes with the book's ops.
/// Tensors on the CPU, float or double, non-empty, n·m at most
/// kSmallHeadScores, already checked.
std::tuple<torch::Tensor, torch::Tensor> fused_multi_head_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const MultiHeadWeights& weights, const torch::Tensor& lens, int64_t heads, double dropout,
    bool training, bool need_weights);

}  // namespace d2l::detail
