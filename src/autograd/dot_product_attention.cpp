// The flash dot-product attention as an autograd function: the CPU kernel
// forward and backward, and differentiable ATen ops when a double backward
// is asked.

#include <torch/autograd.h>

#include "cpu/dot_product_attention_kernel.h"
#include "cpu/kernel_args.h"
#include "dot_product_attention.h"
#include "masked_softmax.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct FlashOutputs {
  torch::Tensor out, lse;
};

// The kernel's forward on q, k, v already in their compute type.
FlashOutputs flash_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& lens, double scale) {
  auto out = torch::empty({q.size(0), q.size(1), v.size(2)}, q.options());
  auto lse = torch::empty({q.size(0), q.size(1)}, q.options());
  cpu::dot_product_attention_kernels().forward(q, k, v, lens, scale, out, lse);
  return {std::move(out), std::move(lse)};
}

// The same gradients with differentiable ATen ops (recomputing the weights),
// for a double backward.
tensor_list composite_backward(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& lens, double scale,
                               const torch::Tensor& dout) {
  const auto valid_lens = lens.numel() > 0 ? lens : torch::Tensor();
  const auto p = composite_masked_softmax(torch::bmm(q, k.transpose(1, 2)) * scale, valid_lens);
  const auto dp = torch::bmm(dout, v.transpose(1, 2));
  const auto ds = p * (dp - (dp * p).sum(-1, /*keepdim=*/true)) * scale;
  return {torch::bmm(ds, k), torch::bmm(ds.transpose(1, 2), q),
          torch::bmm(p.transpose(1, 2), dout)};
}

struct FlashAttentionFunction : torch::autograd::Function<FlashAttentionFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& queries,
                               const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& lens, double scale) {
    const auto q = compute_type(queries);
    const auto k = compute_type(keys);
    const auto v = compute_type(values);
    auto [out, lse] = flash_forward(q, k, v, lens, scale);
    ctx->save_for_backward({queries, keys, values, lens, out, lse});
    ctx->saved_data["scale"] = scale;
    return as_dtype(out, queries.scalar_type());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &queries = saved[0], &keys = saved[1], &values = saved[2], &lens = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    // create_graph=true leaves grad mode on in here: stay differentiable.
    if (torch::GradMode::is_enabled()) {
      auto g = composite_backward(queries, keys, values, lens, scale, grads[0]);
      return {g[0], g[1], g[2], torch::Tensor(), torch::Tensor()};
    }
    const auto &out = saved[4], &lse = saved[5];
    const auto q = compute_type(queries), k = compute_type(keys), v = compute_type(values);
    const auto dout = as_dtype(grads[0], q.scalar_type()).contiguous();
    auto dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    cpu::dot_product_attention_kernels().backward(q, k, v, lens, scale, out, dout, lse, dq, dk, dv);
    return {as_dtype(dq, queries.scalar_type()), as_dtype(dk, keys.scalar_type()),
            as_dtype(dv, values.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor flash_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                              const torch::Tensor& values, const torch::Tensor& valid_lens,
                              double scale) {
  TORCH_INTERNAL_ASSERT(queries.device().is_cpu(), "the flash kernel got ", queries.device());
  const auto lens = lengths_arg(valid_lens);
  if (torch::GradMode::is_enabled() &&
      (queries.requires_grad() || keys.requires_grad() || values.requires_grad())) {
    return FlashAttentionFunction::apply(queries, keys, values, lens, scale);
  }
  const auto q = compute_type(queries);
  return as_dtype(flash_forward(q, compute_type(keys), compute_type(values), lens, scale).out,
                  queries.scalar_type());
}

}  // namespace d2l::detail
