#include "transformer/options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "checks.h"

namespace d2l {

TransformerBlockOptions::TransformerBlockOptions(int64_t key_size, int64_t query_size,
                                                 int64_t value_size, int64_t num_hiddens,
                                                 std::vector<int64_t> norm_shape,
                                                 int64_t ffn_num_input, int64_t ffn_num_hiddens,
                                                 int64_t num_heads)
    : key_size_(key_size),
      query_size_(query_size),
      value_size_(value_size),
      num_hiddens_(num_hiddens),
      norm_shape_(std::move(norm_shape)),
      ffn_num_input_(ffn_num_input),
      ffn_num_hiddens_(ffn_num_hiddens),
      num_heads_(num_heads) {}

TransformerOptions::TransformerOptions(int64_t vocab_size, TransformerBlockOptions block,
                                       int64_t num_layers)
    : vocab_size_(vocab_size), block_(std::move(block)), num_layers_(num_layers) {}

namespace detail {

void check_block_options(const char* fn, const TransformerBlockOptions& o) {
  TORCH_CHECK(o.key_size() > 0 && o.query_size() > 0 && o.value_size() > 0 &&
                  o.num_hiddens() > 0 && o.ffn_num_input() > 0 && o.ffn_num_hiddens() > 0 &&
                  o.num_heads() > 0,
              fmt::format("{}: key_size, query_size, value_size, num_hiddens, ffn_num_input, "
                          "ffn_num_hiddens and num_heads must be positive, got {}",
                          fn, describe_block(fn, o)));
  TORCH_CHECK(o.num_hiddens() % o.num_heads() == 0,
              fmt::format("{}: num_hiddens={} must be a multiple of num_heads={}", fn,
                          o.num_hiddens(), o.num_heads()));
  TORCH_CHECK(!o.norm_shape().empty() &&
                  std::all_of(o.norm_shape().begin(), o.norm_shape().end(),
                              [](int64_t s) { return s > 0; }),
              fmt::format("{}: norm_shape must be non-empty and positive, got [{}]", fn,
                          fmt::join(o.norm_shape(), ", ")));
  check_dropout(fn, o.dropout());
}

void check_transformer_options(const char* fn, const TransformerOptions& o) {
  TORCH_CHECK(o.vocab_size() > 0 && o.num_layers() > 0 && o.max_len() > 0,
              fmt::format("{}: vocab_size, num_layers and max_len must be positive, got "
                          "vocab_size={}, num_layers={}, max_len={}",
                          fn, o.vocab_size(), o.num_layers(), o.max_len()));
  check_block_options(fn, o.block());
}

std::string describe_block(const char* fn, const TransformerBlockOptions& o) {
  return fmt::format("{}(key_size={}, query_size={}, value_size={}, num_hiddens={}, "
                     "norm_shape=[{}], ffn_num_input={}, ffn_num_hiddens={}, num_heads={}, "
                     "dropout={}, use_bias={}{})",
                     fn, o.key_size(), o.query_size(), o.value_size(), o.num_hiddens(),
                     fmt::join(o.norm_shape(), ", "), o.ffn_num_input(), o.ffn_num_hiddens(),
                     o.num_heads(), o.dropout(), o.use_bias(), o.causal() ? ", causal=true" : "");
}

std::string describe_transformer(const char* fn, const TransformerOptions& o) {
  const auto& b = o.block();
  return fmt::format("{}(vocab_size={}, key_size={}, query_size={}, value_size={}, "
                     "num_hiddens={}, norm_shape=[{}], ffn_num_input={}, ffn_num_hiddens={}, "
                     "num_heads={}, num_layers={}, dropout={}, use_bias={}, max_len={})",
                     fn, o.vocab_size(), b.key_size(), b.query_size(), b.value_size(),
                     b.num_hiddens(), fmt::join(b.norm_shape(), ", "), b.ffn_num_input(),
                     b.ffn_num_hiddens(), b.num_heads(), o.num_layers(), b.dropout(),
                     b.use_bias(), o.max_len());
}

TransformerBlockOptions block_options(int64_t key_size, int64_t query_size, int64_t value_size,
                                      int64_t num_hiddens, std::vector<int64_t> norm_shape,
                                      int64_t ffn_num_input, int64_t ffn_num_hiddens,
                                      int64_t num_heads, double dropout, bool use_bias) {
  return TransformerBlockOptions(key_size, query_size, value_size, num_hiddens,
                                 std::move(norm_shape), ffn_num_input, ffn_num_hiddens, num_heads)
      .dropout(dropout)
      .use_bias(use_bias);
}

torch::nn::Embedding make_embedding(const TransformerOptions& o) {
  return torch::nn::Embedding(o.vocab_size(), o.block().num_hiddens());
}

PositionalEncoding make_positional_encoding(const TransformerOptions& o) {
  return PositionalEncoding(o.block().num_hiddens(), o.block().dropout(), o.max_len());
}

MultiHeadAttention make_block_attention(const TransformerBlockOptions& o, bool bias) {
  return MultiHeadAttention(o.key_size(), o.query_size(), o.value_size(), o.num_hiddens(),
                            o.num_heads(), o.dropout(), bias);
}

}  // namespace detail
}  // namespace d2l
