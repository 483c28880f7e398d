// Multi-head attention over keys and values projected once: the cache, its
// growth, and forward_cached through multi-head attention's own checks and
// choice of path (select_multi_head).

#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "attention_weights.h"
#include "checks.h"
#include "cpu/kernel_args.h"
#include "cpu/multi_head_attention_kernel.h"
#include "dot_product_attention_internal.h"
#include "linear.h"
#include "multi_head_attention_internal.h"
#include "select.h"

// Note [Cached keys and values]
// A decoder attends at every step over the keys and values of all its steps
// so far, and over the encoder's outputs, which stay the same for a whole
// decoding. forward projects its keys and values at every call; a
// MultiHeadAttentionCache holds them projected, (B, capacity, h) with the
// heads side by side, as W_k and W_v give them, and forward_cached projects
// only the new ones into the rows after the last (the buffers doubling when
// full). The heads are then attended as forward attends them, after the same
// checks and the same choice of path, with the cached keys standing in for
// the projections of the keys:
//
// * small heads (Note [Small heads]) run the small-head kernels on the whole
//   buffer in place: the kernels read each head's keys at a row stride of h
//   and never read a key past a row's length, so the lengths (those of the
//   masks, clamped to the keys held, or the keys held) keep the unfilled rows
//   out, and nothing of the past is copied. With dropout in training the
//   filled rows are made contiguous first, so that the dropout draws the
//   random numbers the other paths draw for (B · heads, n, m) weights.
// * otherwise the filled rows are split into heads (a copy: the per-head
//   paths take (B · heads, m, d)) and run dot-product attention per head.
//
// The masks are checked and resolved against the queries and m keys as
// forward resolves them; what they resolve to does not depend on the keys'
// values, so stand-ins of the keys' shape (one element, expanded) serve.
// With autograd recording, a buffer written in place would invalidate the
// graphs of earlier calls that saved views of it: the cache then grows by
// concatenation, and the heads take the per-head path, whose autograd
// differentiates the cached projections (the small-head node differentiates
// from the raw keys and values, which a cache no longer has).

namespace d2l {
namespace detail {

struct MultiHeadAttentionCacheAccess {
  static torch::Tensor& keys(MultiHeadAttentionCache& c) { return c.keys_; }
  static torch::Tensor& values(MultiHeadAttentionCache& c) { return c.values_; }
  static const torch::Tensor& keys(const MultiHeadAttentionCache& c) { return c.keys_; }
  static const torch::Tensor& values(const MultiHeadAttentionCache& c) { return c.values_; }
  static int64_t& length(MultiHeadAttentionCache& c) { return c.length_; }
  static std::vector<std::pair<torch::Tensor, int64_t>>& sources(MultiHeadAttentionCache& c) {
    return c.sources_;
  }
  static const std::vector<std::pair<torch::Tensor, int64_t>>& sources(
      const MultiHeadAttentionCache& c) {
    return c.sources_;
  }
};

}  // namespace detail

using Access = detail::MultiHeadAttentionCacheAccess;

torch::Tensor MultiHeadAttentionCache::keys() const {
  return length_ > 0 ? keys_.narrow(1, 0, length_) : torch::Tensor();
}

torch::Tensor MultiHeadAttentionCache::values() const {
  return length_ > 0 ? values_.narrow(1, 0, length_) : torch::Tensor();
}

MultiHeadAttentionCache MultiHeadAttentionCache::clone() const {
  MultiHeadAttentionCache copy = *this;
  if (keys_.defined()) {
    copy.keys_ = keys_.clone();
    copy.values_ = values_.clone();
  }
  return copy;
}

void MultiHeadAttentionCache::clear() { *this = MultiHeadAttentionCache(); }

namespace {

// The parameters whose values the cached projections depend on.
std::vector<torch::Tensor> projection_parameters(const MultiHeadAttentionImpl& m) {
  std::vector<torch::Tensor> p{m.W_k->weight, m.W_v->weight};
  if (m.W_k->bias.defined()) p.push_back(m.W_k->bias);
  if (m.W_v->bias.defined()) p.push_back(m.W_v->bias);
  return p;
}

// Autograd records this call: gradients may flow into the cache's graph.
bool recording(const MultiHeadAttentionImpl& m, std::initializer_list<torch::Tensor> inputs) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  for (const auto& p : m.parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

// The cache against the module: filled by its W_k and W_v as they are now.
void check_cache_source(const char* fn, const MultiHeadAttentionImpl& m,
                        const MultiHeadAttentionCache& cache) {
  if (cache.empty()) return;
  const auto& sources = Access::sources(cache);
  const auto params = projection_parameters(m);
  bool same = sources.size() == params.size();
  bool unchanged = true;
  for (size_t i = 0; same && i < params.size(); ++i) {
    same = sources[i].first.is_same(params[i]);
    unchanged = unchanged && sources[i].second == params[i]._version();
  }
  TORCH_CHECK(same, fmt::format("{}: cache was filled by another MultiHeadAttention (its keys and "
                                "values were projected by other W_k and W_v)",
                                fn));
  TORCH_CHECK(unchanged, fmt::format("{}: cache was filled before this module's W_k or W_v "
                                     "changed (an optimizer step, load, to); clear() it and fill "
                                     "it again",
                                     fn));
}

// new_keys (B, s, key_size) and new_values (B, s, value_size), both or neither,
// for a cache of B entries (if filled) in the weights' dtype and device.
void check_new_keys_values(const char* fn, const MultiHeadAttentionImpl& m,
                           const torch::Tensor& new_keys, const torch::Tensor& new_values,
                           const MultiHeadAttentionCache& cache, const char* keys_name = "new_keys",
                           const char* values_name = "new_values") {
  detail::check_strided_layout(fn, keys_name, new_keys);
  detail::check_strided_layout(fn, values_name, new_values);
  TORCH_CHECK(new_keys.defined() == new_values.defined(),
              fmt::format("{}: {} and {} must be given together (or both left undefined), got "
                          "{} {} and {} {}",
                          fn, keys_name, values_name, keys_name, detail::shape_of(new_keys),
                          values_name, detail::shape_of(new_values)));
  if (!new_keys.defined()) return;
  const auto& o = m.options;
  detail::check_floating(fn, keys_name, new_keys, 3);
  detail::check_floating(fn, values_name, new_values, 3);
  TORCH_CHECK(new_keys.size(0) == new_values.size(0) && new_keys.size(1) == new_values.size(1) &&
                  new_keys.size(2) == o.key_size() && new_values.size(2) == o.value_size(),
              fmt::format("{}: {} must have shape [batch_size, s, key_size={}] and {} "
                          "[batch_size, s, value_size={}], got {} {} and {} {}",
                          fn, keys_name, o.key_size(), values_name, o.value_size(), keys_name,
                          detail::shape_of(new_keys), values_name, detail::shape_of(new_values)));
  const auto& W = m.W_k->weight;
  detail::check_same_dtype(fn, "W_k.weight", W, keys_name, new_keys);
  detail::check_same_dtype(fn, "W_k.weight", W, values_name, new_values);
  detail::check_same_device(fn, "W_k.weight", W, keys_name, new_keys);
  detail::check_same_device(fn, "W_k.weight", W, values_name, new_values);
  TORCH_CHECK(cache.empty() || Access::keys(cache).size(0) == new_keys.size(0),
              fmt::format("{}: {} must have the cache's batch size, got {} {} and a cache of "
                          "keys {}",
                          fn, keys_name, keys_name, detail::shape_of(new_keys),
                          detail::shape_of(cache.keys())));
}

// The batch size of a call: the new keys', else the cache's (0 when empty).
int64_t batch_of(const torch::Tensor& new_keys, const MultiHeadAttentionCache& cache) {
  if (new_keys.defined()) return new_keys.size(0);
  return cache.empty() ? 0 : Access::keys(cache).size(0);
}

// A buffer of `capacity` rows along dim 1 holding the first `length` rows of `old`.
torch::Tensor regrow(const torch::Tensor& old, const torch::Tensor& like, int64_t length,
                     int64_t capacity) {
  auto grown = torch::empty({like.size(0), capacity, like.size(2)}, like.options());
  if (length > 0) grown.narrow(1, 0, length).copy_(old.narrow(1, 0, length));
  return grown;
}

// Appends projected keys and values k, v (B, s, h): in place, doubling the
// buffers when full; by concatenation when autograd records.
void append(MultiHeadAttentionCache& cache, const torch::Tensor& k, const torch::Tensor& v,
            bool grad) {
  auto& keys = Access::keys(cache);
  auto& values = Access::values(cache);
  auto& length = Access::length(cache);
  const int64_t steps = k.size(1), needed = length + steps;
  if (length == 0) {
    // The projections are new tensors of their own: the first buffers.
    keys = k.contiguous();
    values = v.contiguous();
    length = steps;
    return;
  }
  if (grad) {
    keys = torch::cat({keys.narrow(1, 0, length), k}, 1);
    values = torch::cat({values.narrow(1, 0, length), v}, 1);
    length = needed;
    return;
  }
  if (needed > keys.size(1)) {
    const int64_t capacity = std::max<int64_t>({needed, 2 * keys.size(1), 8});
    keys = regrow(keys, k, length, capacity);
    values = regrow(values, v, length, capacity);
  }
  keys.narrow(1, length, steps).copy_(k);
  values.narrow(1, length, steps).copy_(v);
  length = needed;
}

void record_sources(MultiHeadAttentionCache& cache, const MultiHeadAttentionImpl& m) {
  auto& sources = Access::sources(cache);
  sources.clear();
  for (const auto& p : projection_parameters(m)) sources.emplace_back(p, p._version());
}

// Projects and appends, after the checks.
void extend_checked(MultiHeadAttentionImpl& m, MultiHeadAttentionCache& cache,
                    const torch::Tensor& keys, const torch::Tensor& values, bool grad) {
  const auto backend = m.attention->options.backend();
  const auto k = detail::linear(keys, m.W_k->weight, m.W_k->bias, backend);
  const auto v = detail::linear(values, m.W_v->weight, m.W_v->bias, backend);
  if (cache.empty()) record_sources(cache, m);
  append(cache, k, v, grad);
}

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
  const auto q = detail::linear(queries, m.W_q->weight, m.W_q->bias, backend).contiguous();
  const int64_t batch = queries.size(0), n = queries.size(1), h = q.size(2);
  const auto options = q.options();
  const auto noise =
      drop ? detail::dropout_noise({batch * heads, n, capacity}, p, options) : torch::empty({0}, options);
  auto weights = torch::empty({batch * heads, n, capacity}, options);
  auto joined = torch::empty({batch, n, h}, options);
  const double scale = 1.0 / std::sqrt(static_cast<double>(h / heads));
  cpu::multi_head_attention_kernels().forward(q, keys, values, lens, noise, heads, scale, weights,
                                              joined);
  auto out = detail::linear(joined, m.W_o->weight, m.W_o->bias, backend);
  if (!need_weights) return {std::move(out), torch::Tensor()};
  return {std::move(out), capacity == held ? weights : weights.narrow(2, 0, held)};
}

// The per-head path on the filled rows (Note [Cached keys and values]).
std::tuple<torch::Tensor, torch::Tensor> per_head_cached(const torch::Tensor& queries,
                                                         const MultiHeadAttentionCache& cache,
                                                         const CachedPlan& c, bool need_weights) {
  const auto& o = c.call;
  const int64_t heads = c.params.heads;
  const auto q = detail::linear(queries, o.W_q(), o.b_q(), o.backend());
  auto [output, weights] = detail::run_dot_product_attention(
      {transpose_qkv(q, heads), transpose_qkv(cache.keys(), heads),
       transpose_qkv(cache.values(), heads), detail::per_head_mask(c.params), o.backend(),
       o.dropout(), o.training(), need_weights},
      c.selection.per_head);
  return {detail::linear(transpose_output(output, heads), o.W_o(), o.b_o(), o.backend()),
          std::move(weights)};
}

}  // namespace

void MultiHeadAttentionImpl::extend_cache(MultiHeadAttentionCache& cache, const torch::Tensor& keys,
                                          const torch::Tensor& values) {
  constexpr const char* fn = "d2l::MultiHeadAttention::extend_cache";
  check_cache_source(fn, *this, cache);
  check_new_keys_values(fn, *this, keys, values, cache, "keys", "values");
  TORCH_CHECK(keys.defined(), fmt::format("{}: keys and values must be defined", fn));
  extend_checked(*this, cache, keys, values, recording(*this, {keys, values, cache.keys()}));
}

MultiHeadAttentionCache MultiHeadAttentionImpl::project_memory(const torch::Tensor& keys,
                                                               const torch::Tensor& values) {
  constexpr const char* fn = "d2l::MultiHeadAttention::project_memory";
  MultiHeadAttentionCache cache;
  check_new_keys_values(fn, *this, keys, values, cache, "keys", "values");
  TORCH_CHECK(keys.defined(), fmt::format("{}: keys and values must be defined", fn));
  extend_checked(*this, cache, keys, values, recording(*this, {keys, values}));
  return cache;
}

torch::Tensor MultiHeadAttentionImpl::forward_cached(const torch::Tensor& queries,
                                                     const torch::Tensor& new_keys,
                                                     const torch::Tensor& new_values,
                                                     MultiHeadAttentionCache& cache,
                                                     const AttentionMask& mask) {
  constexpr const char* fn = "d2l::MultiHeadAttention::forward_cached";
  check_cache_source(fn, *this, cache);
  check_new_keys_values(fn, *this, new_keys, new_values, cache);
  const bool grad = recording(*this, {queries, new_keys, new_values, cache.keys()});
  const int64_t batch = batch_of(new_keys, cache);
  const int64_t held = cache.size() + (new_keys.defined() ? new_keys.size(1) : 0);
  const bool log = detail::logging_paths();
  const bool record = attention->options.record_attention_weights();
  // Checked before the cache changes: a refused call leaves it as it was.
  const auto c = plan_cached(fn, *this, queries, batch, held, mask, grad, record, log);
  if (new_keys.defined()) extend_checked(*this, cache, new_keys, new_values, grad);
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
  check_cache_source(fn, *this, cache);
  check_new_keys_values(fn, *this, new_keys, new_values, cache);
  const bool grad = recording(*this, {queries, new_keys, new_values, cache.keys()});
  const int64_t batch = batch_of(new_keys, cache);
  const int64_t held = cache.size() + (new_keys.defined() ? new_keys.size(1) : 0);
  const auto c = plan_cached(fn, *this, queries, batch, held, mask, grad,
                             attention->options.record_attention_weights(), true);
  auto selection = c.selection;
  const bool small = selection.path == detail::MultiHeadPath::kSmallHeads;
  return {fn, c.call.backend(), small ? "small_heads" : detail::to_string(selection.per_head),
          std::move(selection.reasons)};
}

}  // namespace d2l
