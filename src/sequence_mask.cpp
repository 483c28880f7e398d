#include <d2l/sequence_mask.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "sequence_mask_internal.h"

namespace d2l {
namespace detail {

torch::Tensor comparable_lengths(const torch::Tensor& lens) {
  const auto dtype = lens.scalar_type();
  return dtype == torch::kHalf || dtype == torch::kBFloat16 ? lens.to(torch::kFloat) : lens;
}

torch::Tensor length_mask(const torch::Tensor& lens, int64_t rows, int64_t cols) {
  // (rows) or (batch, queries) lengths against arange(cols): true where valid.
  const auto positions = torch::arange(cols, lens.options().dtype(torch::kLong));
  return positions < comparable_lengths(lens).reshape({rows, 1});
}

}  // namespace detail

torch::Tensor sequence_mask(const torch::Tensor& X, const torch::Tensor& valid_len, double value) {
  constexpr const char* fn = "d2l::sequence_mask";
  TORCH_CHECK(X.defined() && X.dim() >= 2,
              fmt::format("{}: X must be a tensor of at least 2 dimensions (N, L, ...), got {}", fn,
                          detail::shape_of(X)));
  TORCH_CHECK(valid_len.defined() && valid_len.dim() == 1 && valid_len.size(0) == X.size(0),
              fmt::format("{}: valid_len must have shape [{}] for X {}, got {}", fn, X.size(0),
                          detail::shape_of(X), detail::shape_of(valid_len)));
  detail::check_strided_layout(fn, "X", X);
  detail::check_strided_layout(fn, "valid_len", valid_len);
  detail::check_same_device(fn, "X", X, "valid_len", valid_len);
  detail::check_length_values(fn, "valid_len", valid_len);
  if (at::isFloatingType(X.scalar_type()) && std::isfinite(value)) {
    const double max = X.scalar_type() == torch::kHalf       ? 65504.0
                       : X.scalar_type() == torch::kBFloat16 ? 3.38953139e38
                       : X.scalar_type() == torch::kFloat    ? std::numeric_limits<float>::max()
                                                             : std::numeric_limits<double>::max();
    TORCH_CHECK(std::abs(value) <= max,
                fmt::format("{}: value {} does not fit X's dtype {} (largest finite value {})", fn,
                            value, c10::toString(X.scalar_type()), max));
  }
  if (at::isIntegralType(X.scalar_type(), /*includeBool=*/false)) {
    // ATen would throw std::runtime_error past the range, and convert NaN to garbage.
    double lo = 0, hi = 0;
    AT_DISPATCH_INTEGRAL_TYPES(X.scalar_type(), "d2l::sequence_mask", [&] {
      lo = static_cast<double>(std::numeric_limits<scalar_t>::lowest());
      hi = static_cast<double>(std::numeric_limits<scalar_t>::max());
    });
    // hi + 1 is exact (a power of two) where hi itself rounds up, as for int64.
    TORCH_CHECK(value >= lo && value < hi + 1,
                fmt::format("{}: value {} does not fit X's dtype {} (range [{}, {}])", fn, value,
                            c10::toString(X.scalar_type()), lo, hi));
  }

  auto mask = detail::length_mask(valid_len, X.size(0), X.size(1));
  std::vector<int64_t> view(X.dim(), 1);
  view[0] = X.size(0);
  view[1] = X.size(1);
  return X.masked_fill(mask.view(view).logical_not(), value);
}

}  // namespace d2l
