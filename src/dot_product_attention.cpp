#include <d2l/dot_product_attention.h>


#include <fmt/format.h>

#include <cmath>

#include "checks.h"
#include "internal.h"

namespace d2l {
namespace detail {

torch::Tensor dropout_weights(const torch::Tensor& weights, double p, bool training) {
  return training && p > 0 ? torch::dropout(weights, p, training) : weights;
}

}  // namespace detail

namespace functional {

std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens, double dropout, bool training, Impl impl) {
  constexpr const char* fn = "d2l::dot_product_attention";
  detail::check_qkv(fn, queries, keys, values, valid_lens);
  TORCH_CHECK(queries.size(2) == keys.size(2),
              fmt::format("{}: queries and keys must have the same feature size, got queries {} "
                          "and keys {}",
                          fn, detail::shape_of(queries), detail::shape_of(keys)));
  // Zero features would make every score 0 / sqrt(0): NaN weights, silently.
  TORCH_CHECK(queries.size(2) > 0,
              fmt::format("{}: queries and keys must have at least one feature (scores are "
                          "scaled by 1/sqrt(d)), got queries {} and keys {}",
                          fn, detail::shape_of(queries), detail::shape_of(keys)));
  const auto sqrt_d = std::sqrt(static_cast<double>(queries.size(-1)));
  auto qk = torch::bmm(queries, keys.transpose(1, 2));
  // The fused kernel folds the 1/sqrt(d) scaling into its exponentials, and
  // without autograd writes the weights over qk, which nothing else holds.
  auto weights = detail::use_fused(fn, impl, queries.device())
                     ? detail::fused_masked_softmax_consuming(std::move(qk), valid_lens,
                                                              1.0 / sqrt_d)
                     : detail::composite_masked_softmax(qk / sqrt_d, valid_lens);
  return {torch::bmm(detail::dropout_weights(weights, dropout, training), values),
          std::move(weights)};
}

}  // namespace functional

DotProductAttentionImpl::DotProductAttentionImpl(double dropout)
    : DotProductAttentionImpl(DotProductAttentionOptions().dropout(dropout)) {}

DotProductAttentionImpl::DotProductAttentionImpl(const DotProductAttentionOptions& options_)
    : options(options_) {
  reset();
}

void DotProductAttentionImpl::reset() {
  TORCH_CHECK(options.dropout() >= 0 && options.dropout() <= 1,
              fmt::format("d2l::DotProductAttention: dropout must be a probability in [0, 1], got {}",
                          options.dropout()));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void DotProductAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::DotProductAttention(dropout={})", options.dropout());
}

torch::Tensor DotProductAttentionImpl::forward(const torch::Tensor& queries,
                                               const torch::Tensor& keys,
                                               const torch::Tensor& values,
                                               const torch::Tensor& valid_lens) {
  auto [output, weights] = functional::dot_product_attention(
      queries, keys, values, valid_lens, dropout->options.p(), dropout->is_training(),
      options.impl());
  if (options.record_attention_weights()) {
    std::lock_guard<std::mutex> lock(*record_mutex_);
    attention_weights = std::move(weights);
  }
  return output;
}

}  // namespace d2l
