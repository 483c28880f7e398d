#pragma once

// Note [The decoder's step cache]
// TransformerDecoder decodes one token per call in evaluation mode. The book
// keeps, per block, the block's inputs at every step so far (state[2][i]),
// concatenates the new step to them and passes them again through the
// self-attention's W_k and W_v: each step copies and projects the whole past.
// Here each block keeps those inputs in a buffer that grows by doubling, and
// its self-attention keeps their keys and values projected once in a
// MultiHeadAttentionCache (Note [Cached keys and values] in
// src/multi_head_attention_cache_internal.h): a step projects its own rows only and
// attends through MultiHeadAttention::forward_cached, with the module's
// checks and choice of path. The encoder-decoder attention's keys and values
// (fixed for a whole decoding) are projected once (project_memory).
//
// A state owns no buffer: DecoderState::cache points to a
// TransformerDecoderCache, whose blocks' BlockCache objects the states of one
// decoding share. A block's cache serves a state only when the state's
// key_values[i] is the cache's filled part (the same data and length);
// otherwise (a state advanced from an older one, as in beam search, or
// key_values set by the caller) the block builds a new cache from the state's
// key_values. So a state can be advanced any number of times, each giving the
// numbers the book's code gives. Advancing states of one decoding from
// several threads at once is not supported. d2l::select_rows (generation's
// batches and beams) selects the cache's rows with the state's
// (TransformerDecoderCache::select_rows), so a reordered state is served
// without projecting its past again.

#include <d2l/encoder_decoder.h>
#include <d2l/multi_head_attention.h>
#include <torch/types.h>

#include <memory>
#include <vector>

namespace d2l::detail {

struct BlockCache {
  /// (B, capacity, num_hiddens): the block's inputs; rows [0, length) filled.
  torch::Tensor inputs;
  int64_t length = 0;
  /// The inputs buffer of the block this one was selected from: the next
  /// select_rows writes into it once nothing else refers to it
  /// (gather_rows), so a beam's steps alternate between two buffers.
  torch::Tensor spare_inputs;
  /// The self-attention's keys and values of those inputs.
  MultiHeadAttentionCache self_attention;
  /// The encoder outputs that cross_attention was projected from.
  torch::Tensor cross_source;
  /// The encoder-decoder attention's keys and values.
  MultiHeadAttentionCache cross_attention;

  /// Whether `key_values` (a state's key_values[i], maybe undefined) is this
  /// cache's filled part.
  bool serves(const torch::Tensor& key_values) const;
  /// Writes rows [length, length + s) of X (B, s, h), growing the buffer by
  /// doubling when full.
  void append_inputs(const torch::Tensor& X);
  /// Room for `needed` rows of (batch, num_hiddens), growing the
  /// buffer as append_inputs does; the length stays.
  void reserve_inputs(int64_t batch, int64_t needed, int64_t num_hiddens,
                      const torch::TensorOptions& options);
  torch::Tensor filled_inputs() const;
};

struct TransformerDecoderCache : DecoderCache {
  std::vector<std::shared_ptr<BlockCache>> blocks;

  /// Each block's inputs and self-attention keys and values selected (the
  /// state's key_values[i] become views of the new inputs, so that the
  /// blocks serve it); the encoder-decoder attention's projections too,
  /// unless same_sources.
  std::shared_ptr<DecoderCache> select_rows(const DecoderState& state, const torch::Tensor& index,
                                            DecoderState& selected,
                                            bool same_sources) const override;
};

}  // namespace d2l::detail
