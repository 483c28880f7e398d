// Multi-head attention's checks and what decides its path: the arguments
// against each other (and against a module's options) and the masks
// resolved once per batch entry (select_multi_head in select.cpp chooses).

#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include "attention_mask_internal.h"
#include "checks.h"
#include "multi_head_attention_internal.h"

namespace d2l::detail {
namespace {

// A projection's weight (h, in) and optional bias (h), on the queries' device
// and in their dtype.
void check_projection(const char* fn, const char* name, const torch::Tensor& W,
                      const char* bias_name, const torch::Tensor& b, int64_t h, int64_t in,
                      const torch::Tensor& queries) {
  check_strided_layout(fn, name, W);
  check_strided_layout(fn, bias_name, b);
  check_floating(fn, name, W, 2);
  TORCH_CHECK(W.size(0) == h && W.size(1) == in,
              fmt::format("{}: {} must have shape [{}, {}], got {}", fn, name, h, in, shape_of(W)));
  check_same_device(fn, "queries", queries, name, W);
  check_same_dtype(fn, "queries", queries, name, W);
  if (!b.defined()) return;
  TORCH_CHECK(b.dim() == 1 && b.size(0) == h,
              fmt::format("{}: {} must have shape [{}] or be undefined, got {}", fn, bias_name, h,
                          shape_of(b)));
  check_same_device(fn, "queries", queries, bias_name, b);
  check_same_dtype(fn, "queries", queries, bias_name, b);
}

// The key/value heads W_k's rows make: num_heads for h rows, or g for
// h / num_heads · g rows with g dividing num_heads (grouped-query heads;
// check_projection then holds W_v to the same); where W_k's rows make
// neither, num_heads, and check_projection refuses W_k for not having h.
int64_t grouped_kv_heads(const char* fn, const functional::MultiHeadAttentionFuncOptions& o,
                         int64_t h, int64_t heads) {
  check_strided_layout(fn, "W_k", o.W_k());
  check_floating(fn, "W_k", o.W_k(), 2);
  const int64_t rows = o.W_k().size(0), d = h / heads;
  if (rows == h || rows == 0 || rows % d != 0) return heads;
  const int64_t g = rows / d;
  TORCH_CHECK(heads % g == 0,
              fmt::format("{}: W_k and W_v must have num_hiddens={} rows, or num_hiddens / "
                          "num_heads = {} times a number of key/value heads that divides "
                          "num_heads={} (grouped-query heads), got W_k {}",
                          fn, h, d, heads, shape_of(o.W_k())));
  return g;
}

// The module's own checks: its inputs against its options, in its words.
void check_module_inputs(const char* fn, const MultiHeadAttentionOptions& options,
                         const torch::Tensor& queries, const torch::Tensor& keys,
                         const torch::Tensor& values, const torch::Tensor& W_q) {
  const auto features_ok = [&](const torch::Tensor& t, int64_t size) { return t.size(2) == size; };
  TORCH_CHECK(features_ok(queries, options.query_size()) && features_ok(keys, options.key_size()) &&
                  features_ok(values, options.value_size()),
              fmt::format("{}: queries, keys and values must have query_size={}, key_size={} and "
                          "value_size={} features, got queries {}, keys {} and values {}",
                          fn, options.query_size(), options.key_size(), options.value_size(),
                          shape_of(queries), shape_of(keys), shape_of(values)));
  check_same_device(fn, "W_q.weight", W_q, "queries", queries);
  check_same_dtype(fn, "W_q.weight", W_q, "queries", queries);
}

}  // namespace

MultiHeadParams checked_multi_head_params(const char* fn,
                                          const MultiHeadAttentionOptions* module_options,
                                          const torch::Tensor& queries, const torch::Tensor& keys,
                                          const torch::Tensor& values,
                                          const functional::MultiHeadAttentionFuncOptions& o) {
  const auto& valid_lens = o.valid_lens();
  check_strided_layout(fn, "queries", queries);
  check_strided_layout(fn, "keys", keys);
  check_strided_layout(fn, "values", values);
  check_strided_layout(fn, "valid_lens", valid_lens);
  auto range = check_qkv(fn, queries, keys, values, valid_lens);
  if (module_options != nullptr) {
    check_module_inputs(fn, *module_options, queries, keys, values, o.W_q());
  }
  const int64_t heads = o.num_heads();
  TORCH_CHECK(heads > 0, fmt::format("{}: num_heads must be positive, got {}", fn, heads));
  check_strided_layout(fn, "W_q", o.W_q());
  check_floating(fn, "W_q", o.W_q(), 2);
  const int64_t h = o.W_q().size(0);
  TORCH_CHECK(h > 0, fmt::format("{}: the projections must have at least one output feature (the "
                                 "rows of W_q, num_hiddens), got W_q {}",
                                 fn, shape_of(o.W_q())));
  TORCH_CHECK(h % heads == 0,
              fmt::format("{}: num_hiddens (the rows of W_q) must be divisible by num_heads, got "
                          "W_q {} and num_heads={}",
                          fn, shape_of(o.W_q()), heads));
  const int64_t kv_heads = grouped_kv_heads(fn, o, h, heads);
  const int64_t kv_rows = h / heads * kv_heads;
  check_projection(fn, "W_q", o.W_q(), "b_q", o.b_q(), h, queries.size(2), queries);
  check_projection(fn, "W_k", o.W_k(), "b_k", o.b_k(), kv_rows, keys.size(2), queries);
  check_projection(fn, "W_v", o.W_v(), "b_v", o.b_v(), kv_rows, values.size(2), queries);
  check_projection(fn, "W_o", o.W_o(), "b_o", o.b_o(), h, h, queries);
  check_dropout(fn, o.dropout());
  check_masks(fn, o.mask(), queries, keys, heads);
  const int64_t batch = queries.size(0), n = queries.size(1), m = keys.size(1);
  MultiHeadParams params;
  params.queries = queries;
  params.keys = keys;
  params.values = values;
  params.heads = heads;
  params.kv_heads = kv_heads;
  params.head_features = h / heads;
  params.backend = o.backend();
  params.dropout = o.dropout();
  params.training = o.training();
  params.need_weights = o.need_weights();
  // Head b * heads + i belongs to batch element b. The masks resolve once per
  // batch element, unless attn_mask gives each head its own; then the
  // lengths and the key-padding rows are repeated per head first.
  const auto& am = o.attn_mask();
  params.mask_per_head = heads > 1 && am.defined() && am.dim() == 3 && am.size(0) == batch * heads;
  if (params.mask_per_head) {
    auto per_head = o.mask();
    const auto repeat = [heads](const torch::Tensor& t) {
      return t.defined() ? t.repeat_interleave(heads, 0) : t;
    };
    per_head.valid_lens(repeat(valid_lens)).key_padding_mask(repeat(o.key_padding_mask()));
    // Repeating the lengths keeps their range: the check above stands for them.
    if (range && range->on_host.defined()) range->on_host = repeat(range->on_host);
    params.mask = resolve_masks(fn, per_head, range, batch * heads, n, m, queries.device());
  } else {
    params.mask = resolve_masks(fn, o.mask(), range, batch, n, m, queries.device());
  }
  return params;
}

}  // namespace d2l::detail
