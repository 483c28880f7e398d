// Nadaraya–Watson pooling: the book's non-parametric form, the parametric
// kernel regression (functional and module), and their argument checks.

#include <d2l/nadaraya_watson.h>

#include <fmt/format.h>

#include "attention_weights.h"
#include "checked_load.h"
#include "checks.h"
#include "masked_softmax_internal.h"

namespace d2l {
namespace {

void check_same_kind(const char* fn, const torch::Tensor& queries, const char* name,
                     const torch::Tensor& other) {
  detail::check_same_device(fn, "queries", queries, name, other);
  detail::check_same_dtype(fn, "queries", queries, name, other);
}

// queries (n_q), keys and values of rank `rank`: floating, on the queries'
// device and in their dtype.
void check_inputs(const char* fn, const torch::Tensor& queries, const torch::Tensor& keys,
                  const torch::Tensor& values, int64_t rank) {
  detail::check_strided_layout(fn, "queries", queries);
  detail::check_strided_layout(fn, "keys", keys);
  detail::check_strided_layout(fn, "values", values);
  detail::check_floating(fn, "queries", queries, 1);
  detail::check_floating(fn, "keys", keys, rank);
  detail::check_floating(fn, "values", values, rank);
  check_same_kind(fn, queries, "keys", keys);
  check_same_kind(fn, queries, "values", values);
}

// The book's kernel, softmax_j(-((q_i - k_ij) w)² / 2), on the differences
// q_i - k_ij of shape (n_q, n_k); an undefined w is the non-parametric width 1.
torch::Tensor gaussian_weights(const torch::Tensor& differences, const torch::Tensor& w) {
  const auto scaled = w.defined() ? differences * w : differences;
  return detail::softmax_last_dim(-scaled.pow(2) / 2);
}

// functional::nw_kernel_regression, with messages naming `fn` (the function
// or the module that was called).
std::tuple<torch::Tensor, torch::Tensor> checked_nw_kernel_regression(const char* fn,
                                                                      const torch::Tensor& queries,
                                                                      const torch::Tensor& keys,
                                                                      const torch::Tensor& values,
                                                                      const torch::Tensor& w) {
  check_inputs(fn, queries, keys, values, 2);
  TORCH_CHECK(
      keys.size(0) == queries.size(0) && values.sizes() == keys.sizes(),
      fmt::format("{}: keys and values must both have shape (n_q, n_k) with n_q the "
                  "number of queries, got queries {}, keys {} and values {}",
                  fn, detail::shape_of(queries), detail::shape_of(keys), detail::shape_of(values)));
  detail::check_strided_layout(fn, "w", w);
  TORCH_CHECK(w.defined() && w.numel() == 1 && w.dim() <= 1,
              fmt::format("{}: w must have shape [1] or [], got {}", fn, detail::shape_of(w)));
  check_same_kind(fn, queries, "w", w);
  auto weights = gaussian_weights(queries.unsqueeze(1) - keys, w);
  auto output = torch::bmm(weights.unsqueeze(1), values.unsqueeze(-1)).reshape(-1);
  return {std::move(output), std::move(weights)};
}

}  // namespace

namespace functional {

std::tuple<torch::Tensor, torch::Tensor> nadaraya_watson(const torch::Tensor& queries,
                                                         const torch::Tensor& keys,
                                                         const torch::Tensor& values) {
  constexpr const char* fn = "d2l::nadaraya_watson";
  check_inputs(fn, queries, keys, values, 1);
  TORCH_CHECK(keys.size(0) == values.size(0),
              fmt::format("{}: keys and values must have the same length, got keys {} and "
                          "values {}",
                          fn, detail::shape_of(keys), detail::shape_of(values)));
  // The book repeats each query n_k times; broadcasting gives the same (n_q, n_k).
  auto weights = gaussian_weights(queries.unsqueeze(1) - keys, {});
  auto output = torch::matmul(weights, values);
  return {std::move(output), std::move(weights)};
}

std::tuple<torch::Tensor, torch::Tensor> nw_kernel_regression(const torch::Tensor& queries,
                                                              const torch::Tensor& keys,
                                                              const torch::Tensor& values,
                                                              const torch::Tensor& w) {
  return checked_nw_kernel_regression("d2l::nw_kernel_regression", queries, keys, values, w);
}

}  // namespace functional

NWKernelRegressionImpl::NWKernelRegressionImpl() { reset(); }

void NWKernelRegressionImpl::reset() { w = register_parameter("w", torch::rand({1})); }

void NWKernelRegressionImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::NWKernelRegression()";
}

torch::Tensor NWKernelRegressionImpl::forward(const torch::Tensor& queries,
                                              const torch::Tensor& keys,
                                              const torch::Tensor& values) {
  constexpr const char* fn = "d2l::NWKernelRegression";
  // Named after the parameter, so that the message points at ->to(...).
  TORCH_CHECK(queries.defined(), fmt::format("{}: queries must be a defined tensor", fn));
  detail::check_strided_layout(fn, "queries", queries);
  detail::check_same_device(fn, "w", w, "queries", queries);
  detail::check_same_dtype(fn, "w", w, "queries", queries);
  auto [output, weights] = checked_nw_kernel_regression(fn, queries, keys, values, w);
  if (detail::records_weights(true)) detail::record_weights(attention_weights, std::move(weights));
  return output;
}

torch::Tensor NWKernelRegressionImpl::last_attention_weights() const {
  return detail::load_weights(attention_weights);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void NWKernelRegressionImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::NWKernelRegression::load");
}

}  // namespace d2l
