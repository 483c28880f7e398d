#pragma once

// What d2l 1.0's Transformer blocks and stacks (src/v1/transformer.cpp,
// src/v1/transformer_decoder.cpp) share: the checks of their constructor
// arguments and of the hidden states they take.

#include <d2l/v1/transformer.h>

#include <cstdint>

namespace d2l::v1::detail {

/// num_hiddens, ffn_num_hiddens and num_heads positive, num_hiddens a
/// multiple of num_heads, dropout a probability.
void check_block_arguments(const char* fn, int64_t num_hiddens, int64_t ffn_num_hiddens,
                           int64_t num_heads, double dropout);

/// check_block_arguments, and vocab_size and num_blks positive.
void check_stack_arguments(const char* fn, int64_t vocab_size, int64_t num_hiddens,
                           int64_t ffn_num_hiddens, int64_t num_heads, int64_t num_blks,
                           double dropout);

/// X (B, steps, num_hiddens), floating, with at least one example and step:
/// checked before any lazy layer takes a width from it.
void check_hidden_input(const char* fn, const torch::Tensor& X, int64_t num_hiddens);

/// The stacks' embedding of checked token ids (d2l::detail::checked_tokens),
/// scaled by sqrt(num_hiddens) before the positional encoding, whose values
/// lie in [-1, 1].
torch::Tensor embed(const torch::Tensor& tokens, torch::nn::Embedding& embedding,
                    PositionalEncoding& pos_encoding, int64_t num_hiddens);

}  // namespace d2l::v1::detail
