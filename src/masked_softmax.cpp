// d2l::masked_softmax: argument checks, the book's composite formulation
// (the oracle), the choice of path, and the fused CPU path's entry points.

#include <d2l/masked_softmax.h>

#include <fmt/format.h>

#include <limits>

#include "checks.h"
#include "cpu/kernel_args.h"
#include "cpu/masked_softmax_kernel.h"
#include "masked_softmax_internal.h"
#include "select.h"
#include "sequence_mask_internal.h"

namespace d2l {
namespace detail {
namespace {

void check_masked_softmax_args(const char* fn, const torch::Tensor& X,
                               const torch::Tensor& valid_lens) {
  if (valid_lens.defined()) {
    check_floating(fn, "X", X, 3);
    check_valid_lens(fn, valid_lens, "X", X);
    return;
  }
  TORCH_CHECK(
      X.defined() && X.dim() >= 1,
      fmt::format("{}: X must be a tensor of at least 1 dimension, got {}", fn, shape_of(X)));
  check_strided_layout(fn, "X", X);
  TORCH_CHECK(at::isFloatingType(X.scalar_type()),
              fmt::format("{}: X must have a floating-point dtype, got {}", fn,
                          c10::toString(X.scalar_type())));
}

}  // namespace

torch::Tensor softmax_last_dim(const torch::Tensor& X) {
  // LibTorch 1.13 has no float16 softmax on CPU; reduced precision is
  // accumulated in float everywhere, as ATen's own kernels do.
  if (X.scalar_type() == torch::kHalf || X.scalar_type() == torch::kBFloat16) {
    return torch::softmax(X, -1, torch::kFloat).to(X.scalar_type());
  }
  return torch::softmax(X, -1);
}

torch::Tensor composite_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  if (!valid_lens.defined()) return softmax_last_dim(X);
  const int64_t batch = X.size(0), queries = X.size(1), keys = X.size(2);
  const auto lens =
      valid_lens.dim() == 1 ? valid_lens.unsqueeze(1).expand({batch, queries}) : valid_lens;
  return composite_masked_softmax_where(
      X, length_mask(lens, batch * queries, keys).view({batch, queries, keys}));
}

torch::Tensor composite_masked_softmax_where(const torch::Tensor& X, const torch::Tensor& allowed) {
  const auto masked_out = allowed.logical_not();
  // -inf rather than the book's -1e6: exact in every dtype (-1e6 overflows
  // float16) and it keeps any masked score, even NaN, out of the sum. A row
  // with no valid key becomes NaN here and is zeroed by the second fill.
  const auto filled = X.masked_fill(masked_out, -std::numeric_limits<double>::infinity());
  return softmax_last_dim(filled).masked_fill(masked_out, 0);
}

torch::Tensor masked_softmax_nocheck(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                     AttentionBackend backend) {
  return select_masked_softmax("d2l::masked_softmax", backend, X.device()) ==
                 MaskedSoftmaxPath::kFused
             ? fused_masked_softmax(X, valid_lens)
             : composite_masked_softmax(X, valid_lens);
}

torch::Tensor fused_softmax_forward(const torch::Tensor& X, const torch::Tensor& lens,
                                    double scale) {
  const auto x = compute_type(X);
  auto y = empty_output(x.sizes(), x.options());
  cpu::masked_softmax_kernels().forward(x, y, lens, scale);
  return as_dtype(y, X.scalar_type());
}

torch::Tensor fused_softmax_backward(const torch::Tensor& Y, const torch::Tensor& dY,
                                     const torch::Tensor& lens, double scale) {
  const auto y = compute_type(Y);
  const auto dy = as_dtype(dY, y.scalar_type()).contiguous();
  auto dx = empty_output(y.sizes(), y.options());
  cpu::masked_softmax_kernels().backward(y, dy, dx, lens, scale);
  return as_dtype(dx, Y.scalar_type());
}

torch::Tensor fused_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                   double scale) {
  TORCH_INTERNAL_ASSERT(X.device().is_cpu(), "the fused masked softmax got ", X.device());
  const auto lens = lengths_arg(valid_lens);
  // X * scale, not a new tensor: an empty result stays in X's graph.
  if (X.numel() == 0) return X * scale;
  if (torch::GradMode::is_enabled() && X.requires_grad()) {
    return masked_softmax_autograd(X, lens, scale);
  }
  return fused_softmax_forward(X, lens, scale);
}

torch::Tensor fused_masked_softmax_consuming(torch::Tensor X, const torch::Tensor& valid_lens,
                                             double scale) {
  const bool graph = torch::GradMode::is_enabled() && X.requires_grad();
  const bool in_place = X.device().is_cpu() && X.is_contiguous() && X.numel() > 0 &&
                        (X.scalar_type() == torch::kFloat || X.scalar_type() == torch::kDouble);
  if (graph || !in_place) return fused_masked_softmax(X, valid_lens, scale);
  cpu::masked_softmax_kernels().forward(X, X, lengths_arg(valid_lens), scale);
  return X;
}

}  // namespace detail

torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens,
                             AttentionBackend backend) {
  detail::check_masked_softmax_args("d2l::masked_softmax", X, valid_lens);
  return detail::masked_softmax_nocheck(X, valid_lens, backend);
}

}  // namespace d2l
