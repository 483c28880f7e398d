// d2l 1.0's AdditiveAttention and MultiHeadAttention (include/d2l/v1/attention.h):
// the book's lazy layers in front of the 0.17 edition's functional forms, so
// both editions run the same checked paths.

#include <d2l/v1/attention.h>

#include <fmt/format.h>

#include <ostream>

#include "../attention_weights.h"
#include "../checked_load.h"
#include "../checks.h"
#include "../lazy_internal.h"
#include "../multi_head_attention_internal.h"

namespace d2l::v1 {
namespace {

// The ranks the functional forms check, checked before any lazy layer takes
// its width from an input that will be refused.
void check_ranks(const char* fn, const torch::Tensor& queries, const torch::Tensor& keys,
                 const torch::Tensor& values) {
  d2l::detail::check_floating(fn, "queries", queries, 3);
  d2l::detail::check_floating(fn, "keys", keys, 3);
  d2l::detail::check_floating(fn, "values", values, 3);
}

void check_fixed(const char* fn, std::initializer_list<const LazyLinear*> layers) {
  for (const auto* layer : layers) {
    TORCH_CHECK(!(*layer)->has_uninitialized_params(),
                fmt::format("{}: the input widths are not known yet: call forward once (the "
                            "book's apply_init) or load a state dict first",
                            fn));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// AdditiveAttention

AdditiveAttentionImpl::AdditiveAttentionImpl(int64_t num_hiddens_, double dropout_)
    : num_hiddens(num_hiddens_), dropout_p(dropout_) {
  reset();
}

void AdditiveAttentionImpl::reset() {
  const char* fn = "d2l::v1::AdditiveAttention";
  TORCH_CHECK(num_hiddens > 0,
              fmt::format("{}: num_hiddens must be positive, got {}", fn, num_hiddens));
  d2l::detail::check_dropout(fn, dropout_p);
  W_k = register_module("W_k", LazyLinear(num_hiddens, /*bias=*/false));
  W_q = register_module("W_q", LazyLinear(num_hiddens, /*bias=*/false));
  w_v = register_module("w_v", LazyLinear(1, /*bias=*/false));
  dropout = register_module("dropout", torch::nn::Dropout(dropout_p));
}

void AdditiveAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::AdditiveAttention(num_hiddens=" << num_hiddens << ", dropout=" << dropout_p
         << ")";
}

void AdditiveAttentionImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::AdditiveAttention::load");
}

void AdditiveAttentionImpl::ensure_widths(const char* fn, const torch::Tensor& queries,
                                          const torch::Tensor& keys, const torch::Tensor& values) {
  check_ranks(fn, queries, keys, values);
  W_q->ensure_width(fn, "queries", queries);
  W_k->ensure_width(fn, "keys", keys);
  if (w_v->has_uninitialized_params()) w_v->materialize(num_hiddens);
}

functional::AdditiveAttentionFuncOptions AdditiveAttentionImpl::call(const char* fn,
                                                                     const AttentionMask& mask,
                                                                     bool need_weights) const {
  check_fixed(fn, {&W_q, &W_k, &w_v});
  return functional::AdditiveAttentionFuncOptions(W_q->weight, W_k->weight, w_v->weight)
      .dropout(dropout->options.p())
      .training(dropout->is_training())
      .backend(backend)
      .need_weights(need_weights)
      .mask(mask);
}

torch::Tensor AdditiveAttentionImpl::forward(const torch::Tensor& queries,
                                             const torch::Tensor& keys,
                                             const torch::Tensor& values,
                                             const AttentionMask& mask) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::AdditiveAttention::forward";
  ensure_widths(fn, queries, keys, values);
  auto [output, weights] =
      functional::additive_attention(queries, keys, values, call(fn, mask, /*need_weights=*/true));
  if (d2l::detail::records_weights(true)) {
    d2l::detail::record_weights(attention_weights, std::move(weights));
  }
  return output;
}

std::tuple<torch::Tensor, torch::Tensor> AdditiveAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AttentionMask& mask) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::AdditiveAttention::forward_with_weights";
  ensure_widths(fn, queries, keys, values);
  return functional::additive_attention(queries, keys, values,
                                        call(fn, mask, /*need_weights=*/true));
}

PathExplanation AdditiveAttentionImpl::explain_path(const torch::Tensor& queries,
                                                    const torch::Tensor& keys,
                                                    const torch::Tensor& values,
                                                    const AttentionMask& mask) const {
  return d2l::explain_path(queries, keys, values,
                           call("d2l::v1::AdditiveAttention::explain_path", mask, true));
}

torch::Tensor AdditiveAttentionImpl::last_attention_weights() const {
  return d2l::detail::load_weights(attention_weights);
}

// ---------------------------------------------------------------------------
// MultiHeadAttention

MultiHeadAttentionImpl::MultiHeadAttentionImpl(int64_t num_hiddens_, int64_t num_heads_,
                                               double dropout, bool bias_)
    : num_hiddens(num_hiddens_), num_heads(num_heads_), dropout_p(dropout), bias(bias_) {
  reset();
}

void MultiHeadAttentionImpl::reset() {
  const char* fn = "d2l::v1::MultiHeadAttention";
  TORCH_CHECK(num_hiddens > 0 && num_heads > 0 && num_hiddens % num_heads == 0,
              fmt::format("{}: num_hiddens and num_heads must be positive and num_hiddens a "
                          "multiple of num_heads, got num_hiddens={}, num_heads={}",
                          fn, num_hiddens, num_heads));
  d2l::detail::check_dropout(fn, dropout_p);
  attention = register_module("attention", DotProductAttention(dropout_p));
  W_q = register_module("W_q", LazyLinear(num_hiddens, bias));
  W_k = register_module("W_k", LazyLinear(num_hiddens, bias));
  W_v = register_module("W_v", LazyLinear(num_hiddens, bias));
  W_o = register_module("W_o", LazyLinear(num_hiddens, bias));
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::MultiHeadAttention(num_hiddens=" << num_hiddens
         << ", num_heads=" << num_heads << ", dropout=" << dropout_p
         << ", bias=" << std::boolalpha << bias << ")";
}

void MultiHeadAttentionImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::MultiHeadAttention::load");
}

void MultiHeadAttentionImpl::ensure_widths(const char* fn, const torch::Tensor& queries,
                                           const torch::Tensor& keys,
                                           const torch::Tensor& values) {
  check_ranks(fn, queries, keys, values);
  W_q->ensure_width(fn, "queries", queries);
  W_k->ensure_width(fn, "keys", keys);
  W_v->ensure_width(fn, "values", values);
  if (W_o->has_uninitialized_params()) W_o->materialize(num_hiddens);
}

functional::MultiHeadAttentionFuncOptions MultiHeadAttentionImpl::call(const char* fn,
                                                                      const AttentionMask& mask,
                                                                      bool need_weights) const {
  check_fixed(fn, {&W_q, &W_k, &W_v, &W_o});
  return functional::MultiHeadAttentionFuncOptions(num_heads, W_q->weight, W_k->weight,
                                                   W_v->weight, W_o->weight)
      .b_q(W_q->bias)
      .b_k(W_k->bias)
      .b_v(W_v->bias)
      .b_o(W_o->bias)
      .dropout(attention->dropout->options.p())
      .training(attention->dropout->is_training())
      .backend(attention->options.backend())
      .need_weights(need_weights)
      .mask(mask);
}

torch::Tensor MultiHeadAttentionImpl::forward(const torch::Tensor& queries,
                                              const torch::Tensor& keys,
                                              const torch::Tensor& values,
                                              const AttentionMask& mask) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::MultiHeadAttention";
  ensure_widths(fn, queries, keys, values);
  const bool record = detail::records_weights(attention->options.record_attention_weights());
  auto [output, weights] = d2l::detail::checked_multi_head_attention(fn, nullptr, queries, keys, values,
                                                                call(fn, mask, record));
  if (record) d2l::detail::record_weights(attention->attention_weights, std::move(weights));
  return output;
}

std::tuple<torch::Tensor, torch::Tensor> MultiHeadAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AttentionMask& mask) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  const char* fn = "d2l::v1::MultiHeadAttention";
  ensure_widths(fn, queries, keys, values);
  return d2l::detail::checked_multi_head_attention(fn, nullptr, queries, keys, values,
                                              call(fn, mask, /*need_weights=*/true));
}

PathExplanation MultiHeadAttentionImpl::explain_path(const torch::Tensor& queries,
                                                     const torch::Tensor& keys,
                                                     const torch::Tensor& values,
                                                     const AttentionMask& mask) const {
  const char* fn = "d2l::v1::MultiHeadAttention";
  return d2l::detail::explain_multi_head_attention(
      fn, nullptr, queries, keys, values,
      call(fn, mask, detail::records_weights(attention->options.record_attention_weights())));
}

torch::Tensor MultiHeadAttentionImpl::last_attention_weights() const {
  return d2l::detail::load_weights(attention->attention_weights);
}

}  // namespace d2l::v1
