#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include "checks.h"

namespace d2l {

torch::Tensor transpose_qkv(const torch::Tensor& X, int64_t num_heads) {
  constexpr const char* fn = "d2l::transpose_qkv";
  TORCH_CHECK(num_heads > 0, fmt::format("{}: num_heads must be positive, got {}", fn, num_heads));
  TORCH_CHECK(X.defined() && X.dim() == 3,
              fmt::format("{}: X must be a 3-D tensor (B, n, num_hiddens), got {}", fn,
                          detail::shape_of(X)));
  TORCH_CHECK(X.size(2) % num_heads == 0,
              fmt::format("{}: the feature size of X must be a multiple of num_heads={}, got X {}",
                          fn, num_heads, detail::shape_of(X)));
  // Explicit sizes instead of the book's -1, which is ambiguous for empty X.
  const int64_t batch = X.size(0), n = X.size(1);
  return X.reshape({batch, n, num_heads, X.size(2) / num_heads})
      .permute({0, 2, 1, 3})
      .reshape({batch * num_heads, n, X.size(2) / num_heads});
}

torch::Tensor transpose_output(const torch::Tensor& X, int64_t num_heads) {
  constexpr const char* fn = "d2l::transpose_output";
  TORCH_CHECK(num_heads > 0, fmt::format("{}: num_heads must be positive, got {}", fn, num_heads));
  TORCH_CHECK(X.defined() && X.dim() == 3,
              fmt::format("{}: X must be a 3-D tensor (B * num_heads, n, d), got {}", fn,
                          detail::shape_of(X)));
  TORCH_CHECK(X.size(0) % num_heads == 0,
              fmt::format("{}: the first size of X must be a multiple of num_heads={}, got X {}",
                          fn, num_heads, detail::shape_of(X)));
  const int64_t batch = X.size(0) / num_heads, n = X.size(1), d = X.size(2);
  return X.reshape({batch, num_heads, n, d})
      .permute({0, 2, 1, 3})
      .reshape({batch, n, num_heads * d});
}

MultiHeadAttentionOptions::MultiHeadAttentionOptions(int64_t key_size, int64_t query_size,
                                                     int64_t value_size, int64_t num_hiddens,
                                                     int64_t num_heads)
    : key_size_(key_size),
      query_size_(query_size),
      value_size_(value_size),
      num_hiddens_(num_hiddens),
      num_heads_(num_heads) {}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(int64_t key_size, int64_t query_size,
                                               int64_t value_size, int64_t num_hiddens,
                                               int64_t num_heads, double dropout, bool bias)
    : MultiHeadAttentionImpl(
          MultiHeadAttentionOptions(key_size, query_size, value_size, num_hiddens, num_heads)
              .dropout(dropout)
              .bias(bias)) {}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_)
    : options(options_) {
  reset();
}

namespace {

void check_options(const MultiHeadAttentionOptions& o) {
  constexpr const char* fn = "d2l::MultiHeadAttention";
  TORCH_CHECK(o.key_size() > 0 && o.query_size() > 0 && o.value_size() > 0 && o.num_hiddens() > 0 &&
                  o.num_heads() > 0,
              fmt::format("{}: key_size, query_size, value_size, num_hiddens and num_heads must "
                          "be positive, got key_size={}, query_size={}, value_size={}, "
                          "num_hiddens={}, num_heads={}",
                          fn, o.key_size(), o.query_size(), o.value_size(), o.num_hiddens(),
                          o.num_heads()));
  TORCH_CHECK(o.num_hiddens() % o.num_heads() == 0,
              fmt::format("{}: num_hiddens must be divisible by num_heads, got num_hiddens={} "
                          "and num_heads={}",
                          fn, o.num_hiddens(), o.num_heads()));
  TORCH_CHECK(o.dropout() >= 0 && o.dropout() <= 1,
              fmt::format("{}: dropout must be a probability in [0, 1], got {}", fn, o.dropout()));
}

}  // namespace

void MultiHeadAttentionImpl::reset() {
  check_options(options);
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  const int64_t h = options.num_hiddens();
  const bool bias = options.bias();
  attention = register_module(
      "attention", DotProductAttention(DotProductAttentionOptions()
                                           .dropout(options.dropout())
                                           .impl(options.impl())
                                           .record_attention_weights(
                                               options.record_attention_weights())));
  W_q = register_module("W_q", Linear(LinearOptions(options.query_size(), h).bias(bias)));
  W_k = register_module("W_k", Linear(LinearOptions(options.key_size(), h).bias(bias)));
  W_v = register_module("W_v", Linear(LinearOptions(options.value_size(), h).bias(bias)));
  W_o = register_module("W_o", Linear(LinearOptions(h, h).bias(bias)));
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::MultiHeadAttention(key_size={}, query_size={}, value_size={}, "
      "num_hiddens={}, num_heads={}, dropout={}, bias={})",
      options.key_size(), options.query_size(), options.value_size(), options.num_hiddens(),
      options.num_heads(), options.dropout(), options.bias());
}

torch::Tensor MultiHeadAttentionImpl::forward(const torch::Tensor& queries,
                                              const torch::Tensor& keys,
                                              const torch::Tensor& values,
                                              const torch::Tensor& valid_lens) {
  constexpr const char* fn = "d2l::MultiHeadAttention";
  detail::check_qkv(fn, queries, keys, values, valid_lens);
  const auto features_ok = [&](const torch::Tensor& t, int64_t size) { return t.size(2) == size; };
  TORCH_CHECK(
      features_ok(queries, options.query_size()) && features_ok(keys, options.key_size()) &&
          features_ok(values, options.value_size()),
      fmt::format("{}: queries, keys and values must have query_size={}, key_size={} and "
                  "value_size={} features, got queries {}, keys {} and values {}",
                  fn, options.query_size(), options.key_size(), options.value_size(),
                  detail::shape_of(queries), detail::shape_of(keys), detail::shape_of(values)));
  detail::check_same_device(fn, "W_q.weight", W_q->weight, "queries", queries);
  detail::check_same_dtype(fn, "W_q.weight", W_q->weight, "queries", queries);

  const int64_t heads = options.num_heads();
  // Head b * heads + i belongs to batch element b: each length is repeated per head.
  const auto lens =
      valid_lens.defined() ? valid_lens.repeat_interleave(heads, /*dim=*/0) : valid_lens;
  const auto output = attention(transpose_qkv(W_q(queries), heads), transpose_qkv(W_k(keys), heads),
                                transpose_qkv(W_v(values), heads), lens);
  return W_o(transpose_output(output, heads));
}

}  // namespace d2l
