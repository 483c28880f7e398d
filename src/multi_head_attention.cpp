// Multi-head attention: the head split and join, the functional form and
// the module. Each head runs functional::dot_product_attention.

#include <d2l/multi_head_attention.h>


#include <fmt/format.h>

#include "attention_weights.h"
#include "checked_load.h"
#include "checks.h"
#include "dot_product_attention.h"
#include "linear.h"
#include "multi_head_attention.h"
#include "path.h"

namespace d2l {
namespace {

void check_heads_input(const char* fn, const torch::Tensor& X, int64_t num_heads,
                       const char* layout) {
  TORCH_CHECK(num_heads > 0, fmt::format("{}: num_heads must be positive, got {}", fn, num_heads));
  detail::check_strided_layout(fn, "X", X);
  TORCH_CHECK(X.defined() && X.dim() == 3, fmt::format("{}: X must be a 3-D tensor {}, got {}", fn,
                                                       layout, detail::shape_of(X)));
}

}  // namespace

torch::Tensor transpose_qkv(const torch::Tensor& X, int64_t num_heads) {
  constexpr const char* fn = "d2l::transpose_qkv";
  check_heads_input(fn, X, num_heads, "(B, n, num_hiddens)");
  TORCH_CHECK(X.size(2) % num_heads == 0,
              fmt::format("{}: the feature size of X must be a multiple of num_heads={}, got X {}",
                          fn, num_heads, detail::shape_of(X)));
  // Explicit sizes instead of the book's -1, which is ambiguous for empty X.
  const int64_t batch = X.size(0), n = X.size(1);
  return X.reshape({batch, n, num_heads, X.size(2) / num_heads})
      .permute({0, 2, 1, 3})
      .reshape({batch * num_heads, n, X.size(2) / num_heads});
}

torch::Tensor transpose_output(const torch::Tensor& X, int64_t num_heads) {
  constexpr const char* fn = "d2l::transpose_output";
  check_heads_input(fn, X, num_heads, "(B * num_heads, n, d)");
  TORCH_CHECK(X.size(0) % num_heads == 0,
              fmt::format("{}: the first size of X must be a multiple of num_heads={}, got X {}",
                          fn, num_heads, detail::shape_of(X)));
  const int64_t batch = X.size(0) / num_heads, n = X.size(1), d = X.size(2);
  return X.reshape({batch, num_heads, n, d})
      .permute({0, 2, 1, 3})
      .reshape({batch, n, num_heads * d});
}

namespace {

// A projection's weight (h, in) and optional bias (h), on the queries' device
// and in their dtype.
void check_projection(const char* fn, const char* name, const torch::Tensor& W,
                      const char* bias_name, const torch::Tensor& b, int64_t h, int64_t in,
                      const torch::Tensor& queries) {
  detail::check_strided_layout(fn, name, W);
  detail::check_strided_layout(fn, bias_name, b);
  detail::check_floating(fn, name, W, 2);
  TORCH_CHECK(
      W.size(0) == h && W.size(1) == in,
      fmt::format("{}: {} must have shape [{}, {}], got {}", fn, name, h, in, detail::shape_of(W)));
  detail::check_same_device(fn, "queries", queries, name, W);
  detail::check_same_dtype(fn, "queries", queries, name, W);
  if (!b.defined()) return;
  TORCH_CHECK(b.dim() == 1 && b.size(0) == h,
              fmt::format("{}: {} must have shape [{}] or be undefined, got {}", fn, bias_name, h,
                          detail::shape_of(b)));
  detail::check_same_device(fn, "queries", queries, bias_name, b);
  detail::check_same_dtype(fn, "queries", queries, bias_name, b);
}

// The module's own checks: its inputs against its options, in its words.
void check_module_inputs(const char* fn, const MultiHeadAttentionOptions& options,
                         const torch::Tensor& queries, const torch::Tensor& keys,
                         const torch::Tensor& values, const torch::Tensor& W_q) {
  const auto features_ok = [&](const torch::Tensor& t, int64_t size) { return t.size(2) == size; };
  TORCH_CHECK(
      features_ok(queries, options.query_size()) && features_ok(keys, options.key_size()) &&
          features_ok(values, options.value_size()),
      fmt::format("{}: queries, keys and values must have query_size={}, key_size={} and "
                  "value_size={} features, got queries {}, keys {} and values {}",
                  fn, options.query_size(), options.key_size(), options.value_size(),
                  detail::shape_of(queries), detail::shape_of(keys), detail::shape_of(values)));
  detail::check_same_device(fn, "W_q.weight", W_q, "queries", queries);
  detail::check_same_dtype(fn, "W_q.weight", W_q, "queries", queries);
}

// What a call runs, once its arguments are checked: its masks, resolved per
// batch entry (or per head, when attn_mask gives each head its own), and
// whether its heads are small enough for the one-node kernels.
struct Plan {
  int64_t heads = 1;
  detail::ResolvedMask mask;
  bool mask_per_head = false;
  bool small = false;
  /// Why not small_heads, as "small_heads: <why>" (when asked).
  std::vector<std::string> reasons;
};

// Why the heads of this call do not run as one node (Note [Small heads]), or
// empty when they do.
std::string why_not_small_heads(const torch::Tensor& queries, const torch::Tensor& keys,
                                const functional::MultiHeadAttentionFuncOptions& o,
                                const detail::ResolvedMask& mask) {
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
  if (!detail::small_heads(n, m, d)) {
    return fmt::format(
        "heads of {} queries x {} keys x {} features (the kernels take up to 64 x 64 pairs "
        "with at most 16 features, 32 x 32 with more)",
        n, m, d);
  }
  return {};
}

// functional::multi_head_attention's checks, with messages naming `fn` (the
// function or the module that was called; a module passes its options,
// checked after the inputs' own shapes), and its plan.
Plan plan_call(const char* fn, const MultiHeadAttentionOptions* module_options,
               const torch::Tensor& queries, const torch::Tensor& keys,
               const torch::Tensor& values, const torch::Tensor& valid_lens,
               const functional::MultiHeadAttentionFuncOptions& o, bool explain) {
  detail::check_strided_layout(fn, "queries", queries);
  detail::check_strided_layout(fn, "keys", keys);
  detail::check_strided_layout(fn, "values", values);
  detail::check_strided_layout(fn, "valid_lens", valid_lens);
  auto range = detail::check_qkv(fn, queries, keys, values, valid_lens);
  if (module_options != nullptr) {
    check_module_inputs(fn, *module_options, queries, keys, values, o.W_q());
  }
  const int64_t heads = o.num_heads();
  TORCH_CHECK(heads > 0, fmt::format("{}: num_heads must be positive, got {}", fn, heads));
  detail::check_strided_layout(fn, "W_q", o.W_q());
  detail::check_floating(fn, "W_q", o.W_q(), 2);
  const int64_t h = o.W_q().size(0);
  TORCH_CHECK(h % heads == 0,
              fmt::format("{}: num_hiddens (the rows of W_q) must be divisible by num_heads, got "
                          "W_q {} and num_heads={}",
                          fn, detail::shape_of(o.W_q()), heads));
  check_projection(fn, "W_q", o.W_q(), "b_q", o.b_q(), h, queries.size(2), queries);
  check_projection(fn, "W_k", o.W_k(), "b_k", o.b_k(), h, keys.size(2), queries);
  check_projection(fn, "W_v", o.W_v(), "b_v", o.b_v(), h, values.size(2), queries);
  check_projection(fn, "W_o", o.W_o(), "b_o", o.b_o(), h, h, queries);
  detail::check_dropout(fn, o.dropout());
  detail::Masks masks{o.key_padding_mask(), o.attn_mask(), o.is_causal()};
  detail::check_masks(fn, masks, queries, keys, heads);
  const int64_t batch = queries.size(0), n = queries.size(1), m = keys.size(1);
  Plan plan;
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
  plan.mask = detail::resolve_masks(fn, lens, range, masks,
                                    plan.mask_per_head ? batch * heads : batch, n, m,
                                    queries.device());
  const auto why = why_not_small_heads(queries, keys, o, plan.mask);
  plan.small = why.empty();
  if (!plan.small && explain) plan.reasons.push_back("small_heads: " + why);
  return plan;
}

// The plan's masks for the per-head paths: one row per head.
detail::ResolvedMask per_head_mask(const Plan& plan) {
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

// functional::multi_head_attention, with messages naming `fn`.
std::tuple<torch::Tensor, torch::Tensor> checked_multi_head_attention(
    const char* fn, const MultiHeadAttentionOptions* module_options, const torch::Tensor& queries,
    const torch::Tensor& keys, const torch::Tensor& values, const torch::Tensor& valid_lens,
    const functional::MultiHeadAttentionFuncOptions& o) {
  const bool log = detail::logging_paths();
  const auto plan = plan_call(fn, module_options, queries, keys, values, valid_lens, o, log);
  if (plan.small) {
    // Small heads on the CPU: one autograd node (Note [Small heads]).
    if (log) detail::log_path(fn, o.backend(), "small_heads", {});
    return detail::fused_multi_head_attention(
        queries, keys, values,
        {o.W_q(), o.W_k(), o.W_v(), o.W_o(), o.b_q(), o.b_k(), o.b_v(), o.b_o()}, plan.mask.lens,
        plan.heads, o.dropout(), o.training(), o.need_weights());
  }
  if (log) detail::log_path(fn, o.backend(), "per-head dot-product attention", plan.reasons);
  const auto project = [&o](const torch::Tensor& x, const torch::Tensor& W,
                            const torch::Tensor& b) {
    return detail::linear(x, W, b, o.backend());
  };
  const int64_t heads = plan.heads;
  auto [output, weights] = detail::dot_product_attention(
      "d2l::dot_product_attention", transpose_qkv(project(queries, o.W_q(), o.b_q()), heads),
      transpose_qkv(project(keys, o.W_k(), o.b_k()), heads),
      transpose_qkv(project(values, o.W_v(), o.b_v()), heads), per_head_mask(plan),
      o.dropout(), o.training(), o.backend(), o.need_weights());
  return {project(transpose_output(output, heads), o.W_o(), o.b_o()), std::move(weights)};
}

// explain_path for multi-head attention: "small_heads", or the path of the
// per-head dot-product attention, after the same checks as the call.
PathExplanation explain_multi_head_attention(const char* fn,
                                             const MultiHeadAttentionOptions* module_options,
                                             const torch::Tensor& queries,
                                             const torch::Tensor& keys,
                                             const torch::Tensor& values,
                                             const torch::Tensor& valid_lens,
                                             const functional::MultiHeadAttentionFuncOptions& o) {
  const auto plan = plan_call(fn, module_options, queries, keys, values, valid_lens, o, true);
  if (plan.small) return {fn, o.backend(), "small_heads", {}};
  // The heads' shapes, without projecting anything: one element, expanded.
  const int64_t batch = queries.size(0) * plan.heads, d = o.W_q().size(0) / plan.heads;
  const auto head_shaped = [&](int64_t rows) {
    return torch::empty({1}, queries.options()).expand({batch, rows, d});
  };
  auto inner = detail::explain_dot_product_attention(
      fn, head_shaped(queries.size(1)), head_shaped(keys.size(1)), head_shaped(keys.size(1)),
      per_head_mask(plan), o.dropout(), o.training(), o.backend(), o.need_weights());
  inner.reasons.insert(inner.reasons.begin(), plan.reasons.begin(), plan.reasons.end());
  return inner;
}

}  // namespace

namespace functional {

MultiHeadAttentionFuncOptions::MultiHeadAttentionFuncOptions(int64_t num_heads, torch::Tensor W_q,
                                                             torch::Tensor W_k, torch::Tensor W_v,
                                                             torch::Tensor W_o)
    : num_heads_(num_heads),
      W_q_(std::move(W_q)),
      W_k_(std::move(W_k)),
      W_v_(std::move(W_v)),
      W_o_(std::move(W_o)) {}

std::tuple<torch::Tensor, torch::Tensor> multi_head_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens, const MultiHeadAttentionFuncOptions& options) {
  return checked_multi_head_attention("d2l::multi_head_attention", nullptr, queries, keys, values,
                                      valid_lens, options);
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, const torch::Tensor& valid_lens,
                             const functional::MultiHeadAttentionFuncOptions& options) {
  return explain_multi_head_attention("d2l::multi_head_attention", nullptr, queries, keys, values,
                                      valid_lens, options);
}

MultiHeadAttentionOptions::MultiHeadAttentionOptions(int64_t key_size, int64_t query_size,
                                                     int64_t value_size, int64_t num_hiddens,
                                                     int64_t num_heads)
    : key_size_(key_size),
      query_size_(query_size),
      value_size_(value_size),
      num_hiddens_(num_hiddens),
      num_heads_(num_heads) {}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(int64_t key_size, int64_t query_size,
                                               int64_t value_size, int64_t num_hiddens,
                                               int64_t num_heads, double dropout, bool bias)
    : MultiHeadAttentionImpl(
          MultiHeadAttentionOptions(key_size, query_size, value_size, num_hiddens, num_heads)
              .dropout(dropout)
              .bias(bias)) {}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_)
    : options(options_) {
  reset();
}

namespace {

void check_options(const MultiHeadAttentionOptions& o) {
  constexpr const char* fn = "d2l::MultiHeadAttention";
  TORCH_CHECK(o.key_size() > 0 && o.query_size() > 0 && o.value_size() > 0 && o.num_hiddens() > 0 &&
                  o.num_heads() > 0,
              fmt::format("{}: key_size, query_size, value_size, num_hiddens and num_heads must "
                          "be positive, got key_size={}, query_size={}, value_size={}, "
                          "num_hiddens={}, num_heads={}",
                          fn, o.key_size(), o.query_size(), o.value_size(), o.num_hiddens(),
                          o.num_heads()));
  TORCH_CHECK(o.num_hiddens() % o.num_heads() == 0,
              fmt::format("{}: num_hiddens must be divisible by num_heads, got num_hiddens={} "
                          "and num_heads={}",
                          fn, o.num_hiddens(), o.num_heads()));
  detail::check_dropout(fn, o.dropout());
}

}  // namespace

void MultiHeadAttentionImpl::reset() {
  check_options(options);
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  const int64_t h = options.num_hiddens();
  const bool bias = options.bias();
  attention = register_module(
      "attention",
      DotProductAttention(DotProductAttentionOptions()
                              .dropout(options.dropout())
                              .backend(options.backend())
                              .record_attention_weights(options.record_attention_weights())));
  W_q = register_module("W_q", Linear(LinearOptions(options.query_size(), h).bias(bias)));
  W_k = register_module("W_k", Linear(LinearOptions(options.key_size(), h).bias(bias)));
  W_v = register_module("W_v", Linear(LinearOptions(options.value_size(), h).bias(bias)));
  W_o = register_module("W_o", Linear(LinearOptions(h, h).bias(bias)));
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::MultiHeadAttention(key_size={}, query_size={}, value_size={}, "
      "num_hiddens={}, num_heads={}, dropout={}, bias={})",
      options.key_size(), options.query_size(), options.value_size(), options.num_hiddens(),
      options.num_heads(), options.dropout(), options.bias());
}

namespace {

// What forward runs: the module's weights, and the dropout and options of
// its inner `attention`.
functional::MultiHeadAttentionFuncOptions module_call(const MultiHeadAttentionImpl& module,
                                                      const AttentionMask& mask,
                                                      bool need_weights) {
  return functional::MultiHeadAttentionFuncOptions(module.options.num_heads(), module.W_q->weight,
                                                   module.W_k->weight, module.W_v->weight,
                                                   module.W_o->weight)
      .b_q(module.W_q->bias)
      .b_k(module.W_k->bias)
      .b_v(module.W_v->bias)
      .b_o(module.W_o->bias)
      .dropout(module.attention->dropout->options.p())
      .training(module.attention->dropout->is_training())
      .backend(module.attention->options.backend())
      .need_weights(need_weights)
      .key_padding_mask(mask.key_padding_mask())
      .attn_mask(mask.attn_mask())
      .is_causal(mask.is_causal());
}

}  // namespace

torch::Tensor MultiHeadAttentionImpl::forward(const torch::Tensor& queries,
                                              const torch::Tensor& keys,
                                              const torch::Tensor& values,
                                              const torch::Tensor& valid_lens) {
  return forward_masked(queries, keys, values, AttentionMask().valid_lens(valid_lens));
}

torch::Tensor MultiHeadAttentionImpl::forward_masked(const torch::Tensor& queries,
                                                     const torch::Tensor& keys,
                                                     const torch::Tensor& values,
                                                     const AttentionMask& mask) {
  const bool record = attention->options.record_attention_weights();
  auto [output, weights] =
      checked_multi_head_attention("d2l::MultiHeadAttention", &options, queries, keys, values,
                                   mask.valid_lens(), module_call(*this, mask, record));
  if (record) detail::record_weights(attention->attention_weights, std::move(weights));
  return output;
}

std::tuple<torch::Tensor, torch::Tensor> MultiHeadAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens) {
  return forward_with_weights(queries, keys, values, AttentionMask().valid_lens(valid_lens));
}

std::tuple<torch::Tensor, torch::Tensor> MultiHeadAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AttentionMask& mask) {
  return checked_multi_head_attention("d2l::MultiHeadAttention", &options, queries, keys, values,
                                      mask.valid_lens(),
                                      module_call(*this, mask, /*need_weights=*/true));
}

PathExplanation MultiHeadAttentionImpl::explain_path(const torch::Tensor& queries,
                                                     const torch::Tensor& keys,
                                                     const torch::Tensor& values,
                                                     const torch::Tensor& valid_lens) const {
  return explain_path(queries, keys, values, AttentionMask().valid_lens(valid_lens));
}

PathExplanation MultiHeadAttentionImpl::explain_path(const torch::Tensor& queries,
                                                     const torch::Tensor& keys,
                                                     const torch::Tensor& values,
                                                     const AttentionMask& mask) const {
  return explain_multi_head_attention(
      "d2l::MultiHeadAttention", &options, queries, keys, values, mask.valid_lens(),
      module_call(*this, mask, attention->options.record_attention_weights()));
}

torch::Tensor MultiHeadAttentionImpl::last_attention_weights() const {
  return detail::load_weights(attention->attention_weights);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void MultiHeadAttentionImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::MultiHeadAttention::load");
}

}  // namespace d2l
