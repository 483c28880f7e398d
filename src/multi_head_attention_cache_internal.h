#pragma once

// MultiHeadAttentionCache's storage and checks (multi_head_attention_cache.cpp),
// for the calls that attend over it (multi_head_attention_cached.cpp).

#include <d2l/multi_head_attention.h>
#include <torch/types.h>

#include "weight_signature.h"

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

// Note [Cached keys and values]
// A decoder attends at every step over the keys and values of all its steps
// so far, and over the encoder's outputs, which stay the same for a whole
// decoding. forward projects its keys and values at every call; a
// MultiHeadAttentionCache holds them projected, (B, capacity, h) with the
// heads side by side, as W_k and W_v give them, and forward_cached projects
// only the new ones into the rows after the last (the buffers doubling when
// full). The heads are then attended as forward attends them, after the same
// checks and the same choice of path, with the cached keys standing in for
// the projections of the keys:
//
// * small heads (Note [Small heads]) run the small-head kernels on the whole
//   buffer in place: the kernels read each head's keys at a row stride of h
//   and never read a key past a row's length, so the lengths (those of the
//   masks, clamped to the keys held, or the keys held) keep the unfilled rows
//   out, and nothing of the past is copied. With dropout in training the
//   filled rows are made contiguous first, so that the dropout draws the
//   random numbers the other paths draw for (B · heads, n, m) weights.
// * otherwise the filled rows are split into heads (a copy: the per-head
//   paths take (B · heads, m, d)) and run dot-product attention per head.
//
// The masks are checked and resolved against the queries and m keys as
// forward resolves them; what they resolve to does not depend on the keys'
// values, so stand-ins of the keys' shape (one element, expanded) serve.
// With autograd recording, a buffer written in place would invalidate the
// graphs of earlier calls that saved views of it: the cache then grows by
// concatenation, and the heads take the per-head path, whose autograd
// differentiates the cached projections (the small-head node differentiates
// from the raw keys and values, which a cache no longer has).

namespace d2l::detail {

struct MultiHeadAttentionCacheAccess {
  static torch::Tensor& keys(MultiHeadAttentionCache& c) { return c.keys_; }
  static torch::Tensor& values(MultiHeadAttentionCache& c) { return c.values_; }
  static const torch::Tensor& keys(const MultiHeadAttentionCache& c) { return c.keys_; }
  static const torch::Tensor& values(const MultiHeadAttentionCache& c) { return c.values_; }
  static int64_t& length(MultiHeadAttentionCache& c) { return c.length_; }
  static std::shared_ptr<const WeightSignature>& sources(MultiHeadAttentionCache& c) {
    return c.sources_;
  }
  static const std::shared_ptr<const WeightSignature>& sources(const MultiHeadAttentionCache& c) {
    return c.sources_;
  }
};

/// Whether autograd records a call with these inputs on `m`: gradients may
/// flow into the cache's graph.
bool recording(const MultiHeadAttentionImpl& m, std::initializer_list<torch::Tensor> inputs);

/// The cache against the module: filled by its W_k and W_v as they are now
/// (their bytes too, unless the cache is a decoder's: Note [Caches keyed on
/// weights]).
void check_cache_source(const char* fn, const MultiHeadAttentionImpl& m,
                        const MultiHeadAttentionCache& cache);

/// new_keys (B, s, key_size) and new_values (B, s, value_size), both or
/// neither, for a cache of B entries (if filled) in the weights' dtype and
/// device.
void check_new_keys_values(const char* fn, const MultiHeadAttentionImpl& m,
                           const torch::Tensor& new_keys, const torch::Tensor& new_values,
                           const MultiHeadAttentionCache& cache, const char* keys_name = "new_keys",
                           const char* values_name = "new_values");

/// The batch size of a call: the new keys', else the cache's (0 when empty).
int64_t batch_of(const torch::Tensor& new_keys, const MultiHeadAttentionCache& cache);

/// Projects keys and values by m's W_k and W_v and appends them, after the
/// checks: in place, doubling the buffers when full; by concatenation when
/// autograd records (`grad`).
void extend_checked(MultiHeadAttentionImpl& m, MultiHeadAttentionCache& cache,
                    const torch::Tensor& keys, const torch::Tensor& values, bool grad);

/// t.index_select(0, index) for t (B, capacity, ...) and index (R) int64,
/// with only the first `filled` entries of dimension 1 copied (the rest of
/// each row left as it comes); on the CPU for contiguous tensors one
/// allocation and a copy per row (index_select costs a decoding step several
/// ATen calls per row), elsewhere index_select. `filled` < 0: all of them.
/// The output is `spare` (its first R rows) where that is a contiguous
/// tensor of its options with at least R rows and its other sizes that
/// nothing else refers to (one handle, its storage held by it alone:
/// reusable_spare), else fresh.
torch::Tensor gather_rows(const torch::Tensor& t, const torch::Tensor& index, int64_t filled = -1,
                          const torch::Tensor& spare = {});

/// Room for `needed` keys in the cache's buffers, (batch, capacity,
/// num_hiddens) in m's dtype and on its device, for a caller that writes the
/// projections itself (the 0.17 Transformer decoder's fused step): an empty
/// cache gets buffers of max(needed, minimum) keys and records m's W_k and
/// W_v as its sources; a full one grows as appending grows it (doubling, the
/// filled rows copied). The length stays.
void reserve_keys_values(MultiHeadAttentionCache& cache, const MultiHeadAttentionImpl& m,
                         int64_t batch, int64_t needed, int64_t minimum = 8);

}  // namespace d2l::detail
