#pragma once

// What the Transformer's blocks, encoder and decoder share: the checks and
// descriptions of their options, and their multi-head attention.

#include <d2l/transformer.h>

#include <string>

namespace d2l::detail {

/// Every size positive, num_hiddens a multiple of num_heads, dropout a probability.
void check_block_options(const char* fn, const TransformerBlockOptions& o);
/// check_block_options, and vocab_size, num_layers and max_len positive.
void check_transformer_options(const char* fn, const TransformerOptions& o);

std::string describe_block(const char* fn, const TransformerBlockOptions& o);
std::string describe_transformer(const char* fn, const TransformerOptions& o);

/// The book's d2l.MultiHeadAttention(key_size, query_size, value_size,
/// num_hiddens, num_heads, dropout, bias) of a block.
MultiHeadAttention make_block_attention(const TransformerBlockOptions& o, bool bias);

}  // namespace d2l::detail
