#pragma once

// What the Transformer's blocks, encoder and decoder share: the checks and
// descriptions of their options, and their multi-head attention.

#include <d2l/transformer.h>

#include <string>
#include <vector>

namespace d2l::detail {

/// Every size positive, num_hiddens a multiple of num_heads, dropout a probability.
void check_block_options(const char* fn, const TransformerBlockOptions& o);
/// check_block_options, and vocab_size, num_layers and max_len positive.
void check_transformer_options(const char* fn, const TransformerOptions& o);

std::string describe_block(const char* fn, const TransformerBlockOptions& o);
std::string describe_transformer(const char* fn, const TransformerOptions& o);

/// The book's positional block arguments as options.
TransformerBlockOptions block_options(int64_t key_size, int64_t query_size, int64_t value_size,
                                      int64_t num_hiddens, std::vector<int64_t> norm_shape,
                                      int64_t ffn_num_input, int64_t ffn_num_hiddens,
                                      int64_t num_heads, double dropout, bool use_bias);

/// The embedding and positional encoding of a TransformerEncoder or TransformerDecoder.
torch::nn::Embedding make_embedding(const TransformerOptions& o);
PositionalEncoding make_positional_encoding(const TransformerOptions& o);

/// Block `i` of `blks`, after checking that i is in [0, num_layers).
template <typename Block>
Block block_at(const char* fn, const torch::nn::Sequential& blks, int64_t i, int64_t num_layers) {
  TORCH_CHECK(i >= 0 && i < num_layers,
              fn, ": i must be in [0, num_layers=", num_layers, "), got ", i);
  return Block(blks->ptr<typename Block::Impl>(static_cast<size_t>(i)));
}

/// The book's d2l.MultiHeadAttention(key_size, query_size, value_size,
/// num_hiddens, num_heads, dropout, bias) of a block.
MultiHeadAttention make_block_attention(const TransformerBlockOptions& o, bool bias);

}  // namespace d2l::detail
