// d2l::nn::MultiheadAttention's argument checks (every one before any
// computation, naming the function, the argument and the shapes) and the
// reading of its masks: float masks of 0 and -inf are boolean masks, any
// other float mask sends the call to the additive path (docs/nn.md).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <vector>

#include "checks.h"
#include "nn/multihead_attention_internal.h"

namespace d2l::nn::impl {
namespace {

using d2l::detail::shape_of;
namespace detail = d2l::detail;

std::string layout_name(bool batch_first, const char* seq) {
  return batch_first ? fmt::format("(N, {}, features)", seq)
                     : fmt::format("({}, N, features)", seq);
}

void check_weight(const char* fn, const char* name, const torch::Tensor& W, int64_t rows,
                  int64_t cols, const torch::Tensor& query) {
  detail::check_floating(fn, name, W, 2);
  TORCH_CHECK(
      W.size(0) == rows && W.size(1) == cols,
      fmt::format("{}: {} must have shape [{}, {}], got {}", fn, name, rows, cols, shape_of(W)));
  detail::check_same_device(fn, "query", query, name, W);
  detail::check_same_dtype(fn, "query", query, name, W);
}

void check_vector(const char* fn, const char* name, const torch::Tensor& b,
                  std::vector<int64_t> shape, const torch::Tensor& query) {
  if (!b.defined()) return;
  detail::check_strided_layout(fn, name, b);
  TORCH_CHECK(b.sizes() == c10::IntArrayRef(shape),
              fmt::format("{}: {} must have shape [{}] or be undefined, got {}", fn, name,
                          fmt::join(shape, ", "), shape_of(b)));
  detail::check_same_device(fn, "query", query, name, b);
  detail::check_same_dtype(fn, "query", query, name, b);
}

// A mask's dtype (torch::kBool or floating) and device; its rank and shape
// are the caller's.
void check_mask_kind(const char* fn, const char* name, const torch::Tensor& mask,
                     const torch::Tensor& query) {
  detail::check_strided_layout(fn, name, mask);
  TORCH_CHECK(mask.scalar_type() == torch::kBool || at::isFloatingType(mask.scalar_type()),
              fmt::format("{}: {} must be torch::kBool (true: not allowed) or floating (added to "
                          "the scores), got {} {}",
                          fn, name, c10::toString(mask.scalar_type()), shape_of(mask)));
  detail::check_same_device(fn, "query", query, name, mask);
}

// query, key and value: 3-D, floating, one dtype and device, matching sizes.
Sizes check_inputs(const char* fn, const torch::Tensor& query, const torch::Tensor& key,
                   const torch::Tensor& value,
                   const functional::MultiheadAttentionForwardFuncOptions& o) {
  const bool bf = o.batch_first();
  const auto expect = [&](const char* name, const torch::Tensor& t, const char* seq) {
    TORCH_CHECK(t.defined(), fmt::format("{}: {} must be a defined tensor", fn, name));
    detail::check_strided_layout(fn, name, t);
    TORCH_CHECK(t.dim() == 3, fmt::format("{}: {} must be a 3-D tensor {}, got {}", fn, name,
                                          layout_name(bf, seq), shape_of(t)));
    TORCH_CHECK(at::isFloatingType(t.scalar_type()),
                fmt::format("{}: {} must have a floating-point dtype, got {}", fn, name,
                            c10::toString(t.scalar_type())));
  };
  expect("query", query, "L");
  expect("key", key, "S");
  expect("value", value, "S");
  detail::check_same_device(fn, "query", query, "key", key);
  detail::check_same_device(fn, "query", query, "value", value);
  detail::check_same_dtype(fn, "query", query, "key", key);
  detail::check_same_dtype(fn, "query", query, "value", value);
  const int64_t seq = bf ? 1 : 0, batch = bf ? 0 : 1;
  Sizes s{query.size(seq), key.size(seq), query.size(batch), query.size(2)};
  TORCH_CHECK(key.size(batch) == s.N && value.size(batch) == s.N,
              fmt::format("{}: query, key and value must have the same batch size (dim {}), got "
                          "query {}, key {} and value {}",
                          fn, batch, shape_of(query), shape_of(key), shape_of(value)));
  TORCH_CHECK(value.size(seq) == s.S,
              fmt::format("{}: key and value must have the same sequence length (dim {}), got "
                          "key {} and value {}",
                          fn, seq, shape_of(key), shape_of(value)));
  return s;
}

// The projections, bias_k/bias_v and dropout against embed_dim and the inputs.
void check_weights(const char* fn, const Sizes& s, const torch::Tensor& query,
                   const torch::Tensor& key, const torch::Tensor& value,
                   const functional::MultiheadAttentionForwardFuncOptions& o) {
  const int64_t E = o.embed_dim_to_check(), heads = o.num_heads();
  TORCH_CHECK(s.E == E, fmt::format("{}: query must have embed_dim={} features, got query {}", fn,
                                    E, shape_of(query)));
  TORCH_CHECK(heads > 0 && E % heads == 0,
              fmt::format("{}: embed_dim must be divisible by num_heads, got embed_dim={} and "
                          "num_heads={}",
                          fn, E, heads));
  if (o.use_separate_proj_weight()) {
    check_weight(fn, "q_proj_weight", o.q_proj_weight(), E, E, query);
    check_weight(fn, "k_proj_weight", o.k_proj_weight(), E, key.size(2), query);
    check_weight(fn, "v_proj_weight", o.v_proj_weight(), E, value.size(2), query);
  } else {
    TORCH_CHECK(key.size(2) == E && value.size(2) == E,
                fmt::format("{}: key and value must have embed_dim={} features when the "
                            "projections are in_proj_weight (kdim == vdim == embed_dim), got key "
                            "{} and value {}",
                            fn, E, shape_of(key), shape_of(value)));
    check_weight(fn, "in_proj_weight", o.in_proj_weight(), 3 * E, E, query);
  }
  check_vector(fn, "in_proj_bias", o.in_proj_bias(), {3 * E}, query);
  check_weight(fn, "out_proj.weight", o.out_proj_weight(), E, E, query);
  check_vector(fn, "out_proj.bias", o.out_proj_bias(), {E}, query);
  TORCH_CHECK(o.bias_k().defined() == o.bias_v().defined(),
              fmt::format("{}: bias_k and bias_v must be both defined or both undefined, got "
                          "bias_k {} and bias_v {}",
                          fn, shape_of(o.bias_k()), shape_of(o.bias_v())));
  check_vector(fn, "bias_k", o.bias_k(), {1, 1, E}, query);
  check_vector(fn, "bias_v", o.bias_v(), {1, 1, E}, query);
  detail::check_dropout(fn, o.dropout_p());
}

// The masks' dtypes, ranks, shapes and devices, and is_causal's S >= L.
void check_masks(const char* fn, const Sizes& s, const torch::Tensor& query,
                 const torch::Tensor& key,
                 const functional::MultiheadAttentionForwardFuncOptions& o) {
  const int64_t heads = o.num_heads();
  if (const auto& kpm = o.key_padding_mask(); kpm.defined()) {
    check_mask_kind(fn, "key_padding_mask", kpm, query);
    TORCH_CHECK(kpm.dim() == 2 && kpm.size(0) == s.N && kpm.size(1) == s.S,
                fmt::format("{}: key_padding_mask must have shape [N, S] = [{}, {}] for query {} "
                            "and key {}, got {}",
                            fn, s.N, s.S, shape_of(query), shape_of(key), shape_of(kpm)));
  }
  if (const auto& am = o.attn_mask(); am.defined()) {
    check_mask_kind(fn, "attn_mask", am, query);
    const bool two = am.dim() == 2 && am.size(0) == s.L && am.size(1) == s.S;
    const bool three =
        am.dim() == 3 && am.size(0) == s.N * heads && am.size(1) == s.L && am.size(2) == s.S;
    TORCH_CHECK(two || three,
                fmt::format("{}: attn_mask must have shape [L, S] = [{}, {}] or [N * num_heads, "
                            "L, S] = [{}, {}, {}] for query {}, key {} and num_heads={}, got {}",
                            fn, s.L, s.S, s.N * heads, s.L, s.S, shape_of(query), shape_of(key),
                            heads, shape_of(am)));
  }
  TORCH_CHECK(!o.is_causal() || s.S >= s.L,
              fmt::format("{}: is_causal needs at least as many keys as queries (query i sees "
                          "keys j <= i + S - L), got L={} and S={}",
                          fn, s.L, s.S));
}

Sizes check_call(const char* fn, const torch::Tensor& query, const torch::Tensor& key,
                 const torch::Tensor& value,
                 const functional::MultiheadAttentionForwardFuncOptions& o) {
  const auto s = check_inputs(fn, query, key, value, o);
  check_weights(fn, s, query, key, value, o);
  check_masks(fn, s, query, key, o);
  return s;
}

ReadMask read_mask(const char* fn, const char* name, const torch::Tensor& mask,
                   torch::ScalarType dtype) {
  if (!mask.defined()) return {};
  if (mask.scalar_type() == torch::kBool) return {mask, {}};
  const auto minus_inf = mask == -std::numeric_limits<double>::infinity();
  TORCH_CHECK(
      !torch::logical_or(torch::isnan(mask), mask == std::numeric_limits<double>::infinity())
           .any()
           .item<bool>(),
      fmt::format("{}: {} must not hold NaN or +inf (a float mask is added to the "
                  "scores), got {} {}",
                  fn, name, c10::toString(mask.scalar_type()), shape_of(mask)));
  // A float mask that autograd differentiates (a learned bias) is data,
  // whatever its values now: read as a boolean mask it would get no gradient.
  const bool learned = mask.requires_grad() && torch::GradMode::is_enabled();
  if (!learned && torch::logical_or(minus_inf, mask == 0).all().item<bool>()) {
    return {minus_inf, {}};
  }
  return {{}, mask.to(dtype)};
}

}  // namespace

Plan plan_call(const char* fn, const torch::Tensor& query, const torch::Tensor& key,
               const torch::Tensor& value,
               const functional::MultiheadAttentionForwardFuncOptions& o) {
  Plan p;
  p.s = check_call(fn, query, key, value, o);
  const auto dtype = query.scalar_type();
  p.kpm = read_mask(fn, "key_padding_mask", o.key_padding_mask(), dtype);
  p.attn = read_mask(fn, "attn_mask", o.attn_mask(), dtype);
  if (p.kpm.additive.defined() || p.attn.additive.defined()) {
    p.why_additive = "a float mask with values other than 0 and -inf, or one that requires grad";
  } else if (o.bias_k().defined() || o.add_zero_attn()) {
    p.why_additive = "add_bias_kv / add_zero_attn append a key and value row";
  }
  p.additive = !p.why_additive.empty();
  const int64_t E = p.s.E;
  if (o.use_separate_proj_weight()) {
    p.W_q = o.q_proj_weight();
    p.W_k = o.k_proj_weight();
    p.W_v = o.v_proj_weight();
  } else {
    p.W_q = o.in_proj_weight().narrow(0, 0, E);
    p.W_k = o.in_proj_weight().narrow(0, E, E);
    p.W_v = o.in_proj_weight().narrow(0, 2 * E, E);
  }
  if (o.in_proj_bias().defined()) {
    p.b_q = o.in_proj_bias().narrow(0, 0, E);
    p.b_k = o.in_proj_bias().narrow(0, E, E);
    p.b_v = o.in_proj_bias().narrow(0, 2 * E, E);
  }
  return p;
}

}  // namespace d2l::nn::impl
