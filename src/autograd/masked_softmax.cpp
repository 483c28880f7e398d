// The fused masked softmax as an autograd function: the CPU kernel forward
// and backward, and differentiable ATen ops when a double backward is asked.

#include <torch/autograd.h>

#include "masked_softmax_internal.h"
#include "sequence_mask_internal.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

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
    auto y = fused_softmax_forward(X, lens, scale);
    ctx->save_for_backward({y, lens});
    ctx->saved_data["scale"] = scale;
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    // create_graph=true leaves grad mode on in here: stay differentiable.
    auto dx = torch::GradMode::is_enabled()
                  ? composite_backward(saved[0], grads[0], saved[1], scale)
                  : fused_softmax_backward(saved[0], grads[0], saved[1], scale);
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor masked_softmax_autograd(const torch::Tensor& X, const torch::Tensor& lens,
                                      double scale) {
  return MaskedSoftmaxFunction::apply(X, lens, scale);
}

}  // namespace d2l::detail
