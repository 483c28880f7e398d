#include <d2l/masking.h>

#include <fmt/format.h>

#include <limits>

#include "checks.h"
#include "internal.h"

namespace d2l {
namespace detail {

torch::Tensor length_mask(const torch::Tensor& lens, int64_t rows, int64_t cols) {
  // (rows) or (batch, queries) lengths against arange(cols): true where valid.
  const auto positions = torch::arange(cols, lens.options().dtype(torch::kLong));
  return positions < lens.reshape({rows, 1});
}

torch::Tensor softmax_last_dim(const torch::Tensor& X) {
  // LibTorch 1.13 has no float16 softmax on CPU; reduced precision is
  // accumulated in float everywhere, as ATen's own kernels do.
  if (X.scalar_type() == torch::kHalf || X.scalar_type() == torch::kBFloat16) {
    return torch::softmax(X, -1, torch::kFloat).to(X.scalar_type());
  }
  return torch::softmax(X, -1);
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

namespace {

void check_masked_softmax_args(const char* fn, const torch::Tensor& X,
                               const torch::Tensor& valid_lens) {
  if (valid_lens.defined()) {
    detail::check_floating(fn, "X", X, 3);
    detail::check_valid_lens(fn, valid_lens, "X", X);
    return;
  }
  TORCH_CHECK(X.defined() && X.dim() >= 1,
              fmt::format("{}: X must be a tensor of at least 1 dimension, got {}", fn,
                          detail::shape_of(X)));
  TORCH_CHECK(at::isFloatingType(X.scalar_type()),
              fmt::format("{}: X must have a floating-point dtype, got {}", fn,
                          c10::toString(X.scalar_type())));
}

}  // namespace

namespace composite {

torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  // Same messages as d2l::masked_softmax: the composite path is its reference.
  check_masked_softmax_args("d2l::masked_softmax", X, valid_lens);
  return detail::composite_masked_softmax(X, valid_lens);
}

}  // namespace composite

namespace detail {

torch::Tensor composite_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  if (!valid_lens.defined()) return softmax_last_dim(X);
  const int64_t batch = X.size(0), queries = X.size(1), keys = X.size(2);
  const auto lens = valid_lens.dim() == 1 ? valid_lens.unsqueeze(1).expand({batch, queries})
                                          : valid_lens;
  const auto masked_out =
      length_mask(lens, batch * queries, keys).view({batch, queries, keys}).logical_not();
  // -inf rather than the book's -1e6: exact in every dtype (-1e6 overflows
  // float16) and it keeps any masked score, even NaN, out of the sum. A row
  // with no valid key becomes NaN here and is zeroed by the second fill.
  const auto filled = X.masked_fill(masked_out, -std::numeric_limits<double>::infinity());
  return softmax_last_dim(filled).masked_fill(masked_out, 0);
}

}  // namespace detail

bool detail::use_fused(const char* fn, Impl impl, const c10::Device& device) {
  TORCH_CHECK(impl != Impl::kSdpa,
              fmt::format("{}: Impl::kSdpa (LibTorch's scaled_dot_product_attention) is only for "
                          "dot-product attention (DotProductAttention, MultiHeadAttention); use "
                          "Impl::kAuto, kFused or kComposite here",
                          fn));
  TORCH_CHECK(impl != Impl::kFused || device.is_cpu(),
              fmt::format("{}: Impl::kFused runs on the CPU, got tensors on {}; use Impl::kAuto "
                          "to pick a path for the device",
                          fn, device.str()));
  return impl != Impl::kComposite && device.is_cpu();
}

torch::Tensor detail::masked_softmax_nocheck(const torch::Tensor& X,
                                             const torch::Tensor& valid_lens, Impl impl) {
  return use_fused("d2l::masked_softmax", impl, X.device()) ? fused_masked_softmax(X, valid_lens)
                                                            : composite_masked_softmax(X, valid_lens);
}


torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  check_masked_softmax_args("d2l::masked_softmax", X, valid_lens);
  return detail::masked_softmax_nocheck(X, valid_lens);
}

namespace fused {

torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  check_masked_softmax_args("d2l::fused::masked_softmax", X, valid_lens);
  return detail::fused_masked_softmax(X, valid_lens);
}

}  // namespace fused

}  // namespace d2l
