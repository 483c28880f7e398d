// Multi-head attention's checks and its choice of path: the arguments
// against each other (and against a module's options), the masks resolved
// once per batch entry, and whether the heads are small enough for the
// one-node kernels (Note [Small heads]).

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

// Why the heads of this call do not run as one node (Note [Small heads]), or
// empty when they do.
std::string why_not_small_heads(const torch::Tensor& queries, const torch::Tensor& keys,
                                const functional::MultiHeadAttentionFuncOptions& o,
                                const ResolvedMask& mask) {
  const auto backend = o.backend();
  if (backend == AttentionBackend::kComposite) {
    return "AttentionBackend::kComposite asks for the book's ops";
  }
  if (backend == AttentionBackend::kSdpa) return "AttentionBackend::kSdpa asks for SDPA per head";
  if (!queries.device().is_cpu()) {
    return fmt::format("tensors on {} (the kernels run on the CPU)", queries.device().str());
  }
  if (mask.allowed.defined()) {
    return mask.general_because + " (the kernels mask by lengths)";
  }
  const auto type = queries.scalar_type();
  if (type != torch::kFloat && type != torch::kDouble) {
    return fmt::format("dtype {} (the kernels run in float or double)", c10::toString(type));
  }
  const int64_t n = queries.size(1), m = keys.size(1);
  if (queries.size(0) == 0 || n == 0 || m == 0) return "a size is zero";
  const int64_t d = o.W_q().size(0) / o.num_heads();
  if (!small_heads(n, m, d)) {
    return fmt::format(
        "heads of {} queries x {} keys x {} features (the kernels take up to 64 x 64 pairs "
        "with at most 16 features, 32 x 32 with more)",
        n, m, d);
  }
  return {};
}

}  // namespace

// functional::multi_head_attention's checks, with messages naming `fn` (the
// function or the module that was called; a module passes its options,
// checked after the inputs' own shapes), and its plan.
MultiHeadPlan plan_multi_head_attention(
    const char* fn, const MultiHeadAttentionOptions* module_options, const torch::Tensor& queries,
    const torch::Tensor& keys, const torch::Tensor& values, const torch::Tensor& valid_lens,
    const functional::MultiHeadAttentionFuncOptions& o, bool explain) {
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
  check_projection(fn, "W_q", o.W_q(), "b_q", o.b_q(), h, queries.size(2), queries);
  check_projection(fn, "W_k", o.W_k(), "b_k", o.b_k(), h, keys.size(2), queries);
  check_projection(fn, "W_v", o.W_v(), "b_v", o.b_v(), h, values.size(2), queries);
  check_projection(fn, "W_o", o.W_o(), "b_o", o.b_o(), h, h, queries);
  check_dropout(fn, o.dropout());
  Masks masks{o.key_padding_mask(), o.attn_mask(), o.is_causal()};
  check_masks(fn, masks, queries, keys, heads);
  const int64_t batch = queries.size(0), n = queries.size(1), m = keys.size(1);
  MultiHeadPlan plan;
  plan.heads = heads;
  // Head b * heads + i belongs to batch element b. The masks resolve once per
  // batch element, unless attn_mask gives each head its own; then every
  // length and mask row is repeated per head first.
  plan.mask_per_head =
      heads > 1 && masks.attn_mask.dim() == 3 && masks.attn_mask.size(0) == batch * heads;
  auto lens = valid_lens;
  if (plan.mask_per_head) {
    lens = valid_lens.defined() ? valid_lens.repeat_interleave(heads, 0) : valid_lens;
    // Repeating the lengths keeps their range: the check above stands for them.
    if (range && range->on_host.defined()) {
      range->on_host = range->on_host.repeat_interleave(heads, 0);
    }
    if (masks.key_padding_mask.defined()) {
      masks.key_padding_mask = masks.key_padding_mask.repeat_interleave(heads, 0);
    }
  }
  plan.mask = resolve_masks(fn, lens, range, masks, plan.mask_per_head ? batch * heads : batch, n,
                            m, queries.device());
  const auto why = why_not_small_heads(queries, keys, o, plan.mask);
  plan.small = why.empty();
  if (!plan.small && explain) plan.reasons.push_back("small_heads: " + why);
  return plan;
}

// The plan's masks for the per-head paths: one row per head.
ResolvedMask per_head_mask(const MultiHeadPlan& plan) {
  auto mask = plan.mask;
  if (plan.mask_per_head) return mask;
  const auto repeat = [&](const torch::Tensor& t) {
    return t.defined() ? t.repeat_interleave(plan.heads, /*dim=*/0) : t;
  };
  mask.lens = repeat(mask.lens);
  mask.allowed = repeat(mask.allowed);
  if (mask.range && mask.range->on_host.defined()) {
    mask.range->on_host = repeat(mask.range->on_host);
  }
  return mask;
}

}  // namespace d2l::detail
