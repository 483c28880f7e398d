#pragma once

// LibTorch's mask conventions beside the book's valid lengths, for
// dot-product and multi-head attention (docs/api.md, "Masks").

#include <torch/arg.h>
#include <torch/types.h>

namespace d2l {

/// Which keys each query may see, in the book's terms (valid lengths) and in
/// LibTorch's (torch::nn::MultiheadAttention's key_padding_mask and boolean
/// attn_mask, SDPA's is_causal); every field is optional and a key is seen
/// only where all of them allow it. A row that sees no key gets zero weights
/// and a zero output, as with a valid length of 0.
///
/// Masks whose every row is a prefix (false up to some key, true after it),
/// the causal flag, and the book's lengths are turned into lengths and run
/// the fast paths; any other boolean mask runs the composite path, exactly.
struct AttentionMask {
  /// The book's valid lengths, (B) or (B, n): query i of batch entry b sees
  /// keys [0, valid_lens[b] or valid_lens[b][i]).
  TORCH_ARG(torch::Tensor, valid_lens) = {};
  /// torch::kBool (B, m): true marks a padding key that no query of that
  /// batch entry sees (torch::nn::MultiheadAttention's key_padding_mask).
  TORCH_ARG(torch::Tensor, key_padding_mask) = {};
  /// torch::kBool (n, m), or (B, n, m) (for multi-head attention (B, n, m) or
  /// (B * num_heads, n, m), as torch::nn::MultiheadAttention's): true marks a
  /// (query, key) pair that may not attend. Note that this is the opposite of
  /// at::scaled_dot_product_attention's boolean attn_mask, where true means
  /// "may attend".
  TORCH_ARG(torch::Tensor, attn_mask) = {};
  /// Query i sees keys j <= i + (m - n): the last query is aligned with the
  /// last key (PyTorch's causal_lower_right), which for n = m is the book's
  /// dec_valid_lens = arange(1, n + 1) and SDPA's is_causal, and for n < m
  /// the new queries of a decoder that keeps the past keys. Keys fewer than
  /// queries (m < n) are refused: the first queries would see nothing, and
  /// SDPA's upper-left alignment reads the same flag differently.
  TORCH_ARG(bool, is_causal) = false;
};

}  // namespace d2l
