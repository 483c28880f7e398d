// Multi-head attention as one autograd function on the CPU: the query, key
// and value projections, the small-head kernels (Note [Small heads]) and the
// output projection, forward and backward; the book's ops, differentiable,
// when a double backward is asked.

#include <torch/autograd.h>

#include <cmath>

#include <d2l/multi_head_attention.h>

#include "attention_weights.h"
#include "cpu/kernel_args.h"
#include "cpu/multi_head_attention_kernel.h"
#include "linear.h"
#include "masked_softmax_internal.h"
#include "multi_head_attention_internal.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// x (B, n, in) Wᵀ + b, a new contiguous (B, n, out). An empty `b` is no bias.
torch::Tensor project(const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b) {
  auto y = mm_over_threads(x.reshape({-1, W.size(1)}), W.t());
  if (b.numel() > 0) y.add_(b);
  return y.view({x.size(0), x.size(1), W.size(0)});
}

double head_scale(int64_t h, int64_t heads) {
  return 1.0 / std::sqrt(static_cast<double>(h / heads));
}

struct ForwardPass {
  torch::Tensor out, weights, q, k, v, joined, noise;
};

// Biases are empty tensors when absent; `lens` as lengths_arg makes it.
// In bfloat16 the four projections run in bfloat16 (ATen's matrix products,
// which use the CPU's bfloat16 instructions or tiles; in float, rounded
// once, without AVX512-BF16: mm_over_threads) and the heads in float:
// q, k and v are widened once, the weights and noise stay float, and the
// heads' output is rounded to bfloat16 once, for the output projection
// (Note [Small heads], bfloat16). Then q, k, v, weights and noise are in
// the kernels' type and `joined` in the input's.
ForwardPass forward_pass(const torch::Tensor& queries, const torch::Tensor& keys,
                         const torch::Tensor& values, const MultiHeadWeights& w,
                         const torch::Tensor& lens, int64_t heads, double p, bool training) {
  ForwardPass r;
  r.q = compute_type(project(queries, w.W_q, w.b_q));
  r.k = compute_type(project(keys, w.W_k, w.b_k));
  r.v = compute_type(project(values, w.W_v, w.b_v));
  const int64_t batch = queries.size(0), n = queries.size(1), m = keys.size(1);
  const int64_t h = w.W_q.size(0);
  const auto options = r.q.options();
  r.noise = training && p > 0 ? dropout_noise({batch * heads, n, m}, p, options)
                              : torch::empty({0}, options);
  r.weights = empty_output({batch * heads, n, m}, options);
  const auto joined = torch::empty({batch, n, h}, options);
  cpu::multi_head_attention_kernels().forward(r.q, r.k, r.v, lens, r.noise, heads,
                                              head_scale(h, heads), r.weights, joined);
  r.joined = as_dtype(joined, queries.scalar_type());
  r.out = project(r.joined, w.W_o, w.b_o);
  return r;
}

// The book's ops on the same inputs and dropout multipliers, differentiable:
// what a double backward differentiates.
std::tuple<torch::Tensor, torch::Tensor> composite(const torch::Tensor& queries,
                                                   const torch::Tensor& keys,
                                                   const torch::Tensor& values,
                                                   const MultiHeadWeights& w,
                                                   const torch::Tensor& lens,
                                                   const torch::Tensor& noise, int64_t heads) {
  const auto linear = [](const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b) {
    return torch::nn::functional::linear(x, W, b.numel() > 0 ? b : torch::Tensor());
  };
  const auto q = transpose_qkv(linear(queries, w.W_q, w.b_q), heads);
  const auto k = transpose_qkv(linear(keys, w.W_k, w.b_k), heads);
  const auto v = transpose_qkv(linear(values, w.W_v, w.b_v), heads);
  auto per_head = lens;
  if (lens.numel() == 0) {
    per_head = torch::Tensor();
  } else if (lens.size(0) != q.size(0)) {
    per_head = lens.repeat_interleave(heads, /*dim=*/0);
  }
  const auto weights = composite_masked_softmax(
      torch::bmm(q, k.transpose(1, 2)) * head_scale(w.W_q.size(0), heads), per_head);
  const auto kept = noise.numel() > 0 ? weights * noise : weights;
  auto out = linear(transpose_output(torch::bmm(kept, v), heads), w.W_o, w.b_o);
  return {std::move(out), weights};
}

// The inputs' order in the function, which is also their gradients'.
enum Input : size_t { kQ, kK, kV, kWq, kWk, kWv, kWo, kBq, kBk, kBv, kBo, kLens, kInputs };
constexpr size_t kArguments = kInputs + 4;  // heads, dropout, training, need_weights

MultiHeadWeights weights_of(const std::vector<torch::Tensor>& saved) {
  return {saved[kWq], saved[kWk], saved[kWv], saved[kWo],
          saved[kBq], saved[kBk], saved[kBv], saved[kBo]};
}

struct MultiHeadAttentionFunction : torch::autograd::Function<MultiHeadAttentionFunction> {
  // Returns {output} or, with need_weights, {output, weights}. Biases are
  // empty tensors when absent: LibTorch 1.13's functions take no undefined
  // inputs.
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& queries,
                             const torch::Tensor& keys, const torch::Tensor& values,
                             const torch::Tensor& W_q, const torch::Tensor& W_k,
                             const torch::Tensor& W_v, const torch::Tensor& W_o,
                             const torch::Tensor& b_q, const torch::Tensor& b_k,
                             const torch::Tensor& b_v, const torch::Tensor& b_o,
                             const torch::Tensor& lens, int64_t heads, double p, bool training,
                             bool need_weights) {
    const MultiHeadWeights w{W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o};
    auto r = forward_pass(queries, keys, values, w, lens, heads, p, training);
    ctx->save_for_backward({queries, keys, values, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o, lens,
                            r.q, r.k, r.v, r.joined, r.noise, r.weights});
    ctx->saved_data["heads"] = heads;
    // Self-attention: one gradient for the one input, summed here.
    ctx->saved_data["self"] = queries.is_same(keys) && keys.is_same(values);
    ctx->set_materialize_grads(false);
    tensor_list outputs{r.out};
    if (need_weights) outputs.push_back(as_dtype(r.weights, queries.scalar_type()));
    return outputs;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const bool self = ctx->saved_data["self"].toBool();
    const auto dout = grads[0];
    const auto dweights = grads.size() > 1 ? grads[1] : torch::Tensor();
    tensor_list result(kArguments);
    if (!dout.defined() && !dweights.defined()) return result;
    const auto needs = [&](size_t i) { return ctx->needs_input_grad(i); };
    if (torch::GradMode::is_enabled()) return double_backward(ctx, saved, dout, dweights, self);

    const auto& queries = saved[kQ];
    const auto w = weights_of(saved);
    const auto &lens = saved[kLens], &q = saved[kInputs], &k = saved[kInputs + 1],
               &v = saved[kInputs + 2], &joined = saved[kInputs + 3], &noise = saved[kInputs + 4],
               &weights = saved[kInputs + 5];
    const int64_t batch = queries.size(0), n = queries.size(1), h = w.W_o.size(0);
    // dout2, djoined and the projections' gradients in the input's type;
    // the heads' gradients in the kernels' (forward_pass).
    const auto dout2 = dout.defined() ? dout.reshape({batch * n, h}).contiguous()
                                      : torch::zeros({batch * n, h}, joined.options());
    if (needs(kWo)) result[kWo] = mm_over_threads(dout2.t(), joined.view({batch * n, h}));
    if (needs(kBo) && w.b_o.numel() > 0) result[kBo] = dout2.sum(0);
    const auto djoined = compute_type(mm_over_threads(dout2, w.W_o).view({batch, n, h}));
    auto dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    cpu::multi_head_attention_kernels().backward(
        q, k, v, lens, noise, heads, head_scale(h, heads), weights, djoined,
        dweights.defined() ? as_dtype(dweights, q.scalar_type()).contiguous() : torch::Tensor(), dq,
        dk, dv);
    // Each projection: dW = dPᵀ x, db = Σ dP, dx = dP W.
    const struct {
      Input x, W, b;
      const torch::Tensor& grad;
    } projections[] = {{kQ, kWq, kBq, dq}, {kK, kWk, kBk, dk}, {kV, kWv, kBv, dv}};
    for (const auto& pr : projections) {
      const auto& x = saved[pr.x];
      const auto& W = saved[pr.W];
      const auto g = as_dtype(pr.grad, x.scalar_type()).view({-1, h});
      if (needs(pr.W)) result[pr.W] = mm_over_threads(g.t(), x.reshape({-1, W.size(1)}));
      if (needs(pr.b) && saved[pr.b].numel() > 0) result[pr.b] = g.sum(0);
      if (!needs(pr.x)) continue;
      if (self && pr.x != kQ) {
        auto dx = result[kQ].view({-1, W.size(1)});
        if (mm_widens(g, W)) {
          // One rounding of the sum, as addmm_ gives.
          dx.copy_(at::addmm(dx.to(torch::kFloat), g.to(torch::kFloat), W.to(torch::kFloat)));
        } else {
          dx.addmm_(g, W);
        }
      } else {
        result[pr.x] = mm_over_threads(g, W).view(x.sizes());
      }
    }
    return result;
  }

  // create_graph=true: the book's ops on the saved inputs, differentiated
  // with a graph of their own (each distinct input once).
  static tensor_list double_backward(AutogradContext* ctx, const std::vector<torch::Tensor>& saved,
                                     const torch::Tensor& dout, const torch::Tensor& dweights,
                                     bool self) {
    std::vector<torch::Tensor> inputs;
    std::vector<size_t> slots;
    for (size_t i = kQ; i < kLens; ++i) {
      if (!ctx->needs_input_grad(i) || saved[i].numel() == 0) continue;
      if (self && (i == kK || i == kV)) continue;
      inputs.push_back(saved[i]);
      slots.push_back(i);
    }
    tensor_list result(kArguments);
    if (inputs.empty()) return result;
    auto [out, weights] =
        composite(saved[kQ], saved[kK], saved[kV], weights_of(saved), saved[kLens],
                  saved[kInputs + 4], ctx->saved_data["heads"].toInt());
    std::vector<torch::Tensor> outputs, grad_outputs;
    if (dout.defined()) {
      outputs.push_back(out);
      grad_outputs.push_back(dout);
    }
    if (dweights.defined()) {
      outputs.push_back(weights);
      grad_outputs.push_back(dweights);
    }
    const auto grads = torch::autograd::grad(outputs, inputs, grad_outputs,
                                             /*retain_graph=*/true, /*create_graph=*/true,
                                             /*allow_unused=*/true);
    for (size_t i = 0; i < slots.size(); ++i) result[slots[i]] = grads[i];
    return result;
  }
};

torch::Tensor or_empty(const torch::Tensor& b, const torch::Tensor& like) {
  return b.defined() ? b : torch::empty({0}, like.options());
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> fused_multi_head_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const MultiHeadWeights& weights, const torch::Tensor& lens, int64_t heads, double dropout,
    bool training, bool need_weights) {
  TORCH_INTERNAL_ASSERT(queries.device().is_cpu(), "the small-head kernels got ", queries.device());
  const auto& w = weights;
  const MultiHeadWeights given{w.W_q,
                               w.W_k,
                               w.W_v,
                               w.W_o,
                               or_empty(w.b_q, w.W_q),
                               or_empty(w.b_k, w.W_q),
                               or_empty(w.b_v, w.W_q),
                               or_empty(w.b_o, w.W_q)};
  const auto lengths = lengths_arg(lens);
  bool grad = false;
  for (const auto* t :
       {&queries, &keys, &values, &w.W_q, &w.W_k, &w.W_v, &w.W_o, &w.b_q, &w.b_k, &w.b_v, &w.b_o}) {
    grad = grad || (t->defined() && t->requires_grad());
  }
  if (torch::GradMode::is_enabled() && grad) {
    auto outputs = MultiHeadAttentionFunction::apply(
        queries, keys, values, given.W_q, given.W_k, given.W_v, given.W_o, given.b_q, given.b_k,
        given.b_v, given.b_o, lengths, heads, dropout, training, need_weights);
    return {outputs[0], need_weights ? outputs[1] : torch::Tensor()};
  }
  auto r = forward_pass(queries, keys, values, given, lengths, heads, dropout, training);
  return {std::move(r.out), need_weights ? std::move(r.weights) : torch::Tensor()};
}

}  // namespace d2l::detail
