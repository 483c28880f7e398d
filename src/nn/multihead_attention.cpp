// d2l::nn::MultiheadAttention: torch::nn::MultiheadAttention's interface on
// the library's multi-head attention, with Python's mask semantics
// (docs/nn.md). The checks come first; then the masks are read once: float
// masks holding only 0 and -inf are boolean masks and run
// d2l::functional::multi_head_attention (small heads or flash), any other
// float mask, and the appended add_bias_kv / add_zero_attn rows, run the
// additive path below, which adds the mask to the scores as Python does.

#include <d2l/multi_head_attention.h>
#include <d2l/nn.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/init.h>

#include <cmath>
#include <limits>

#include "checks.h"
#include "linear.h"
#include "nn/multihead_attention_internal.h"
#include "select.h"

namespace d2l::nn {
namespace {

constexpr const char* kFunctional = "d2l::nn::functional::multi_head_attention_forward";
constexpr const char* kModule = "d2l::nn::MultiheadAttention";

using impl::Plan;
using impl::plan_call;

torch::Tensor batch_major(const torch::Tensor& t, bool batch_first) {
  return batch_first ? t : t.transpose(0, 1);
}

d2l::functional::MultiHeadAttentionFuncOptions fast_options(
    const Plan& p, const functional::MultiheadAttentionForwardFuncOptions& o) {
  return d2l::functional::MultiHeadAttentionFuncOptions(o.num_heads(), p.W_q, p.W_k, p.W_v,
                                                        o.out_proj_weight())
      .b_q(p.b_q)
      .b_k(p.b_k)
      .b_v(p.b_v)
      .b_o(o.out_proj_bias())
      .dropout(o.dropout_p())
      .training(o.training())
      .backend(o.backend())
      .need_weights(o.need_weights())
      .key_padding_mask(p.kpm.as_bool)
      .attn_mask(p.attn.as_bool)
      .is_causal(o.is_causal());
}

// Every mask of the call as one float tensor broadcastable to (N, heads, L,
// S + extra): -inf where a key is not allowed, the float masks' values
// elsewhere; the `extra` appended keys are seen by every query.
torch::Tensor additive_mask(const Plan& p,
                            const functional::MultiheadAttentionForwardFuncOptions& o,
                            const torch::TensorOptions& options, int64_t extra) {
  const int64_t L = p.s.L, S = p.s.S, N = p.s.N, heads = o.num_heads();
  const double minus_inf = -std::numeric_limits<double>::infinity();
  const auto as_float = [&](const impl::ReadMask& m) {
    if (m.additive.defined()) return m.additive;
    return torch::zeros(m.as_bool.sizes(), options).masked_fill(m.as_bool, minus_inf);
  };
  torch::Tensor mask;
  const auto add = [&mask](torch::Tensor t) { mask = mask.defined() ? mask + t : std::move(t); };
  if (o.attn_mask().defined()) {
    auto m = as_float(p.attn);
    add(m.dim() == 2 ? m.view({1, 1, L, S}) : m.view({N, heads, L, S}));
  }
  if (o.key_padding_mask().defined()) add(as_float(p.kpm).view({N, 1, 1, S}));
  if (o.is_causal()) {
    add(torch::full({L, S}, minus_inf, options).triu(S - L + 1).view({1, 1, L, S}));
  }
  if (!mask.defined() || extra == 0) return mask;
  auto sizes = mask.sizes().vec();
  sizes.back() = extra;
  return torch::cat({mask, torch::zeros(sizes, options)}, -1);
}

// Python's multi-head attention with an additive mask: the projections, the
// appended rows, scores + mask, softmax, dropout, the weighted values and the
// output projection, with autograd's ops. A row that sees no key gets zero
// weights (and gradients), not NaN.
std::tuple<torch::Tensor, torch::Tensor> additive_path(
    const Plan& p, const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const functional::MultiheadAttentionForwardFuncOptions& o) {
  const auto [L, S, N, E] = p.s;
  const int64_t heads = o.num_heads(), d = E / heads;
  const auto backend = o.backend();
  auto q = detail::linear(batch_major(query, o.batch_first()), p.W_q, p.b_q, backend);
  auto k = detail::linear(batch_major(key, o.batch_first()), p.W_k, p.b_k, backend);
  auto v = detail::linear(batch_major(value, o.batch_first()), p.W_v, p.b_v, backend);
  if (o.bias_k().defined()) {
    k = torch::cat({k, o.bias_k().expand({N, 1, E})}, 1);
    v = torch::cat({v, o.bias_v().expand({N, 1, E})}, 1);
  }
  q = transpose_qkv(q, heads);
  k = transpose_qkv(k, heads);
  v = transpose_qkv(v, heads);
  if (o.add_zero_attn()) {
    k = torch::cat({k, torch::zeros({N * heads, 1, d}, k.options())}, 1);
    v = torch::cat({v, torch::zeros({N * heads, 1, d}, v.options())}, 1);
  }
  const int64_t S2 = k.size(1);
  auto scores = torch::bmm(q, k.transpose(1, 2)).div_(std::sqrt(static_cast<double>(d)));
  scores = scores.view({N, heads, L, S2});
  const auto mask = additive_mask(p, o, query.options(), S2 - S);
  torch::Tensor dead;
  if (mask.defined()) {
    scores = scores + mask;
    const auto all_masked =
        (mask == -std::numeric_limits<double>::infinity()).all(-1, /*keepdim=*/true);
    if (all_masked.any().item<bool>()) dead = all_masked;
  }
  if (dead.defined()) scores = scores.masked_fill(dead, 0);
  auto weights = torch::softmax(scores, -1);
  if (dead.defined()) weights = weights.masked_fill(dead, 0);
  const auto dropped = torch::dropout(weights, o.dropout_p(), o.training());
  auto out = torch::bmm(dropped.view({N * heads, L, S2}), v);
  out =
      detail::linear(transpose_output(out, heads), o.out_proj_weight(), o.out_proj_bias(), backend);
  if (!o.need_weights()) return {out, {}};
  return {out, weights};
}

std::tuple<torch::Tensor, torch::Tensor> run(
    const char* fn, const torch::Tensor& query, const torch::Tensor& key,
    const torch::Tensor& value, const functional::MultiheadAttentionForwardFuncOptions& o) {
  const auto p = plan_call(fn, query, key, value, o);
  const bool log = detail::logging_paths();
  torch::Tensor out, weights;
  if (p.additive) {
    if (log) detail::log_path(fn, o.backend(), "additive_mask", {p.why_additive});
    std::tie(out, weights) = additive_path(p, query, key, value, o);
  } else {
    // Self-attention passed as one tensor (by identity, never by value) is
    // laid out batch-major once; the projections read it three times.
    const auto q = batch_major(query, o.batch_first()).contiguous();
    const auto k = key.is_same(query) ? q : batch_major(key, o.batch_first());
    const auto v = value.is_same(query) ? q
                   : value.is_same(key) ? k
                                        : batch_major(value, o.batch_first());
    std::tie(out, weights) = d2l::functional::multi_head_attention(q, k, v, fast_options(p, o));
    if (weights.defined()) weights = weights.reshape({p.s.N, o.num_heads(), p.s.L, p.s.S});
  }
  if (!o.batch_first()) out = out.transpose(0, 1).contiguous();
  if (weights.defined() && o.average_attn_weights()) weights = weights.mean(1);
  return {out, weights};
}

PathExplanation explain(const char* fn, const torch::Tensor& query, const torch::Tensor& key,
                        const torch::Tensor& value,
                        const functional::MultiheadAttentionForwardFuncOptions& o) {
  const auto p = plan_call(fn, query, key, value, o);
  if (p.additive) return {fn, o.backend(), "additive_mask", {p.why_additive}};
  auto inner =
      d2l::explain_path(batch_major(query, o.batch_first()), batch_major(key, o.batch_first()),
                        batch_major(value, o.batch_first()), fast_options(p, o));
  inner.op = fn;
  return inner;
}

}  // namespace

namespace functional {

MultiheadAttentionForwardFuncOptions::MultiheadAttentionForwardFuncOptions(
    int64_t embed_dim_to_check, int64_t num_heads, torch::Tensor in_proj_weight,
    torch::Tensor in_proj_bias, torch::Tensor bias_k, torch::Tensor bias_v, bool add_zero_attn,
    double dropout_p, torch::Tensor out_proj_weight, torch::Tensor out_proj_bias)
    : embed_dim_to_check_(embed_dim_to_check),
      num_heads_(num_heads),
      in_proj_weight_(std::move(in_proj_weight)),
      in_proj_bias_(std::move(in_proj_bias)),
      bias_k_(std::move(bias_k)),
      bias_v_(std::move(bias_v)),
      add_zero_attn_(add_zero_attn),
      dropout_p_(dropout_p),
      out_proj_weight_(std::move(out_proj_weight)),
      out_proj_bias_(std::move(out_proj_bias)) {}

std::tuple<torch::Tensor, torch::Tensor> multi_head_attention_forward(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const MultiheadAttentionForwardFuncOptions& options) {
  return run(kFunctional, query, key, value, options);
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value,
                             const functional::MultiheadAttentionForwardFuncOptions& options) {
  return explain(kFunctional, query, key, value, options);
}

MultiheadAttentionOptions::MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads)
    : embed_dim_(embed_dim), num_heads_(num_heads), kdim_(embed_dim), vdim_(embed_dim) {}

MultiheadAttentionImpl::MultiheadAttentionImpl(const MultiheadAttentionOptions& options_)
    : options(options_) {
  reset();
}

void MultiheadAttentionImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.embed_dim() > 0 && o.num_heads() > 0 && o.kdim() > 0 && o.vdim() > 0,
              fmt::format("{}: embed_dim, num_heads, kdim and vdim must be positive, got "
                          "embed_dim={}, num_heads={}, kdim={}, vdim={}",
                          kModule, o.embed_dim(), o.num_heads(), o.kdim(), o.vdim()));
  TORCH_CHECK(o.embed_dim() % o.num_heads() == 0,
              fmt::format("{}: embed_dim must be divisible by num_heads, got embed_dim={} and "
                          "num_heads={}",
                          kModule, o.embed_dim(), o.num_heads()));
  detail::check_dropout(kModule, o.dropout());
  const int64_t E = o.embed_dim();
  head_dim = E / o.num_heads();
  _qkv_same_embed_dim = o.kdim() == E && o.vdim() == E;
  // Registered in Python's order, undefined ones too (as LibTorch does), so
  // that state_dict keys, torch::save archives and clone() line up.
  if (_qkv_same_embed_dim) {
    in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * E, E}));
    q_proj_weight = register_parameter("q_proj_weight", {}, false);
    k_proj_weight = register_parameter("k_proj_weight", {}, false);
    v_proj_weight = register_parameter("v_proj_weight", {}, false);
  } else {
    in_proj_weight = register_parameter("in_proj_weight", {}, false);
    q_proj_weight = register_parameter("q_proj_weight", torch::empty({E, E}));
    k_proj_weight = register_parameter("k_proj_weight", torch::empty({E, o.kdim()}));
    v_proj_weight = register_parameter("v_proj_weight", torch::empty({E, o.vdim()}));
  }
  in_proj_bias = o.bias() ? register_parameter("in_proj_bias", torch::empty({3 * E}))
                          : register_parameter("in_proj_bias", {}, false);
  if (o.add_bias_kv()) {
    bias_k = register_parameter("bias_k", torch::empty({1, 1, E}));
    bias_v = register_parameter("bias_v", torch::empty({1, 1, E}));
  } else {
    bias_k.reset();
    bias_v.reset();
  }
  out_proj =
      register_module("out_proj", torch::nn::Linear(torch::nn::LinearOptions(E, E).bias(o.bias())));
  _reset_parameters();
}

void MultiheadAttentionImpl::_reset_parameters() {
  torch::NoGradGuard no_grad;
  namespace init = torch::nn::init;
  if (_qkv_same_embed_dim) {
    init::xavier_uniform_(in_proj_weight);
  } else {
    init::xavier_uniform_(q_proj_weight);
    init::xavier_uniform_(k_proj_weight);
    init::xavier_uniform_(v_proj_weight);
  }
  if (in_proj_bias.defined()) {
    init::constant_(in_proj_bias, 0.);
    init::constant_(out_proj->bias, 0.);
  }
  if (bias_k.defined()) init::xavier_normal_(bias_k);
  if (bias_v.defined()) init::xavier_normal_(bias_v);
}

void MultiheadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::nn::MultiheadAttention(embed_dim={}, num_heads={}, dropout={}, bias={}, "
      "add_bias_kv={}, add_zero_attn={}, kdim={}, vdim={}, batch_first={})",
      options.embed_dim(), options.num_heads(), options.dropout(), options.bias(),
      options.add_bias_kv(), options.add_zero_attn(), options.kdim(), options.vdim(),
      options.batch_first());
}

functional::MultiheadAttentionForwardFuncOptions MultiheadAttentionImpl::call_options(
    const torch::Tensor& key_padding_mask, bool need_weights, const torch::Tensor& attn_mask,
    bool average_attn_weights, bool is_causal) const {
  return functional::MultiheadAttentionForwardFuncOptions(
             options.embed_dim(), options.num_heads(), in_proj_weight, in_proj_bias, bias_k, bias_v,
             options.add_zero_attn(), options.dropout(), out_proj->weight, out_proj->bias)
      .training(is_training())
      .key_padding_mask(key_padding_mask)
      .need_weights(need_weights)
      .attn_mask(attn_mask)
      .use_separate_proj_weight(!_qkv_same_embed_dim)
      .q_proj_weight(q_proj_weight)
      .k_proj_weight(k_proj_weight)
      .v_proj_weight(v_proj_weight)
      .average_attn_weights(average_attn_weights)
      .is_causal(is_causal)
      .batch_first(options.batch_first())
      .backend(options.backend());
}

std::tuple<torch::Tensor, torch::Tensor> MultiheadAttentionImpl::forward(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const torch::Tensor& key_padding_mask, bool need_weights, const torch::Tensor& attn_mask,
    bool average_attn_weights, bool is_causal) {
  return run(
      kModule, query, key, value,
      call_options(key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal));
}

PathExplanation MultiheadAttentionImpl::explain_path(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const torch::Tensor& key_padding_mask, bool need_weights, const torch::Tensor& attn_mask,
    bool average_attn_weights, bool is_causal) const {
  return explain(
      kModule, query, key, value,
      call_options(key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal));
}

}  // namespace d2l::nn
