// Additive attention scores as autograd functions that never hold the
// (B, n, m, h) features:
// - AdditiveFunction: the fused CPU kernel (optionally with the masked
//   softmax folded in), backward recomputing tanh;
// - AdditiveValuesFunction: the same with the product by the values folded in
//   too, for attention without dropout;
// - ChunkedAdditiveFunction: ATen ops over blocks of queries, for any device,
//   so CUDA memory stays bounded too.

#include <torch/autograd.h>

#include <algorithm>

#include "additive_attention_internal.h"
#include "cpu/additive_attention_kernel.h"
#include "cpu/kernel_args.h"
#include "linear.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The fused kernel's backward is not differentiable (create_graph=true).
void refuse_double_backward() {
  TORCH_CHECK(!torch::GradMode::is_enabled(),
              "d2l::AdditiveAttention: the fused CPU kernel has no double backward; use "
              "AttentionBackend::kComposite when you need create_graph=true");
}

struct ValuesGrads {
  torch::Tensor dq, dk, dw, dv;
};

// backward_values from the gradients of (output, weights), at most one of
// them undefined (an output nothing used), in the kernel's dtype.
ValuesGrads values_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                            const torch::Tensor& v, const torch::Tensor& y,
                            const torch::Tensor& lens, const torch::Tensor& dout_grad,
                            const torch::Tensor& dweights_grad) {
  const auto dtype = q.scalar_type();
  const auto dout = dout_grad.defined()
                        ? as_dtype(dout_grad, dtype).contiguous()
                        : torch::zeros({q.size(0), q.size(1), v.size(2)}, q.options());
  const auto dy =
      dweights_grad.defined() ? as_dtype(dweights_grad, dtype).contiguous() : torch::Tensor();
  ValuesGrads g{torch::empty_like(q), torch::empty_like(k), torch::empty_like(w),
                torch::empty_like(v)};
  cpu::additive_attention_kernels().backward_values(q, k, w, v, y, dout, dy, g.dq, g.dk, g.dw, g.dv,
                                                    lens);
  return g;
}

struct AdditiveFunction : torch::autograd::Function<AdditiveFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& queries,
                               const torch::Tensor& keys, const torch::Tensor& w_v,
                               const torch::Tensor& lens, bool softmax) {
    const auto q = compute_type(queries), w = compute_type(w_v);
    const auto k = as_dtype(keys, q.scalar_type()).contiguous();
    auto out = empty_output({q.size(0), q.size(1), keys.size(1)}, q.options());
    cpu::additive_attention_kernels().forward(q, k, w, out, lens, softmax);
    ctx->save_for_backward({q, k, w, out, lens});
    ctx->saved_data["softmax"] = softmax;
    return as_dtype(out, queries.scalar_type());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &w = saved[2], &out = saved[3], &lens = saved[4];
    const bool softmax = ctx->saved_data["softmax"].toBool();
    const auto dout = as_dtype(grads[0], q.scalar_type()).contiguous();
    auto dq = torch::empty_like(q), dk = torch::empty_like(k), dw = torch::empty_like(w);
    cpu::additive_attention_kernels().backward(q, k, w, out, dout, dq, dk, dw, lens, softmax);
    const auto dtype = grads[0].scalar_type();
    return {as_dtype(dq, dtype), as_dtype(dk, dtype),
            as_dtype(dw, dtype), torch::Tensor(), torch::Tensor()};
  }
};

// The fused kernel with the product by the values folded in (softmax only):
// (output, weights) = (weights · values, masked softmax of the scores). No
// (B, n, m) product goes through BLAS, so the whole op runs on ATen's
// threads (see README, "Two thread pools"). Either output may be unused:
// an undefined gradient stays undefined (set_materialize_grads(false)).
struct AdditiveValuesFunction : torch::autograd::Function<AdditiveValuesFunction> {
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& queries,
                             const torch::Tensor& keys, const torch::Tensor& values,
                             const torch::Tensor& w_v, const torch::Tensor& lens) {
    ctx->set_materialize_grads(false);
    const auto q = compute_type(queries), w = compute_type(w_v);
    const auto dtype = q.scalar_type();
    const auto k = as_dtype(keys, dtype).contiguous(), v = as_dtype(values, dtype).contiguous();
    auto weights = empty_output({q.size(0), q.size(1), keys.size(1)}, q.options());
    auto out = empty_output({q.size(0), q.size(1), values.size(2)}, q.options());
    cpu::additive_attention_kernels().forward_values(q, k, w, v, weights, out, lens);
    ctx->save_for_backward({q, k, w, v, weights, lens});
    return {as_dtype(out, queries.scalar_type()), as_dtype(weights, queries.scalar_type())};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &w = saved[2], &v = saved[3], &y = saved[4],
               &lens = saved[5];
    const auto& dout_grad = grads[0];
    const auto& dweights_grad = grads[1];
    if (!dout_grad.defined() && !dweights_grad.defined()) return tensor_list(5);
    const auto grad_dtype =
        dout_grad.defined() ? dout_grad.scalar_type() : dweights_grad.scalar_type();
    const auto g = values_backward(q, k, w, v, y, lens, dout_grad, dweights_grad);
    return {as_dtype(g.dq, grad_dtype), as_dtype(g.dk, grad_dtype), as_dtype(g.dv, grad_dtype),
            as_dtype(g.dw, grad_dtype), torch::Tensor()};
  }
};

// AdditiveAttention whole, for float and double without dropout: the two
// projections and AdditiveValuesFunction's kernel in one autograd node. The
// projections' products are split over ATen's threads where linear() would
// split them (linear.h); as one node, the op leaves the autograd engine one
// function to run instead of about ten (the projections' matmul, transpose and
// reshape nodes, w_v's reshape), which at the book's toy sizes was most of
// the forward+backward time.
struct AdditiveProjectedFunction : torch::autograd::Function<AdditiveProjectedFunction> {
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& queries,
                             const torch::Tensor& keys, const torch::Tensor& values,
                             const torch::Tensor& W_q, const torch::Tensor& W_k,
                             const torch::Tensor& w_v, const torch::Tensor& lens) {
    ctx->set_materialize_grads(false);
    const int64_t B = queries.size(0), n = queries.size(1), m = keys.size(1), h = W_q.size(0);
    // Sizes spelled out: a -1 cannot be inferred for zero rows.
    const auto q2 = queries.reshape({B * n, queries.size(2)});
    const auto k2 = keys.reshape({B * m, keys.size(2)});
    const auto q = mm_over_threads(q2, W_q.t()).view({B, n, h});
    const auto k = mm_over_threads(k2, W_k.t()).view({B, m, h});
    const auto w = w_v.reshape({-1}).contiguous(), v = values.contiguous();
    auto weights = empty_output({B, n, m}, q.options());
    auto out = empty_output({B, n, v.size(2)}, q.options());
    cpu::additive_attention_kernels().forward_values(q, k, w, v, weights, out, lens);
    ctx->save_for_backward({q2, k2, W_q, W_k, q, k, w, v, weights, lens});
    return {out, weights};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    refuse_double_backward();
    const auto saved = ctx->get_saved_variables();
    const auto &q2 = saved[0], &k2 = saved[1], &W_q = saved[2], &W_k = saved[3], &q = saved[4],
               &k = saved[5], &w = saved[6], &v = saved[7], &y = saved[8], &lens = saved[9];
    const auto &dout_grad = grads[0], &dweights_grad = grads[1];
    tensor_list result(7);
    if (!dout_grad.defined() && !dweights_grad.defined()) return result;
    const auto g = values_backward(q, k, w, v, y, lens, dout_grad, dweights_grad);
    const int64_t B = q.size(0), n = q.size(1), m = k.size(1), h = q.size(2);
    const auto dq2 = g.dq.view({B * n, h}), dk2 = g.dk.view({B * m, h});
    if (ctx->needs_input_grad(0)) result[0] = mm_over_threads(dq2, W_q).view({B, n, q2.size(1)});
    if (ctx->needs_input_grad(1)) result[1] = mm_over_threads(dk2, W_k).view({B, m, k2.size(1)});
    if (ctx->needs_input_grad(2)) result[2] = g.dv;
    if (ctx->needs_input_grad(3)) result[3] = mm_over_threads(dq2.t(), q2);
    if (ctx->needs_input_grad(4)) result[4] = mm_over_threads(dk2.t(), k2);
    if (ctx->needs_input_grad(5)) result[5] = g.dw.view({1, h});
    return result;
  }
};

// Queries per block so that one block's (B, c, m, h) features stay near chunk_bytes.
int64_t chunk_queries(const torch::Tensor& q, const torch::Tensor& k, int64_t chunk_bytes) {
  const int64_t per_query = q.size(0) * k.size(1) * q.size(2) * q.element_size();
  return std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, per_query));
}

torch::Tensor chunk_features(const torch::Tensor& q, const torch::Tensor& k, int64_t i0,
                             int64_t c) {
  return torch::tanh(q.narrow(1, i0, c).unsqueeze(2) + k.unsqueeze(1));
}

struct ChunkedAdditiveFunction : torch::autograd::Function<ChunkedAdditiveFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& w_v, int64_t chunk_bytes) {
    auto scores = empty_output({q.size(0), q.size(1), k.size(1)}, q.options());
    const int64_t step = chunk_queries(q, k, chunk_bytes);
    for (int64_t i0 = 0; i0 < q.size(1); i0 += step) {
      const int64_t c = std::min(step, q.size(1) - i0);
      scores.narrow(1, i0, c).copy_(
          torch::matmul(chunk_features(q, k, i0, c), w_v.t()).squeeze(-1));
    }
    ctx->save_for_backward({q, k, w_v});
    ctx->saved_data["step"] = step;
    return scores;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "d2l::additive_scores: the chunked path has no double backward; use "
                "AttentionBackend::kComposite when you need create_graph=true");
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &w = saved[2];
    const auto& ds = grads[0];
    auto dq = torch::empty_like(q), dk = torch::zeros_like(k), dw = torch::zeros_like(w);
    const int64_t step = ctx->saved_data["step"].toInt();
    for (int64_t i0 = 0; i0 < q.size(1); i0 += step) {
      const int64_t c = std::min(step, q.size(1) - i0);
      const auto t = chunk_features(q, k, i0, c);
      const auto g = ds.narrow(1, i0, c).unsqueeze(-1);
      dw += (g * t).sum({0, 1, 2}).unsqueeze(0);
      const auto u = g * w.view({1, 1, 1, -1}) * (1 - t * t);
      dq.narrow(1, i0, c).copy_(u.sum(2));
      dk += u.sum(1);
    }
    return {dq, dk, dw, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor additive_autograd(const torch::Tensor& projected_queries,
                                const torch::Tensor& projected_keys, const torch::Tensor& w,
                                const torch::Tensor& lens, bool softmax) {
  return AdditiveFunction::apply(projected_queries, projected_keys, w, lens, softmax);
}

std::tuple<torch::Tensor, torch::Tensor> additive_values_autograd(
    const torch::Tensor& projected_queries, const torch::Tensor& projected_keys,
    const torch::Tensor& values, const torch::Tensor& w, const torch::Tensor& lens) {
  auto outputs = AdditiveValuesFunction::apply(projected_queries, projected_keys, values, w, lens);
  return {std::move(outputs[0]), std::move(outputs[1])};
}

std::tuple<torch::Tensor, torch::Tensor> additive_projected_autograd(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& W_q, const torch::Tensor& W_k, const torch::Tensor& w_v,
    const torch::Tensor& lens) {
  auto outputs = AdditiveProjectedFunction::apply(queries, keys, values, W_q, W_k, w_v, lens);
  return {std::move(outputs[0]), std::move(outputs[1])};
}

torch::Tensor chunked_additive_autograd(const torch::Tensor& projected_queries,
                                        const torch::Tensor& projected_keys,
                                        const torch::Tensor& w_v, int64_t chunk_bytes) {
  return ChunkedAdditiveFunction::apply(projected_queries, projected_keys, w_v, chunk_bytes);
}

}  // namespace d2l::detail
