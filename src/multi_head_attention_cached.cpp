// forward_cached and explain_path_cached: multi-head attention over a
// MultiHeadAttentionCache through the module's own checks and choice of path
// (select_multi_head), the small heads on the cache in place (Note [Cached
// keys and values] in multi_head_attention_cache_internal.h).

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "attention_weights.h"
#include "checks.h"
#include "cpu/kernel_args.h"
#include "cpu/multi_head_attention_kernel.h"
#include "dot_product_attention_internal.h"
#include "linear.h"
#include "multi_head_attention_cache_internal.h"
#include "multi_head_attention_internal.h"
#include "select.h"

namespace d2l {

using Access = detail::MultiHeadAttentionCacheAccess;

namespace {

// The multi-head call's options for the module (as forward makes them).
functional::MultiHeadAttentionFuncOptions call_options(const MultiHeadAttentionImpl& m,
                                                       const AttentionMask& mask,
                                                       bool need_weights) {
  return functional::MultiHeadAttentionFuncOptions(m.options.num_heads(), m.W_q->weight,
                                                   m.W_k->weight, m.W_v->weight, m.W_o->weight)
      .b_q(m.W_q->bias)
      .b_k(m.W_k->bias)
      .b_v(m.W_v->bias)
      .b_o(m.W_o->bias)
      .dropout(m.attention->dropout->options.p())
      .training(m.attention->dropout->is_training())
      .backend(m.attention->options.backend())
      .need_weights(need_weights)
      .mask(mask);
}

// A tensor of shape (B, m, features) in the weights' dtype and on their
// device, holding one element: what the plan reads of the keys and values.
torch::Tensor stand_in(const torch::Tensor& like, int64_t batch, int64_t m, int64_t features) {
  return torch::empty({1}, like.options()).expand({batch, m, features});
}

struct CachedPlan {
  detail::MultiHeadParams params;
  detail::MultiHeadSelection selection;
  functional::MultiHeadAttentionFuncOptions call;
};

// The checks of a cached call on queries and a cache of m keys (after the
// new ones), and the plan forward would make for keys of that shape.
CachedPlan plan_cached(const char* fn, const MultiHeadAttentionImpl& m,
                       const torch::Tensor& queries, int64_t batch, int64_t keys_held,
                       const AttentionMask& mask, bool grad, bool need_weights, bool explain) {
  detail::check_strided_layout(fn, "queries", queries);
  detail::check_floating(fn, "queries", queries, 3);
  TORCH_CHECK(keys_held > 0,
              fmt::format("{}: the cache holds no keys and no new_keys were given (queries {}): "
                          "fill it with extend_cache or project_memory, or pass new_keys and "
                          "new_values",
                          fn, detail::shape_of(queries)));
  TORCH_CHECK(queries.size(0) == batch,
              fmt::format("{}: queries must have the batch size of the cache and new_keys, {}, "
                          "got queries {}",
                          fn, batch, detail::shape_of(queries)));
  const auto& W = m.W_q->weight;
  CachedPlan r{{}, {}, call_options(m, mask, need_weights)};
  r.params = detail::checked_multi_head_params(
      fn, &m.options, queries, stand_in(W, batch, keys_held, m.options.key_size()),
      stand_in(W, batch, keys_held, m.options.value_size()), r.call);
  r.params.grad_through_cache = grad;
  r.selection = detail::select_multi_head(fn, r.params, explain);
  return r;
}

// Small heads on the cache in place (Note [Cached keys and values]).
std::tuple<torch::Tensor, torch::Tensor> small_heads_cached(const MultiHeadAttentionImpl& m,
                                                            const torch::Tensor& queries,
                                                            const MultiHeadAttentionCache& cache,
                                                            const detail::MultiHeadParams& plan,
                                                            bool need_weights) {
  const auto backend = m.attention->options.backend();
  const double p = m.attention->dropout->options.p();
  const bool drop = m.attention->dropout->is_training() && p > 0;
  const int64_t held = cache.size(), heads = plan.heads;
  auto keys = Access::keys(cache), values = Access::values(cache);
  if (drop && keys.size(1) != held) {
    keys = keys.narrow(1, 0, held).contiguous();
    values = values.narrow(1, 0, held).contiguous();
  }
  const int64_t capacity = keys.size(1);
  auto lens = detail::lengths_arg(plan.mask.lens);
  if (capacity != held) {
    lens = lens.numel() > 0 ? lens.clamp_max(held)
                            : torch::full({queries.size(0)}, held, torch::kLong);
  }
  // bfloat16 runs the heads in float, as the node does (Note [Small heads]).
  const auto q = detail::compute_type(detail::linear(queries, m.W_q->weight, m.W_q->bias, backend));
  keys = detail::compute_type(keys);
  values = detail::compute_type(values);
  const int64_t batch = queries.size(0), n = queries.size(1), h = q.size(2);
  const auto options = q.options();
  const auto noise = drop ? detail::dropout_noise({batch * heads, n, capacity}, p, options)
                          : torch::empty({0}, options);
  auto weights = torch::empty({batch * heads, n, capacity}, options);
  auto joined = torch::empty({batch, n, h}, options);
  const double scale = 1.0 / std::sqrt(static_cast<double>(h / heads));
  cpu::multi_head_attention_kernels().forward(q, keys, values, lens, noise, heads, scale, weights,
                                              joined);
  const auto type = queries.scalar_type();
  auto out =
      detail::linear(detail::as_dtype(joined, type), m.W_o->weight, m.W_o->bias, backend);
  if (!need_weights) return {std::move(out), torch::Tensor()};
  weights = detail::as_dtype(weights, type);
  return {std::move(out), capacity == held ? weights : weights.narrow(2, 0, held)};
}

// The per-head path on the filled rows (Note [Cached keys and values]).
std::tuple<torch::Tensor, torch::Tensor> per_head_cached(const torch::Tensor& queries,
                                                         const MultiHeadAttentionCache& cache,
                                                         const CachedPlan& c, bool need_weights) {
  const auto& o = c.call;
  const int64_t heads = c.params.heads, kv_heads = c.params.kv_heads;
  const auto q = detail::linear(queries, o.W_q(), o.b_q(), o.backend());
  auto [output, weights] = detail::grouped_heads_attention(
      {transpose_qkv(q, heads), transpose_qkv(cache.keys(), kv_heads),
       transpose_qkv(cache.values(), kv_heads), detail::per_head_mask(c.params), o.backend(),
       o.dropout(), o.training(), need_weights},
      heads / kv_heads, c.selection.per_head);
  return {detail::linear(transpose_output(output, heads), o.W_o(), o.b_o(), o.backend()),
          std::move(weights)};
}

// The checks both cached calls make before anything else, and what they
// read of the call: whether autograd records, the batch and the keys held
// once the new ones are appended.
struct CachedCallInputs {
  bool grad = false;
  int64_t batch = 0, held = 0;
};

CachedCallInputs check_cached_call(const char* fn, const MultiHeadAttentionImpl& m,
                                   const torch::Tensor& queries, const torch::Tensor& new_keys,
                                   const torch::Tensor& new_values,
                                   const MultiHeadAttentionCache& cache) {
  detail::check_cache_source(fn, m, cache);
  detail::check_new_keys_values(fn, m, new_keys, new_values, cache);
  return {detail::recording(m, {queries, new_keys, new_values, cache.keys()}),
          detail::batch_of(new_keys, cache),
          cache.size() + (new_keys.defined() ? new_keys.size(1) : 0)};
}

}  // namespace

torch::Tensor MultiHeadAttentionImpl::forward_cached(const torch::Tensor& queries,
                                                     const torch::Tensor& new_keys,
                                                     const torch::Tensor& new_values,
                                                     MultiHeadAttentionCache& cache,
                                                     const AttentionMask& mask) {
  constexpr const char* fn = "d2l::MultiHeadAttention::forward_cached";
  const auto [grad, batch, held] =
      check_cached_call(fn, *this, queries, new_keys, new_values, cache);
  const bool log = detail::logging_paths();
  const bool record = detail::records_weights(attention->options.record_attention_weights());
  // Checked before the cache changes: a refused call leaves it as it was.
  const auto c = plan_cached(fn, *this, queries, batch, held, mask, grad, record, log);
  if (new_keys.defined()) detail::extend_checked(*this, cache, new_keys, new_values, grad);
  torch::Tensor output, weights;
  if (c.selection.path == detail::MultiHeadPath::kSmallHeads) {
    if (log) detail::log_path(fn, c.call.backend(), "small_heads", {});
    std::tie(output, weights) = small_heads_cached(*this, queries, cache, c.params, record);
  } else {
    if (log) {
      detail::log_path(fn, c.call.backend(), detail::to_string(c.selection.per_head),
                       c.selection.reasons);
    }
    std::tie(output, weights) = per_head_cached(queries, cache, c, record);
  }
  if (record) detail::record_weights(attention->attention_weights, std::move(weights));
  return output;
}

PathExplanation MultiHeadAttentionImpl::explain_path_cached(const torch::Tensor& queries,
                                                            const torch::Tensor& new_keys,
                                                            const torch::Tensor& new_values,
                                                            const MultiHeadAttentionCache& cache,
                                                            const AttentionMask& mask) const {
  constexpr const char* fn = "d2l::MultiHeadAttention::forward_cached";
  const auto [grad, batch, held] =
      check_cached_call(fn, *this, queries, new_keys, new_values, cache);
  const auto c =
      plan_cached(fn, *this, queries, batch, held, mask, grad,
                  detail::records_weights(attention->options.record_attention_weights()), true);
  auto selection = c.selection;
  const bool small = selection.path == detail::MultiHeadPath::kSmallHeads;
  return {fn, c.call.backend(), small ? "small_heads" : detail::to_string(selection.per_head),
          std::move(selection.reasons)};
}

}  // namespace d2l
