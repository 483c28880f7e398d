#pragma once

// Checks of the token ids and source lengths that the sequence-to-sequence
// modules (src/seq2seq/, src/transformer/) take.

#include <torch/nn/modules/embedding.h>
#include <torch/types.h>

namespace d2l::detail {

/// Token ids X (B, num_steps), at least one of each, integers in
/// [0, vocab_size of `embedding`), on the embedding's device, as the int64
/// tensor the embedding takes. Out of range ids are caught here: the
/// embedding's own error does not say which argument or which range.
torch::Tensor checked_tokens(const char* fn, const torch::Tensor& X,
                             const torch::nn::Embedding& embedding);

/// Valid source lengths `name`: undefined, or (batch) whole non-negative
/// numbers on the device of `ref` (named `ref_name`).
void check_enc_valid_lens(const char* fn, const char* name, const torch::Tensor& lens,
                          int64_t batch, const torch::Tensor& ref, const char* ref_name);

}  // namespace d2l::detail
