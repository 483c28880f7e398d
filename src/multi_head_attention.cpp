// Multi-head attention: the head split and join, the functional form and
// the module. Small heads run as one node (autograd/multi_head_attention.cpp),
// the others as dot-product attention per head; the checks and the choice
// are in multi_head_attention_plan.cpp.

#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include "attention_weights.h"
#include "checked_load.h"
#include "checks.h"
#include "dot_product_attention_internal.h"
#include "linear.h"
#include "multi_head_attention_internal.h"

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

namespace detail {

std::tuple<torch::Tensor, torch::Tensor> grouped_heads_attention(DotProductParams p, int64_t group,
                                                                 DotProductPath path) {
  if (group == 1) return run_dot_product_attention(p, path);
  // Note [Grouped heads as longer entries]: the g query heads of a key/value
  // head are consecutive entries of (B · H, n, d), so (B · Hkv, g · n, d) is
  // one entry per key/value head; the per-head masks fold the same way.
  const int64_t entries = p.keys.size(0), n = p.queries.size(1), m = p.keys.size(1);
  p.queries = p.queries.reshape({entries, group * n, p.queries.size(2)});
  const auto fold = [&](const torch::Tensor& lens) {
    if (!lens.defined()) return lens;
    return lens.dim() == 1 ? lens.view({entries, group}).repeat_interleave(n, 1)
                           : lens.reshape({entries, group * n});
  };
  p.mask.lens = fold(p.mask.lens);
  if (p.mask.range && p.mask.range->on_host.defined()) {
    p.mask.range->on_host = fold(p.mask.range->on_host);
  }
  if (p.mask.allowed.defined()) p.mask.allowed = p.mask.allowed.reshape({entries, group * n, m});
  auto [output, weights] = run_dot_product_attention(p, path);
  output = output.view({entries * group, n, output.size(2)});
  if (weights.defined()) weights = weights.view({entries * group, n, m});
  return {std::move(output), std::move(weights)};
}

// functional::multi_head_attention, with messages naming `fn`.
std::tuple<torch::Tensor, torch::Tensor> checked_multi_head_attention(
    const char* fn, const MultiHeadAttentionOptions* module_options, const torch::Tensor& queries,
    const torch::Tensor& keys, const torch::Tensor& values,
    const functional::MultiHeadAttentionFuncOptions& o) {
  const auto params = checked_multi_head_params(fn, module_options, queries, keys, values, o);
  const bool log = detail::logging_paths();
  const auto selection = detail::select_multi_head(fn, params, log);
  const int64_t heads = params.heads;
  if (selection.path == detail::MultiHeadPath::kSmallHeads) {
    // Small heads on the CPU: one autograd node (Note [Small heads]).
    if (log) detail::log_path(fn, o.backend(), "small_heads", {});
    return detail::fused_multi_head_attention(
        queries, keys, values,
        {o.W_q(), o.W_k(), o.W_v(), o.W_o(), o.b_q(), o.b_k(), o.b_v(), o.b_o()}, params.mask.lens,
        heads, o.dropout(), o.training(), o.need_weights());
  }
  if (log) detail::log_path(fn, o.backend(), to_string(selection.per_head), selection.reasons);
  const auto project = [&o](const torch::Tensor& x, const torch::Tensor& W,
                            const torch::Tensor& b) {
    return detail::linear(x, W, b, o.backend());
  };
  const int64_t kv_heads = params.kv_heads;
  auto [output, weights] = grouped_heads_attention(
      {transpose_qkv(project(queries, o.W_q(), o.b_q()), heads),
       transpose_qkv(project(keys, o.W_k(), o.b_k()), kv_heads),
       transpose_qkv(project(values, o.W_v(), o.b_v()), kv_heads), detail::per_head_mask(params),
       o.backend(), o.dropout(), o.training(), o.need_weights()},
      heads / kv_heads, selection.per_head);
  return {project(transpose_output(output, heads), o.W_o(), o.b_o()), std::move(weights)};
}

// explain_path for multi-head attention: "small_heads", or the path of the
// per-head dot-product attention, after the same checks as the call.
PathExplanation explain_multi_head_attention(const char* fn,
                                             const MultiHeadAttentionOptions* module_options,
                                             const torch::Tensor& queries,
                                             const torch::Tensor& keys, const torch::Tensor& values,
                                             const functional::MultiHeadAttentionFuncOptions& o) {
  const auto params = checked_multi_head_params(fn, module_options, queries, keys, values, o);
  auto selection = detail::select_multi_head(fn, params, /*explain=*/true);
  const bool small = selection.path == detail::MultiHeadPath::kSmallHeads;
  return {fn, o.backend(), small ? "small_heads" : to_string(selection.per_head),
          std::move(selection.reasons)};
}

}  // namespace detail

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
    const MultiHeadAttentionFuncOptions& options) {
  return detail::checked_multi_head_attention("d2l::multi_head_attention", nullptr, queries, keys, values,
                                      options);
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values,
                             const functional::MultiHeadAttentionFuncOptions& options) {
  return detail::explain_multi_head_attention("d2l::multi_head_attention", nullptr, queries, keys, values,
                                      options);
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
  const auto kv = o.num_kv_heads();
  TORCH_CHECK(!kv || (*kv > 0 && o.num_heads() % *kv == 0),
              fmt::format("{}: num_kv_heads must divide num_heads={} (each key/value head "
                          "serving a group of query heads), got num_kv_heads={}",
                          fn, o.num_heads(), kv.value_or(0)));
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
  const int64_t kv = h / options.num_heads() * options.num_kv_heads().value_or(options.num_heads());
  W_k = register_module("W_k", Linear(LinearOptions(options.key_size(), kv).bias(bias)));
  W_v = register_module("W_v", Linear(LinearOptions(options.value_size(), kv).bias(bias)));
  W_o = register_module("W_o", Linear(LinearOptions(h, h).bias(bias)));
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::MultiHeadAttention(key_size={}, query_size={}, value_size={}, "
      "num_hiddens={}, num_heads={}, ",
      options.key_size(), options.query_size(), options.value_size(), options.num_hiddens(),
      options.num_heads());
  if (options.num_kv_heads()) stream << fmt::format("num_kv_heads={}, ", *options.num_kv_heads());
  stream << fmt::format("dropout={}, bias={})", options.dropout(), options.bias());
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
      .mask(mask);
}

}  // namespace

torch::Tensor MultiHeadAttentionImpl::forward(const torch::Tensor& queries,
                                              const torch::Tensor& keys,
                                              const torch::Tensor& values,
                                              const AttentionMask& mask) {
  const bool record = detail::records_weights(attention->options.record_attention_weights());
  auto [output, weights] = detail::checked_multi_head_attention(
      "d2l::MultiHeadAttention", &options, queries, keys, values, module_call(*this, mask, record));
  if (record) detail::record_weights(attention->attention_weights, std::move(weights));
  return output;
}

std::tuple<torch::Tensor, torch::Tensor> MultiHeadAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AttentionMask& mask) {
  return detail::checked_multi_head_attention("d2l::MultiHeadAttention", &options, queries, keys, values,
                                      module_call(*this, mask, /*need_weights=*/true));
}

PathExplanation MultiHeadAttentionImpl::explain_path(const torch::Tensor& queries,
                                                     const torch::Tensor& keys,
                                                     const torch::Tensor& values,
                                                     const AttentionMask& mask) const {
  return detail::explain_multi_head_attention(
      "d2l::MultiHeadAttention", &options, queries, keys, values,
      module_call(*this, mask,
                  detail::records_weights(attention->options.record_attention_weights())));
}

torch::Tensor MultiHeadAttentionImpl::last_attention_weights() const {
  return detail::load_weights(attention->attention_weights);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void MultiHeadAttentionImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::MultiHeadAttention::load");
}

void MultiHeadAttentionImpl::save(torch::serialize::OutputArchive& archive) const {
  torch::nn::Module::save(archive);
  archive.write(detail::kNumHeadsKey, c10::IValue(options.num_heads()));
}

}  // namespace d2l
