#pragma once

// Note [Masks as lengths]
// Dot-product and multi-head attention take the book's valid lengths and
// LibTorch's masks (d2l::AttentionMask). Every kernel of the library masks by
// lengths, (B) or (B, n): query i of entry b sees keys [0, len). So the masks
// are first turned into lengths wherever that is exact: a key-padding mask
// whose rows are false up to some key and true after it is a length per entry,
// an attn_mask whose rows are so is a length per query, and the causal flag is
// the length i + 1 + m - n of query i. The lengths of all the masks given are
// combined by their minimum, and the call runs the path it runs for lengths
// (the flash kernel skips the key blocks past them). A mask that is not a
// prefix in some row becomes a boolean (B, n, m) `allowed` tensor combined
// with the rest, and the call runs the composite path (or SDPA, which takes a
// boolean mask) exactly. Reading the masks costs one synchronisation on CUDA.

#include <d2l/attention_mask.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "checks.h"

namespace d2l::detail {

/// Whether `mask` holds any of LibTorch's masks beside the lengths.
inline bool has_masks(const AttentionMask& mask) {
  return mask.key_padding_mask().defined() || mask.attn_mask().defined() || mask.is_causal();
}

/// Checks LibTorch's masks of `mask` against queries (B, n, *) and keys (B,
/// m, *): key_padding_mask torch::kBool (B, m); attn_mask torch::kBool (n,
/// m), (B, n, m) or, with `heads` > 1, (B * heads, n, m); is_causal with m >=
/// n; all on the queries' device. Errors name `fn`, the argument and the
/// shapes. The lengths are check_qkv's.
void check_masks(const char* fn, const AttentionMask& mask, const torch::Tensor& queries,
                 const torch::Tensor& keys, int64_t heads = 1);

/// What the masks of a call come to (Note [Masks as lengths]).
struct ResolvedMask {
  /// Lengths, int64 (B) or (B, n), or undefined when every key is seen (or
  /// when `allowed` holds the mask); what the call's paths mask by.
  torch::Tensor lens;
  std::optional<LengthRange> range;
  /// torch::kBool (B, n, m), true where a query may see a key, when some mask
  /// is not a prefix in every row; then `lens` is undefined.
  torch::Tensor allowed;
  /// Which mask needs `allowed`, for explain_path; empty when lengths do.
  std::string general_because;
};

/// The masks of a call with `batch` entries (B · heads for multi-head
/// attention, with its valid lengths and key-padding mask repeated per head
/// already), n queries and m keys, as lengths (or a boolean mask). Without
/// LibTorch's masks, the valid lengths and `range` (theirs) as they are.
/// Arguments already checked.
ResolvedMask resolve_masks(const char* fn, const AttentionMask& mask,
                           const std::optional<LengthRange>& range, int64_t batch, int64_t n,
                           int64_t m, const c10::Device& device);

/// `mask` for `heads` heads per batch entry: every row of `lens`, `allowed`
/// and the range's host copy repeated per head, head b * heads + i belonging
/// to entry b. The one place a resolved mask is repeated.
ResolvedMask repeat_per_head(ResolvedMask mask, int64_t heads);

}  // namespace d2l::detail
