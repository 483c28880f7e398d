#pragma once

// Multi-head attention's layers, for multi_head_attention.cpp: the checks
// (multi_head_attention_plan.cpp; the choice of path is select_multi_head's),
// and the fused node
// for small heads, the projections, the small-head kernels and the output
// projection as one autograd function (autograd/multi_head_attention.cpp;
// the kernels in cpu/multi_head_attention_kernel.cpp, Note [Small heads]).

#include <d2l/multi_head_attention.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "attention_mask_internal.h"
#include "select.h"

namespace d2l::detail {

/// functional::multi_head_attention's checks, with messages naming `fn` (the
/// function or the module that was called; a module passes its options,
/// checked after the inputs' own shapes), and what decides its path: the
/// masks resolved once per batch entry (or per head, when attn_mask gives
/// each head its own).
MultiHeadParams checked_multi_head_params(const char* fn,
                                          const MultiHeadAttentionOptions* module_options,
                                          const torch::Tensor& queries, const torch::Tensor& keys,
                                          const torch::Tensor& values,
                                          const functional::MultiHeadAttentionFuncOptions& o);

/// functional::multi_head_attention (module_options null) or a module's
/// forward, with every message naming `fn`: the checks, the choice of path
/// and the call.
std::tuple<torch::Tensor, torch::Tensor> checked_multi_head_attention(
    const char* fn, const MultiHeadAttentionOptions* module_options, const torch::Tensor& queries,
    const torch::Tensor& keys, const torch::Tensor& values,
    const functional::MultiHeadAttentionFuncOptions& o);

/// explain_path for the same call: "small_heads", or the per-head path.
PathExplanation explain_multi_head_attention(const char* fn,
                                             const MultiHeadAttentionOptions* module_options,
                                             const torch::Tensor& queries,
                                             const torch::Tensor& keys, const torch::Tensor& values,
                                             const functional::MultiHeadAttentionFuncOptions& o);

/// run_dot_product_attention on per-head queries (B · H, n, d) over keys
/// and values of B · H / group heads, each read by `group` consecutive
/// query heads (Note [Grouped heads as longer entries]); the mask per query
/// head; returns the output (B · H, n, dv) and weights (B · H, n, m).
std::tuple<torch::Tensor, torch::Tensor> grouped_heads_attention(DotProductParams params,
                                                                 int64_t group,
                                                                 DotProductPath path);

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
/// Tensors on the CPU, float or double, non-empty, small_heads, already
/// checked.
std::tuple<torch::Tensor, torch::Tensor> fused_multi_head_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const MultiHeadWeights& weights, const torch::Tensor& lens, int64_t heads, double dropout,
    bool training, bool need_weights);

}  // namespace d2l::detail
