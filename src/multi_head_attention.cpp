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
  auto [output, weights] = detail::run_dot_product_attention(
      {transpose_qkv(project(queries, o.W_q(), o.b_q()), heads),
       transpose_qkv(project(keys, o.W_k(), o.b_k()), heads),
       transpose_qkv(project(values, o.W_v(), o.b_v()), heads), detail::per_head_mask(params),
       o.backend(), o.dropout(), o.training(), o.need_weights()},
      selection.per_head);
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
