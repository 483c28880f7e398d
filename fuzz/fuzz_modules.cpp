// fuzz_attention's areas of the modules built on the scorers: multi-head
// attention (the module and functional::multi_head_attention with hostile
// weights, biases and head counts) and Nadaraya–Watson pooling (both
// functional forms and NWKernelRegression with a hostile width w).

#include <d2l/multi_head_attention.h>
#include <d2l/nadaraya_watson.h>

#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fuzz_common.h"

namespace d2l_fuzz {
namespace {

// Per-head weights (B * heads, n, m): each batch entry's lengths hold for
// all of its heads.
void check_head_weights(const torch::Tensor& w, const torch::Tensor& lens, int64_t B, int64_t n,
                        int64_t m, int64_t heads, bool finite_expected) {
  check_weights(w, valid_mask(lens, B, n, m).repeat_interleave(heads, 0), finite_expected);
}

// A weight of `shape`, sometimes of another shape or dtype.
torch::Tensor projection(Bytes& in, std::vector<int64_t> shape, torch::Dtype dtype) {
  if (in.below(16) == 0 && !shape.empty()) shape[in.below(shape.size())] += 1;
  if (in.below(16) == 0) dtype = in.pick(kDataDtypes);
  // A quarter of make_arg's values: scores stay finite in float16.
  const auto t = make_arg(in, shape, dtype, /*requires_grad=*/false).value;
  return floating(t) ? t.mul(0.25) : t;
}

void fuzz_multi_head_functional(Bytes& in, const QKVArgs& a) {
  const int64_t heads = in.below(5) - (in.below(8) == 0 ? 4 : 0);
  const int64_t h = in.below(9);
  const auto dtype = a.queries.value.scalar_type();
  const int64_t dq = a.queries.value.size(-1), dk = a.keys.value.size(-1);
  const int64_t dv = a.values.value.dim() > 0 ? a.values.value.size(-1) : 1;
  auto options = d2l::functional::MultiHeadAttentionFuncOptions(
                     heads, projection(in, {h, dq}, dtype), projection(in, {h, dk}, dtype),
                     projection(in, {h, dv}, dtype), projection(in, {h, h}, dtype))
                     .dropout(in.pick(kDropouts))
                     .training(in.flag())
                     .backend(in.pick(kPaths))
                     .need_weights(in.flag());
  if (in.flag()) {
    options.b_q(projection(in, {h}, dtype)).b_k(projection(in, {h}, dtype));
    options.b_v(projection(in, {h}, dtype)).b_o(projection(in, {h}, dtype));
  }
  current.description =
      "functional::multi_head_attention heads=" + std::to_string(heads) + " h=" + std::to_string(h);
  bool tame_inputs = a.tame_inputs;
  const std::vector<std::pair<const char*, torch::Tensor>> weights_and_biases = {
      {"W_q", options.W_q()}, {"W_k", options.W_k()}, {"W_v", options.W_v()},
      {"W_o", options.W_o()}, {"b_q", options.b_q()}, {"b_k", options.b_k()},
      {"b_v", options.b_v()}, {"b_o", options.b_o()}};
  for (const auto& [name, t] : weights_and_biases) {
    note(name, t);
    tame_inputs = tame_inputs && tame(t);
  }
  const auto [out, weights] = d2l::functional::multi_head_attention(
      a.queries.value, a.keys.value, a.values.value,
      d2l::functional::MultiHeadAttentionFuncOptions(options).valid_lens(a.lens));
  note("out", out);
  note("weights", weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  FUZZ_CHECK(heads > 0, "a non-positive num_heads was accepted");
  FUZZ_CHECK(out.sizes() == torch::IntArrayRef({B, n, h}), "multi-head output of wrong shape");
  if (options.need_weights()) check_head_weights(weights, a.lens, B, n, m, heads, tame_inputs);
  if (tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  check_backward(out, {a.queries.leaf, a.keys.leaf, a.values.leaf}, tame_inputs, in);
}

void fuzz_multi_head_module(Bytes& in, const QKVArgs& a) {
  const int64_t dv = a.values.value.dim() > 0 ? a.values.value.size(-1) : 1;
  auto options = d2l::MultiHeadAttentionOptions(a.keys.value.size(-1), a.queries.value.size(-1), dv,
                                                in.below(9), in.below(5))
                     .dropout(in.pick(kDropouts))
                     .bias(in.flag())
                     .backend(in.pick(kPaths))
                     .record_attention_weights(in.flag());
  if (in.below(8) == 0) options.key_size(in.below(10));
  if (in.below(8) == 0) options.num_heads(-in.below(3));
  d2l::MultiHeadAttention attention(options);
  const auto module_dtype = in.below(4) == 0 ? in.pick(kDataDtypes) : a.queries.value.scalar_type();
  if (at::isFloatingType(module_dtype)) attention->to(module_dtype);
  attention->train(in.flag());
  const auto grad_mode = pick_grad_mode(in);
  std::ostringstream description;
  description << *attention << " training=" << attention->is_training()
              << " grad_mode=" << static_cast<int>(grad_mode);
  current.description = description.str();
  torch::Tensor out;
  {
    GradModeScope scope(grad_mode);
    out = attention(a.queries.value, a.keys.value, a.values.value, a.lens);
  }
  note("out", out);
  const auto& weights = attention->attention->attention_weights;
  note("attention_weights", weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  FUZZ_CHECK(out.sizes() == torch::IntArrayRef({B, n, options.num_hiddens()}),
             "multi-head output of wrong shape");
  FUZZ_CHECK(options.num_heads() > 0, "a non-positive num_heads was accepted");
  if (options.record_attention_weights()) {
    check_head_weights(weights, a.lens, B, n, m, options.num_heads(), a.tame_inputs);
  } else {
    FUZZ_CHECK(!weights.defined(), "weights recorded while turned off");
  }
  if (a.tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  auto leaves = attention->parameters();
  leaves.insert(leaves.end(), {a.queries.leaf, a.keys.leaf, a.values.leaf});
  check_backward(out, leaves, a.tame_inputs, in);
}

// Weights (n_q, n_k) of a pooling: rows sum to 1 (no key is ever masked).
void check_pooling(const torch::Tensor& out, const torch::Tensor& weights, int64_t n_q, int64_t n_k,
                   bool finite_expected) {
  note("out", out);
  note("weights", weights);
  FUZZ_CHECK(out.sizes() == torch::IntArrayRef({n_q}), "pooling output of wrong shape");
  check_weights(weights, torch::ones({n_q, n_k}, torch::kBool), finite_expected);
  if (finite_expected) FUZZ_CHECK(all_finite(out), "pooling output not finite for finite inputs");
}

}  // namespace

void fuzz_multi_head(Bytes& in) {
  const auto a = make_qkv(in, false);
  if (in.flag()) {
    fuzz_multi_head_functional(in, a);
  } else {
    fuzz_multi_head_module(in, a);
  }
}

void fuzz_nadaraya_watson(Bytes& in) {
  const auto d = dims(in, 2);  // n_q, n_k
  const int64_t n_q = d[0], n_k = d[1];
  const auto dtype = in.pick(kDataDtypes);
  const bool grad = in.flag();
  const int64_t kind = in.below(3);
  const int64_t rank = kind == 0 ? 1 : 2;
  std::vector<int64_t> qs{n_q}, ks{n_k}, vs{n_k};
  if (rank == 2) ks = vs = {n_q, n_k};
  switch (in.below(12)) {
    case 0: ks[0] += 1; break;
    case 1: vs.back() += 1; break;
    case 2: qs.push_back(1); break;
    case 3: vs.pop_back(); break;
    default: break;
  }
  const auto q = make_arg(in, qs, dtype, grad), k = make_arg(in, ks, dtype, grad);
  const auto v = make_arg(in, vs, in.below(16) == 0 ? in.pick(kDataDtypes) : dtype, grad);
  note("queries", q.value);
  note("keys", k.value);
  note("values", v.value);
  bool tame_inputs = tame(q.value) && tame(k.value) && tame(v.value);
  torch::Tensor out, weights;
  std::vector<torch::Tensor> leaves{q.leaf, k.leaf, v.leaf};
  if (kind == 0) {
    current.description = "functional::nadaraya_watson";
    std::tie(out, weights) = d2l::functional::nadaraya_watson(q.value, k.value, v.value);
  } else {
    // The width: [1] as the module holds it, [] or a wrong shape or dtype.
    const auto w_shape = in.pick<std::vector<int64_t>>({{1}, {1}, {}, {2}, {0}, {1, 1}});
    const auto w = make_arg(in, w_shape, in.below(8) == 0 ? in.pick(kDataDtypes) : dtype, grad);
    note("w", w.value);
    tame_inputs = tame_inputs && tame(w.value);
    leaves.push_back(w.leaf);
    if (kind == 1) {
      current.description = "functional::nw_kernel_regression";
      std::tie(out, weights) =
          d2l::functional::nw_kernel_regression(q.value, k.value, v.value, w.value);
    } else {
      current.description = "NWKernelRegression";
      d2l::NWKernelRegression net;
      if (floating(w.value)) net->to(w.value.scalar_type());
      if (w.value.sizes() == net->w.sizes()) {
        torch::NoGradGuard no_grad;
        net->w.copy_(w.value);
      }
      leaves.back() = net->w;
      const auto grad_mode = pick_grad_mode(in);
      GradModeScope scope(grad_mode);
      out = net(q.value, k.value, v.value);
      weights = net->attention_weights;
    }
  }
  check_pooling(out, weights, n_q, n_k, tame_inputs);
  check_backward(out, leaves, tame_inputs, in);
}

}  // namespace d2l_fuzz
