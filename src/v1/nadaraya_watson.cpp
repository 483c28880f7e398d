// d2l 1.0's similarity kernels and Nadaraya–Watson regression, written as the
// book's PyTorch code so that float32 gives the book's numbers op for op.

#include <d2l/v1/nadaraya_watson.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "checks.h"

namespace d2l::v1 {
namespace {

void check_kernel_input(const char* fn, const torch::Tensor& x) {
  TORCH_CHECK(x.defined(), fmt::format("{}: x must be a defined tensor", fn));
  d2l::detail::check_strided_layout(fn, "x", x);
  TORCH_CHECK(at::isFloatingType(x.scalar_type()),
              fmt::format("{}: x must have a floating-point dtype, got {} (shape {})", fn,
                          c10::toString(x.scalar_type()), d2l::detail::shape_of(x)));
}

void check_inputs(const char* fn, const torch::Tensor& x_train, const torch::Tensor& y_train,
                  const torch::Tensor& x_val, const Kernel& kernel) {
  d2l::detail::check_floating(fn, "x_train", x_train, 1);
  d2l::detail::check_floating(fn, "y_train", y_train, 1);
  d2l::detail::check_floating(fn, "x_val", x_val, 1);
  TORCH_CHECK(x_train.size(0) == y_train.size(0),
              fmt::format("{}: x_train and y_train must have the same length, got x_train {} and "
                          "y_train {}",
                          fn, d2l::detail::shape_of(x_train), d2l::detail::shape_of(y_train)));
  d2l::detail::check_same_device(fn, "x_train", x_train, "y_train", y_train);
  d2l::detail::check_same_device(fn, "x_train", x_train, "x_val", x_val);
  d2l::detail::check_same_dtype(fn, "x_train", x_train, "y_train", y_train);
  d2l::detail::check_same_dtype(fn, "x_train", x_train, "x_val", x_val);
  TORCH_CHECK(x_train.scalar_type() != torch::kHalf || !x_train.device().is_cpu() ||
                  d2l::detail::cpu_float16_matmul_available(),
              fmt::format("{}: float16 on the CPU needs LibTorch 2.x (this LibTorch has no float16 "
                          "matrix product on the CPU), got float16 x_train {}; use bfloat16 or "
                          "float32 on the CPU, or float16 on CUDA",
                          fn, d2l::detail::shape_of(x_train)));
  TORCH_CHECK(x_train.size(0) > 0 || x_val.size(0) == 0,
              fmt::format("{}: x_train must hold at least one training point, got x_train {} for "
                          "x_val {}",
                          fn, d2l::detail::shape_of(x_train), d2l::detail::shape_of(x_val)));
  TORCH_CHECK(static_cast<bool>(kernel),
              fmt::format("{}: kernel must be callable, got an empty d2l::v1::Kernel", fn));
}

// The kernel's scores as the inputs' dtype (the book's astype), once they are
// known to be what nadaraya_watson can pool.
torch::Tensor checked_scores(const char* fn, const torch::Tensor& k, const torch::Tensor& dists) {
  TORCH_CHECK(k.defined(),
              fmt::format("{}: kernel must return a defined tensor, got an undefined one for "
                          "dists {}",
                          fn, d2l::detail::shape_of(dists)));
  d2l::detail::check_strided_layout(fn, "the kernel's result", k);
  TORCH_CHECK(k.sizes() == dists.sizes(),
              fmt::format("{}: kernel must return a tensor of the shape it is given, got {} for "
                          "dists {}",
                          fn, d2l::detail::shape_of(k), d2l::detail::shape_of(dists)));
  d2l::detail::check_same_device(fn, "dists", dists, "the kernel's result", k);
  TORCH_CHECK(!at::isComplexType(k.scalar_type()),
              fmt::format("{}: kernel must return real numbers, got dtype {}", fn,
                          c10::toString(k.scalar_type())));
  return k.to(dists.scalar_type());
}

// A column of zeros would be 0/0, NaN weights and a NaN estimate in the book:
// refused, naming the x_val that no training point is near under this kernel.
void check_no_empty_column(const char* fn, const torch::Tensor& sums, const torch::Tensor& x_val) {
  const auto empty = (sums == 0).cpu();
  const int64_t count = empty.sum().item<int64_t>();
  if (count == 0) return;
  const int64_t first = empty.nonzero()[0][0].item<int64_t>();
  TORCH_CHECK(false,
              fmt::format("{}: the kernel is 0 at every x_train for {} of the {} x_val (the first: "
                          "x_val[{}] = {}), whose attention weights would be 0/0 (NaN in the "
                          "book); use a wider kernel, or leave out the x_val that no training "
                          "point is near",
                          fn, count, x_val.size(0), first, x_val[first].item<double>()));
}

}  // namespace

torch::Tensor gaussian(const torch::Tensor& x) {
  check_kernel_input("d2l::v1::gaussian", x);
  return torch::exp(-x.pow(2) / 2);
}

torch::Tensor boxcar(const torch::Tensor& x) {
  check_kernel_input("d2l::v1::boxcar", x);
  return (torch::abs(x) < 1.0).to(x.scalar_type());
}

torch::Tensor constant(const torch::Tensor& x) {
  check_kernel_input("d2l::v1::constant", x);
  return 1.0 + 0 * x;
}

torch::Tensor epanechikov(const torch::Tensor& x) {
  check_kernel_input("d2l::v1::epanechikov", x);
  return torch::max(1 - torch::abs(x), torch::zeros_like(x));
}

Kernel gaussian_with_width(double sigma) {
  TORCH_CHECK(std::isfinite(sigma) && sigma > 0,
              fmt::format("d2l::v1::gaussian_with_width: sigma must be positive and finite, got {}",
                          sigma));
  return [sigma](const torch::Tensor& x) {
    check_kernel_input("d2l::v1::gaussian_with_width", x);
    // ATen divides by a scalar in the op's compute type (float for float32,
    // float16 and bfloat16) and may multiply by its reciprocal: the book's
    // formula is kept, op for op, where 2σ² is a normal number there.
    const bool in_double = x.scalar_type() == torch::kDouble;
    const double smallest = in_double ? std::numeric_limits<double>::min()
                                      : static_cast<double>(std::numeric_limits<float>::min());
    const double two_sigma_squared = 2 * (sigma * sigma);
    if (two_sigma_squared >= smallest) return torch::exp(-x.pow(2) / two_sigma_squared);
    // A σ so small that 2σ² underflows, where the book's x² / (2σ²) is 0/0 at
    // x = 0 (NaN weights): the same kernel as exp(-(x/σ)² / 2), and where σ
    // itself underflows, its limit, 1 at x = 0 and 0 elsewhere.
    if (sigma >= smallest) return torch::exp(-(x / sigma).pow(2) / 2);
    return (x == 0).to(x.scalar_type());
  };
}

std::tuple<torch::Tensor, torch::Tensor> nadaraya_watson(const torch::Tensor& x_train,
                                                         const torch::Tensor& y_train,
                                                         const torch::Tensor& x_val,
                                                         const Kernel& kernel) {
  constexpr const char* fn = "d2l::v1::nadaraya_watson";
  check_inputs(fn, x_train, y_train, x_val, kernel);
  const auto dists = x_train.reshape({-1, 1}) - x_val.reshape({1, -1});
  // Each column/row corresponds to each query/key.
  const auto k = checked_scores(fn, kernel(dists), dists);
  // Normalization over keys for each query.
  const auto sums = k.sum(0);
  check_no_empty_column(fn, sums, x_val);
  auto attention_w = k / sums;
  auto y_hat = torch::matmul(y_train, attention_w);
  return {std::move(y_hat), std::move(attention_w)};
}

}  // namespace d2l::v1
