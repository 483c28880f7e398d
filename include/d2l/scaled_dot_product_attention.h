#pragma once

// Python's torch.nn.functional.scaled_dot_product_attention in C++, argument
// for argument, on LibTorch 1.13 and 2.x alike (docs/sdpa.md): the library's
// kernels on the CPU, LibTorch's own SDPA on CUDA where it has one.

#include <d2l/backend.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <optional>

namespace d2l::nn {
namespace functional {

/// Where the causal mask's diagonal sits, as Python's
/// torch.nn.attention.bias.CausalVariant names it.
enum class CausalVariant {
  /// Query i sees keys j <= i: Python's is_causal=True (causal_upper_left).
  kUpperLeft,
  /// Query i sees keys j <= i + S - L: the last query sees the last key, as
  /// queries that continue a cache of S - L earlier keys do (Python's
  /// causal_lower_right(L, S) given as attn_mask). With L > S the first
  /// L - S queries see no key and get zeros.
  kLowerRight,
};

/// The keyword arguments of Python's F.scaled_dot_product_attention, with
/// its defaults, and the library's backend.
struct ScaledDotProductAttentionFuncOptions {
  /// Which (query, key) pairs take part, broadcastable to the scores (...,
  /// Hq, L, S): boolean, true where the pair takes part (the opposite of
  /// d2l::AttentionMask::attn_mask), or floating (float32 or the queries'
  /// dtype), added to the scaled scores, -inf leaving a pair out. Undefined:
  /// every pair takes part.
  TORCH_ARG(torch::Tensor, attn_mask) = {};
  /// Probability of zeroing an attention weight, drawn whenever it is above
  /// 0 (as Python draws it: there is no training flag); in [0, 1).
  TORCH_ARG(double, dropout_p) = 0.0;
  /// Query i sees keys j <= i (aligned at the top left, as Python's
  /// is_causal; d2l::AttentionMask::is_causal aligns at the bottom right),
  /// or as causal_variant says. Not with attn_mask.
  TORCH_ARG(bool, is_causal) = false;
  /// The causal mask's alignment: Python's is_causal (kUpperLeft), or its
  /// causal_lower_right bias (kLowerRight), which Python passes as attn_mask.
  TORCH_ARG(CausalVariant, causal_variant) = CausalVariant::kUpperLeft;
  /// A sliding window (local attention), which Python's SDPA lacks: query
  /// i sees keys j >= p - window_left, where p = i on the diagonal that
  /// causal_variant names (i + S - L for kLowerRight), whether or not
  /// is_causal is set. Unset: no bound on the left. At least 0.
  TORCH_ARG(std::optional<int64_t>, window_left) = std::nullopt;
  /// The window's right edge: query i sees keys j <= p + window_right (0:
  /// as causal). Unset: no bound (but is_causal's). At least 0.
  TORCH_ARG(std::optional<int64_t>, window_right) = std::nullopt;
  /// The factor of Q Kᵀ; 1/sqrt(E) when unset.
  TORCH_ARG(std::optional<double>, scale) = std::nullopt;
  /// Keys and values of Hkv heads serve Hq = g · Hkv query heads: query head
  /// h reads key/value head h / g, in place (the kernels never repeat them).
  TORCH_ARG(bool, enable_gqa) = false;
  /// Which implementation runs (d2l::AttentionBackend); explain_path says
  /// which runs and why.
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
};

/// softmax(Q Kᵀ · scale + mask) V as Python computes it: query (..., Hq, L,
/// E), key (..., Hk, S, E), value (..., Hv, S, Ev), at least 2-D each, their
/// leading dimensions broadcast (the head dimension too, unless enable_gqa);
/// returns (..., Hq, L, Ev). A query that sees no key gets a zero output and
/// zero gradients, as in Python 2.5 and later. float32, float64, bfloat16
/// and float16 (which the CPU widens to float32 and narrows back).
torch::Tensor scaled_dot_product_attention(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const ScaledDotProductAttentionFuncOptions& options = {});

/// Attention over packed sequences of different lengths, with no padding
/// (flash-attention's varlen layout): query (Tq, Hq, E), key (Tk, Hk, E) and
/// value (Tk, Hv, Ev) hold B sequences one after another, sequence s being
/// rows cu_seqlens_q[s] to cu_seqlens_q[s + 1] of the queries and
/// cu_seqlens_k[s] to cu_seqlens_k[s + 1] of the keys (int32 or int64,
/// (B + 1), from 0, non-decreasing, ending at Tq and Tk). Each sequence's
/// queries attend to its own keys only, as scaled_dot_product_attention
/// would on that sequence alone with these options (is_causal,
/// causal_variant and the window per sequence; attn_mask is refused: there
/// is no padding to mask). Hq must be a multiple of Hk and Hv (grouped
/// heads need no enable_gqa here). Returns (Tq, Hq, Ev), on the CPU's
/// kernels a view of a heads-first (Hq, Tq, Ev) buffer (call .contiguous()
/// where a layout matters). On the CPU one kernel call runs every sequence
/// and head, its threads split by work.
torch::Tensor scaled_dot_product_attention_varlen(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const torch::Tensor& cu_seqlens_q, const torch::Tensor& cu_seqlens_k,
    const ScaledDotProductAttentionFuncOptions& options = {});

}  // namespace functional

/// Which path functional::scaled_dot_product_attention takes for these
/// arguments and why it refused the faster ones: "flash", "flash_bf16",
/// "fused_softmax", "sdpa" or "composite". The same checks and errors as
/// the call, without computing anything.
PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value,
                             const functional::ScaledDotProductAttentionFuncOptions& options);

/// The same for functional::scaled_dot_product_attention_varlen.
PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                             const torch::Tensor& cu_seqlens_k,
                             const functional::ScaledDotProductAttentionFuncOptions& options);

}  // namespace d2l::nn
