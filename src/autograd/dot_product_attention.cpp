// The flash dot-product attention as an autograd function: the CPU kernel
// forward and backward, and differentiable ATen ops when a double backward
// is asked.

#include <torch/autograd.h>

#include <algorithm>

#include "cpu/dot_product_attention_kernel.h"
#include "cpu/kernel_args.h"
#include "dot_product_attention_internal.h"
#include "masked_softmax_internal.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct FlashOutputs {
  torch::Tensor out, lse, weights;
};

// bfloat16 queries, keys and values on the float kernel without float copies
// of them (forward_bf16): out in bfloat16, or in float with `float_out` (for
// autograd: the backward's rowsum(dO ∘ O) reads the output before its
// rounding, as where bfloat16 is widened whole), lse in float; nothing (out
// undefined) for other dtypes or where weights are asked for, which the
// caller widens to float.
FlashOutputs flash_forward_bf16(const torch::Tensor& queries, const torch::Tensor& keys,
                                const torch::Tensor& values, const torch::Tensor& lens,
                                double scale, bool need_weights, bool float_out) {
  if (need_weights || queries.scalar_type() != torch::kBFloat16 ||
      keys.scalar_type() != torch::kBFloat16 || values.scalar_type() != torch::kBFloat16) {
    return {};
  }
  const auto q = queries.contiguous(), k = keys.contiguous(), v = values.contiguous();
  auto out = empty_output({q.size(0), q.size(1), v.size(2)},
                          float_out ? q.options().dtype(torch::kFloat) : q.options());
  auto lse = torch::empty({q.size(0), q.size(1)}, q.options().dtype(torch::kFloat));
  cpu::dot_product_attention_kernels().forward_bf16(q, k, v, lens, scale, out, lse);
  return {std::move(out), std::move(lse), torch::Tensor()};
}

// The kernel's forward on q, k, v already in their compute type.
FlashOutputs flash_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const torch::Tensor& lens, double scale, bool need_weights) {
  auto out = empty_output({q.size(0), q.size(1), v.size(2)}, q.options());
  auto lse = torch::empty({q.size(0), q.size(1)}, q.options());
  auto weights =
      need_weights ? empty_output({q.size(0), q.size(1), k.size(1)}, q.options()) : torch::Tensor();
  cpu::dot_product_attention_kernels().forward(q, k, v, lens, scale, out, lse, weights);
  return {std::move(out), std::move(lse), std::move(weights)};
}

// dP = dO Vᵀ (+ dW, the gradient reaching the weights), and dS = scale · P ∘
// (dP - rowsum(dP ∘ P)). Where P is 0 (padding), dS is 0 whatever dP holds:
// an inf in a padding value must not make a NaN through 0 · inf.
torch::Tensor scores_grad(const torch::Tensor& p, const torch::Tensor& v,
                          const torch::Tensor& dout, const torch::Tensor& dweights,
                          double scale) {
  auto dp = torch::bmm(dout, v.transpose(1, 2));
  if (dweights.defined()) dp = dp + dweights;
  dp = dp.masked_fill(p == 0, 0);
  return p * (dp - (dp * p).sum(-1, /*keepdim=*/true)) * scale;
}

// The gradients with ATen ops: differentiable (recomputing the weights) for
// a double backward, or from the saved weights when a gradient reaches them.
tensor_list composite_backward(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& lens, double scale,
                               const torch::Tensor& dout, const torch::Tensor& dweights,
                               torch::Tensor p = {}) {
  const auto keep =
      lens.dim() == 3 ? band_keep(lens, q.size(0), q.size(1), k.size(1)) : torch::Tensor();
  if (!p.defined()) {
    const auto scores = torch::bmm(q, k.transpose(1, 2)) * scale;
    if (keep.defined()) {
      p = composite_masked_softmax_where(scores, keep);
    } else {
      p = composite_masked_softmax(scores, lens.numel() > 0 ? lens : torch::Tensor());
    }
  }
  const auto ds = scores_grad(p, v, dout, dweights, scale);
  // dQ = dS K: keys that no row of a batch entry sees are zeroed first, for
  // dS's zeros there would turn an inf stored in them into NaN.
  auto visible_k = k;
  if (keep.defined()) {
    visible_k = k.masked_fill(keep.any(1).logical_not().unsqueeze(-1), 0);
  } else if (lens.numel() > 0) {
    const auto longest = lens.dim() == 2 ? std::get<0>(lens.max(1)) : lens;
    const auto hidden = torch::arange(k.size(1), lens.options()) >= longest.view({-1, 1});
    visible_k = k.masked_fill(hidden.unsqueeze(-1), 0);
  }
  return {torch::bmm(ds, visible_k), torch::bmm(ds.transpose(1, 2), q),
          torch::bmm(p.transpose(1, 2), dout)};
}

struct FlashAttentionFunction : torch::autograd::Function<FlashAttentionFunction> {
  // Returns {output} or, with need_weights, {output, weights}.
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& queries,
                             const torch::Tensor& keys, const torch::Tensor& values,
                             const torch::Tensor& lens, double scale, bool need_weights) {
    FlashOutputs result =
        flash_forward_bf16(queries, keys, values, lens, scale, need_weights, /*float_out=*/true);
    if (!result.out.defined()) {
      result = flash_forward(compute_type(queries), compute_type(keys), compute_type(values), lens,
                             scale, need_weights);
    }
    const auto &out = result.out, &lse = result.lse, &weights = result.weights;
    // The weights in compute type (undefined without them), for a gradient
    // that reaches them. Saved as a variable: an output kept in saved_data
    // would hold its own graph alive.
    ctx->save_for_backward({queries, keys, values, lens, out, lse, weights});
    ctx->saved_data["scale"] = scale;
    // An output that no loss reaches gets an undefined gradient rather than
    // zeros: unused weights keep the kernel's backward.
    ctx->set_materialize_grads(false);
    tensor_list outputs{as_dtype(out, queries.scalar_type())};
    if (need_weights) outputs.push_back(as_dtype(weights, queries.scalar_type()));
    return outputs;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &queries = saved[0], &keys = saved[1], &values = saved[2], &lens = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto dweights = grads.size() > 1 ? grads[1] : torch::Tensor();
    const auto none = torch::Tensor();
    if (!grads[0].defined() && !dweights.defined()) {
      return {torch::zeros_like(queries), torch::zeros_like(keys), torch::zeros_like(values),
              none, none, none};
    }
    const auto dout = grads[0].defined()
                          ? grads[0]
                          : torch::zeros({queries.size(0), queries.size(1), values.size(2)},
                                         values.options());
    // create_graph=true leaves grad mode on in here: stay differentiable.
    if (torch::GradMode::is_enabled()) {
      auto g = composite_backward(queries, keys, values, lens, scale, dout, dweights);
      return {g[0], g[1], g[2], none, none, none};
    }
    const bool bf16 = queries.scalar_type() == torch::kBFloat16 &&
                      keys.scalar_type() == torch::kBFloat16 &&
                      values.scalar_type() == torch::kBFloat16;
    if (bf16 && !dweights.defined()) {
      // The kernel reads the bfloat16 operands in place (and the forward's
      // float output) and writes the gradients in bfloat16, made in float.
      const auto q = queries.contiguous(), k = keys.contiguous(), v = values.contiguous();
      auto dq = empty_output(q.sizes(), q.options()), dk = empty_output(k.sizes(), k.options()),
           dv = empty_output(v.sizes(), v.options());
      cpu::dot_product_attention_kernels().backward_bf16(
          q, k, v, lens, scale, saved[4], as_dtype(dout, torch::kBFloat16).contiguous(), saved[5],
          dq, dk, dv);
      return {dq, dk, dv, none, none, none};
    }
    const auto q = compute_type(queries), k = compute_type(keys), v = compute_type(values);
    const auto dout_c = as_dtype(dout, q.scalar_type()).contiguous();
    if (dweights.defined()) {
      auto g = composite_backward(q, k, v, lens, scale, dout_c,
                                  as_dtype(dweights, q.scalar_type()),
                                  saved[6]);
      return {as_dtype(g[0], queries.scalar_type()), as_dtype(g[1], keys.scalar_type()),
              as_dtype(g[2], values.scalar_type()), none, none, none};
    }
    const auto &out = saved[4], &lse = saved[5];
    auto dq = empty_output_like(q), dk = empty_output_like(k), dv = empty_output_like(v);
    cpu::dot_product_attention_kernels().backward(q, k, v, lens, scale, out, dout_c, lse, dq, dk,
                                                  dv);
    return {as_dtype(dq, queries.scalar_type()), as_dtype(dk, keys.scalar_type()),
            as_dtype(dv, values.scalar_type()), none, none, none};
  }
};

// The bfloat16 kernel (Note [bfloat16 flash attention]): bfloat16 operands,
// output and gradients, float log-normalisers.
struct FlashBf16Function : torch::autograd::Function<FlashBf16Function> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& queries,
                               const torch::Tensor& keys, const torch::Tensor& values,
                               const torch::Tensor& lens, double scale) {
    auto [out, lse] = flash_bf16_forward(queries.contiguous(), keys.contiguous(),
                                         values.contiguous(), lens, scale);
    ctx->save_for_backward({queries, keys, values, lens, out, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &queries = saved[0], &keys = saved[1], &values = saved[2], &lens = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const auto none = torch::Tensor();
    const auto* kernels = cpu::dot_product_attention_bf16_kernels();
    // A double backward (create_graph=true), or the kernels' instruction set
    // lowered since the forward: ATen ops.
    if (torch::GradMode::is_enabled() || kernels == nullptr) {
      auto g = composite_backward(queries, keys, values, lens, scale, grads[0], none);
      return {g[0], g[1], g[2], none, none};
    }
    const auto q = queries.contiguous(), k = keys.contiguous(), v = values.contiguous();
    const auto dout = grads[0].contiguous();
    auto dq = empty_output_like(q), dk = empty_output_like(k), dv = empty_output_like(v);
    kernels->backward(q, k, v, lens, scale, saved[4], dout, saved[5], dq, dk, dv);
    return {dq, dk, dv, none, none};
  }

  // out and lse of the forward kernel on contiguous bfloat16 q, k, v.
  static std::tuple<torch::Tensor, torch::Tensor> flash_bf16_forward(const torch::Tensor& q,
                                                                     const torch::Tensor& k,
                                                                     const torch::Tensor& v,
                                                                     const torch::Tensor& lens,
                                                                     double scale) {
    const auto* kernels = cpu::dot_product_attention_bf16_kernels();
    TORCH_INTERNAL_ASSERT(kernels != nullptr, "the bfloat16 flash kernel is not available");
    auto out = empty_output({q.size(0), q.size(1), v.size(2)}, q.options());
    auto lse = torch::empty({q.size(0), q.size(1)}, q.options().dtype(torch::kFloat));
    kernels->forward(q, k, v, lens, scale, out, lse);
    return {std::move(out), std::move(lse)};
  }
};

}  // namespace

torch::Tensor band_keep(const torch::Tensor& bands, int64_t B, int64_t n, int64_t m) {
  const auto flat = bands.reshape({-1, 2});
  const auto rows = flat.index_select(
      0, torch::arange(B * n, bands.options()).remainder(std::max<int64_t>(flat.size(0), 1)));
  const auto keys = torch::arange(m, bands.options()).unsqueeze(0);
  return (keys >= rows.select(1, 0).unsqueeze(1))
      .logical_and(keys < rows.select(1, 1).unsqueeze(1))
      .view({B, n, m});
}

torch::Tensor flash_attention_bf16(const torch::Tensor& queries, const torch::Tensor& keys,
                                   const torch::Tensor& values, const torch::Tensor& valid_lens,
                                   double scale) {
  TORCH_INTERNAL_ASSERT(queries.device().is_cpu(), "the flash kernel got ", queries.device());
  const auto lens = lengths_arg(valid_lens);
  if (torch::GradMode::is_enabled() &&
      (queries.requires_grad() || keys.requires_grad() || values.requires_grad())) {
    return FlashBf16Function::apply(queries, keys, values, lens, scale);
  }
  return std::get<0>(FlashBf16Function::flash_bf16_forward(queries.contiguous(), keys.contiguous(),
                                                          values.contiguous(), lens, scale));
}

std::tuple<torch::Tensor, torch::Tensor> flash_attention(const torch::Tensor& queries,
                                                         const torch::Tensor& keys,
                                                         const torch::Tensor& values,
                                                         const torch::Tensor& valid_lens,
                                                         double scale, bool need_weights) {
  TORCH_INTERNAL_ASSERT(queries.device().is_cpu(), "the flash kernel got ", queries.device());
  const auto lens = lengths_arg(valid_lens);
  if (torch::GradMode::is_enabled() &&
      (queries.requires_grad() || keys.requires_grad() || values.requires_grad())) {
    auto outputs = FlashAttentionFunction::apply(queries, keys, values, lens, scale, need_weights);
    return {outputs[0], need_weights ? outputs[1] : torch::Tensor()};
  }
  auto in_place = flash_forward_bf16(queries, keys, values, lens, scale, need_weights,
                                     /*float_out=*/false);
  if (in_place.out.defined()) return {in_place.out, torch::Tensor()};
  const auto q = compute_type(queries);
  auto result =
      flash_forward(q, compute_type(keys), compute_type(values), lens, scale, need_weights);
  return {as_dtype(result.out, queries.scalar_type()),
          need_weights ? as_dtype(result.weights, queries.scalar_type()) : torch::Tensor()};
}

}  // namespace d2l::detail
