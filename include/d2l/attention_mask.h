#pragma once

// LibTorch's mask conventions beside the book's valid lengths: the one mask
// argument of every attention module and functional form (docs/api.md,
// "Masks").

#include <torch/arg.h>
#include <torch/types.h>

#include <utility>

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
///
/// A lengths tensor converts to an AttentionMask, so the book's
/// `attention(queries, keys, values, valid_lens)` is a call with a mask; an
/// undefined tensor is no mask at all.
struct AttentionMask {
  AttentionMask() = default;
  /// The book's valid lengths alone (implicit: `forward(q, k, v, valid_lens)`).
  AttentionMask(torch::Tensor valid_lens)  // NOLINT(google-explicit-constructor)
      : valid_lens_(std::move(valid_lens)) {}

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

/// The mask field of the functional forms' options (DotProductAttentionFuncOptions,
/// AdditiveAttentionFuncOptions, MultiHeadAttentionFuncOptions): one
/// AttentionMask, set whole with `mask(m)` or field by field as LibTorch's
/// options name them, each setter returning the options for chaining.
template <class Options>
class AttentionMaskArgs {
 public:
  /// Which keys each query sees; a lengths tensor converts.
  Options& mask(AttentionMask mask) {
    mask_ = std::move(mask);
    return self();
  }
  const AttentionMask& mask() const noexcept { return mask_; }
  /// The book's valid lengths, (B) or (B, n), of any integer dtype (or
  /// floating holding whole numbers); undefined: every key is valid.
  Options& valid_lens(torch::Tensor valid_lens) {
    mask_.valid_lens(std::move(valid_lens));
    return self();
  }
  const torch::Tensor& valid_lens() const noexcept { return mask_.valid_lens(); }
  /// AttentionMask::key_padding_mask.
  Options& key_padding_mask(torch::Tensor key_padding_mask) {
    mask_.key_padding_mask(std::move(key_padding_mask));
    return self();
  }
  const torch::Tensor& key_padding_mask() const noexcept { return mask_.key_padding_mask(); }
  /// AttentionMask::attn_mask.
  Options& attn_mask(torch::Tensor attn_mask) {
    mask_.attn_mask(std::move(attn_mask));
    return self();
  }
  const torch::Tensor& attn_mask() const noexcept { return mask_.attn_mask(); }
  /// AttentionMask::is_causal.
  Options& is_causal(bool is_causal) {
    mask_.is_causal(is_causal);
    return self();
  }
  bool is_causal() const noexcept { return mask_.is_causal(); }

 private:
  Options& self() { return static_cast<Options&>(*this); }
  AttentionMask mask_;
};

}  // namespace d2l
