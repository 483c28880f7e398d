#pragma once

// Note [The decoder's step cache]
// TransformerDecoder decodes one token per call in evaluation mode. The book
// keeps, per block, the block's inputs at every step so far (state[2][i]),
// concatenates the new step to them and passes them again through the
// self-attention's W_k and W_v: each step copies and projects the whole past.
// Here each block keeps those inputs and their keys and values, projected
// once and split into heads, in buffers that grow by doubling; a step writes
// its own rows after the last and attends over views of the filled part. The
// encoder-decoder attention's keys and values (fixed for a whole decoding)
// are projected once too.
//
// A state owns no buffer: DecoderState::step_cache points to the blocks'
// BlockCache objects, which the states of one decoding share. A block's cache
// serves a state only when the state's key_values[i] is the cache's filled
// part (the same data and length); otherwise (a state advanced from an older
// one, as in beam search, or key_values set by the caller) the block builds a
// new cache from the state's key_values. So a state can be advanced any number
// of times, each giving the numbers the book's code gives. Advancing states of
// one decoding from several threads at once is not supported.

#include <torch/types.h>

#include <memory>
#include <vector>

namespace d2l::detail {

struct BlockCache {
  /// (B, capacity, num_hiddens): the block's inputs; rows [0, length) filled.
  torch::Tensor inputs;
  /// (B * num_heads, capacity, d): the self-attention's projected keys and values.
  torch::Tensor keys, values;
  int64_t length = 0;
  /// The encoder outputs that cross_keys and cross_values were projected from.
  torch::Tensor cross_source;
  /// (B * num_heads, enc steps, d): the encoder-decoder attention's keys and values.
  torch::Tensor cross_keys, cross_values;
  /// The encoder's valid lengths that cross_lens repeats per head, and cross_lens.
  torch::Tensor cross_lens_source, cross_lens;

  /// Whether `key_values` (a state's key_values[i], maybe undefined) is this
  /// cache's filled part.
  bool serves(const torch::Tensor& key_values) const;
  /// Writes rows [length, length + s) (growing the buffers by doubling when
  /// full): X (B, s, h), keys and values (B * num_heads, s, d).
  void append(const torch::Tensor& X, const torch::Tensor& new_keys,
              const torch::Tensor& new_values);
  /// The filled parts of inputs, keys and values.
  torch::Tensor filled_inputs() const;
  torch::Tensor filled_keys() const;
  torch::Tensor filled_values() const;
};

struct StepCache {
  std::vector<std::shared_ptr<BlockCache>> blocks;
};

}  // namespace d2l::detail
