#include <d2l/additive_attention.h>

#include <torch/nn/functional/linear.h>

#include <fmt/format.h>

#include "checks.h"
#include "internal.h"

namespace d2l {
namespace functional {

torch::Tensor additive_scores(const torch::Tensor& projected_queries,
                              const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                              Impl impl) {
  constexpr const char* fn = "d2l::additive_scores";
  detail::check_floating(fn, "projected_queries", projected_queries, 3);
  detail::check_floating(fn, "projected_keys", projected_keys, 3);
  detail::check_floating(fn, "w_v", w_v, 2);
  const int64_t h = projected_queries.size(2);
  TORCH_CHECK(projected_queries.size(0) == projected_keys.size(0) &&
                  projected_keys.size(2) == h && w_v.size(0) == 1 && w_v.size(1) == h,
              fmt::format("{}: expected projected_queries (B, n, h), projected_keys (B, m, h) and "
                          "w_v (1, h), got {}, {} and {}",
                          fn, detail::shape_of(projected_queries),
                          detail::shape_of(projected_keys), detail::shape_of(w_v)));
  detail::check_same_device(fn, "projected_queries", projected_queries, "projected_keys",
                            projected_keys);
  detail::check_same_device(fn, "projected_queries", projected_queries, "w_v", w_v);
  detail::check_same_dtype(fn, "projected_queries", projected_queries, "projected_keys",
                           projected_keys);
  detail::check_same_dtype(fn, "projected_queries", projected_queries, "w_v", w_v);
  return detail::additive_scores_nocheck(projected_queries, projected_keys, w_v, impl);
}

}  // namespace functional

namespace detail {

namespace {

// The book's formulation: (B, n, 1, h) + (B, 1, m, h), tanh, then w_v.
torch::Tensor composite_scores(const torch::Tensor& projected_queries,
                               const torch::Tensor& projected_keys, const torch::Tensor& w_v) {
  const auto features = torch::tanh(projected_queries.unsqueeze(2) + projected_keys.unsqueeze(1));
  return torch::nn::functional::linear(features, w_v).squeeze(-1);
}

}  // namespace

torch::Tensor additive_scores_nocheck(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys,
                                      const torch::Tensor& w_v, Impl impl) {
  if (use_fused("d2l::additive_scores", impl, projected_queries.device())) {
    return fused_additive(projected_queries, projected_keys, w_v, {}, /*softmax=*/false);
  }
  if (impl == Impl::kComposite) return composite_scores(projected_queries, projected_keys, w_v);
  return chunked_additive_scores(projected_queries, projected_keys, w_v);
}

torch::Tensor additive_weights_nocheck(const torch::Tensor& projected_queries,
                                       const torch::Tensor& projected_keys,
                                       const torch::Tensor& w_v, const torch::Tensor& valid_lens,
                                       Impl impl) {
  if (use_fused("d2l::AdditiveAttention", impl, projected_queries.device())) {
    return fused_additive(projected_queries, projected_keys, w_v, valid_lens, /*softmax=*/true);
  }
  const auto scores = additive_scores_nocheck(projected_queries, projected_keys, w_v, impl);
  return composite_masked_softmax(scores, valid_lens);
}

std::tuple<torch::Tensor, torch::Tensor> additive_attention_nocheck(
    AdditiveAttentionImpl& attention, const torch::Tensor& projected_queries,
    const torch::Tensor& projected_keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens) {
  auto weights = additive_weights_nocheck(projected_queries, projected_keys,
                                          attention.w_v->weight, valid_lens,
                                          attention.options.impl());
  // The registered dropout module decides, as in the book (its p and mode).
  const auto& dropout = attention.dropout;
  auto output = torch::bmm(
      dropout_weights(weights, dropout->options.p(), dropout->is_training()), values);
  if (attention.options.record_attention_weights()) {
    std::lock_guard<std::mutex> lock(*attention.record_mutex_);
    attention.attention_weights = weights;
  }
  return {std::move(output), std::move(weights)};
}

}  // namespace detail

AdditiveAttentionOptions::AdditiveAttentionOptions(int64_t key_size, int64_t query_size,
                                                   int64_t num_hiddens)
    : key_size_(key_size), query_size_(query_size), num_hiddens_(num_hiddens) {}

AdditiveAttentionImpl::AdditiveAttentionImpl(int64_t key_size, int64_t query_size,
                                             int64_t num_hiddens, double dropout)
    : AdditiveAttentionImpl(
          AdditiveAttentionOptions(key_size, query_size, num_hiddens).dropout(dropout)) {}

AdditiveAttentionImpl::AdditiveAttentionImpl(const AdditiveAttentionOptions& options_)
    : options(options_) {
  reset();
}

void AdditiveAttentionImpl::reset() {
  constexpr const char* fn = "d2l::AdditiveAttention";
  TORCH_CHECK(options.key_size() > 0 && options.query_size() > 0 && options.num_hiddens() > 0,
              fmt::format("{}: key_size, query_size and num_hiddens must be positive, got "
                          "key_size={}, query_size={}, num_hiddens={}",
                          fn, options.key_size(), options.query_size(), options.num_hiddens()));
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() <= 1,
              fmt::format("{}: dropout must be a probability in [0, 1], got {}", fn,
                          options.dropout()));
  using torch::nn::LinearOptions;
  W_k = register_module(
      "W_k", torch::nn::Linear(LinearOptions(options.key_size(), options.num_hiddens()).bias(false)));
  W_q = register_module(
      "W_q",
      torch::nn::Linear(LinearOptions(options.query_size(), options.num_hiddens()).bias(false)));
  w_v = register_module("w_v",
                        torch::nn::Linear(LinearOptions(options.num_hiddens(), 1).bias(false)));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void AdditiveAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::AdditiveAttention(key_size={}, query_size={}, num_hiddens={}, "
                        "dropout={})",
                        options.key_size(), options.query_size(), options.num_hiddens(),
                        options.dropout());
}

torch::Tensor AdditiveAttentionImpl::forward(const torch::Tensor& queries,
                                             const torch::Tensor& keys,
                                             const torch::Tensor& values,
                                             const torch::Tensor& valid_lens) {
  constexpr const char* fn = "d2l::AdditiveAttention";
  detail::check_qkv(fn, queries, keys, values, valid_lens);
  TORCH_CHECK(queries.size(2) == options.query_size(),
              fmt::format("{}: queries must have query_size={} features, got queries {}", fn,
                          options.query_size(), detail::shape_of(queries)));
  TORCH_CHECK(keys.size(2) == options.key_size(),
              fmt::format("{}: keys must have key_size={} features, got keys {}", fn,
                          options.key_size(), detail::shape_of(keys)));
  detail::check_same_device(fn, "W_q.weight", W_q->weight, "queries", queries);
  detail::check_same_dtype(fn, "W_q.weight", W_q->weight, "queries", queries);

  return std::get<0>(
      detail::additive_attention_nocheck(*this, W_q(queries), W_k(keys), values, valid_lens));
}

}  // namespace d2l
