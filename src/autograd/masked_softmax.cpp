// The fused masked softmax: op layer and autograd function around the CPU
// kernels of cpu/kernels.cpp.

#include <torch/autograd.h>

#include <fmt/format.h>

#include "autograd/common.h"
#include "internal.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// y may be x itself: a row's kernel reads each valid score before writing
// its weight, and the masked ones are zeroed without being read.
void run_forward(const torch::Tensor& x, torch::Tensor& y, const torch::Tensor& lens,
                 double scale) {
  const int64_t m = x.size(-1), rows = m == 0 ? 0 : x.numel() / m;
  const int64_t queries = x.dim() == 3 ? x.size(1) : 1;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "d2l::masked_softmax", [&] {
    cpu::kernels<scalar_t>().softmax_forward(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows,
                                             m, row_lengths(lens, queries),
                                             static_cast<scalar_t>(scale));
  });
}

torch::Tensor kernel_forward(const torch::Tensor& X, const torch::Tensor& lens, double scale) {
  const auto x = compute_type(X);
  auto y = torch::empty_like(x, at::MemoryFormat::Contiguous);
  run_forward(x, y, lens, scale);
  return as_dtype(y, X.scalar_type());
}

torch::Tensor kernel_backward(const torch::Tensor& Y, const torch::Tensor& dY,
                              const torch::Tensor& lens, double scale) {
  const auto y = compute_type(Y);
  const auto dy = as_dtype(dY, y.scalar_type()).contiguous();
  auto dx = torch::empty_like(y, at::MemoryFormat::Contiguous);
  const int64_t m = y.size(-1), rows = m == 0 ? 0 : y.numel() / m;
  const int64_t queries = y.dim() == 3 ? y.size(1) : 1;
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "d2l::masked_softmax_backward", [&] {
    cpu::kernels<scalar_t>().softmax_backward(y.data_ptr<scalar_t>(), dy.data_ptr<scalar_t>(),
                                              dx.data_ptr<scalar_t>(), rows, m,
                                              row_lengths(lens, queries),
                                              static_cast<scalar_t>(scale));
  });
  return as_dtype(dx, Y.scalar_type());
}

// The same gradient with differentiable ATen ops, for double backward.
torch::Tensor composite_backward(const torch::Tensor& y, const torch::Tensor& dy,
                                 const torch::Tensor& lens, double scale) {
  auto g = dy;
  if (lens.numel() > 0) {
    const int64_t B = y.size(0), n = y.size(1), m = y.size(2);
    const auto expanded = lens.dim() == 1 ? lens.unsqueeze(1).expand({B, n}) : lens;
    g = dy.masked_fill(length_mask(expanded, B * n, m).view({B, n, m}).logical_not(), 0);
  }
  return scale * y * (g - (g * y).sum(-1, /*keepdim=*/true));
}

struct MaskedSoftmaxFunction : torch::autograd::Function<MaskedSoftmaxFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& X,
                               const torch::Tensor& lens, double scale) {
    auto y = kernel_forward(X, lens, scale);
    ctx->save_for_backward({y, lens});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    // create_graph=true leaves grad mode on in here: stay differentiable.
    auto dx = torch::GradMode::is_enabled() ? composite_backward(saved[0], grads[0], saved[1], scale)
                                            : kernel_backward(saved[0], grads[0], saved[1], scale);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                   double scale) {
  TORCH_CHECK(X.device().is_cpu(),
              fmt::format("d2l::fused::masked_softmax: the fused kernel runs on the CPU, got X on "
                          "{}; use d2l::masked_softmax to pick a path for the device",
                          X.device().str()));
  const auto lens = lengths_arg(valid_lens);
  if (X.numel() == 0) return torch::empty_like(X) * scale;
  if (torch::GradMode::is_enabled() && X.requires_grad()) {
    return MaskedSoftmaxFunction::apply(X, lens, scale);
  }
  return kernel_forward(X, lens, scale);
}

torch::Tensor fused_masked_softmax_consuming(torch::Tensor X, const torch::Tensor& valid_lens,
                                             double scale) {
  const bool graph = torch::GradMode::is_enabled() && X.requires_grad();
  const bool in_place = X.device().is_cpu() && X.is_contiguous() && X.numel() > 0 &&
                        (X.scalar_type() == torch::kFloat || X.scalar_type() == torch::kDouble);
  if (graph || !in_place) return fused_masked_softmax(X, valid_lens, scale);
  run_forward(X, X, lengths_arg(valid_lens), scale);
  return X;
}

}  // namespace d2l::detail
