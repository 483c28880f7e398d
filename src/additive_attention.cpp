// Additive attention: argument checks, the book's composite formulation (the
// oracle), the choice of path, the functional forms and the module.

#include <d2l/additive_attention.h>

#include <torch/nn/functional/linear.h>

#include <fmt/format.h>

#include "additive_attention_internal.h"
#include "attention_mask_internal.h"
#include "attention_weights.h"
#include "checked_load.h"
#include "checks.h"
#include "cpu/kernel_args.h"
#include "linear.h"
#include "masked_softmax_internal.h"
#include "select.h"

namespace d2l {
namespace detail {
namespace {

// The book's formulation: (B, n, 1, h) + (B, 1, m, h), tanh, then w_v.
torch::Tensor composite_scores(const torch::Tensor& projected_queries,
                               const torch::Tensor& projected_keys, const torch::Tensor& w_v) {
  auto sums = projected_queries.unsqueeze(2) + projected_keys.unsqueeze(1);
  // LibTorch 1.13 has no float16 tanh on the CPU: take it in float, as
  // softmax_last_dim does for the softmax.
  const bool cpu_half = sums.scalar_type() == torch::kHalf && sums.device().is_cpu();
  const auto features =
      cpu_half ? torch::tanh(sums.to(torch::kFloat)).to(torch::kHalf) : torch::tanh(sums);
  return torch::nn::functional::linear(features, w_v).squeeze(-1);
}

// The fused CPU kernel: scores, or with `softmax` their masked softmax.
torch::Tensor fused_additive(const torch::Tensor& projected_queries,
                             const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                             const torch::Tensor& valid_lens, bool softmax) {
  TORCH_INTERNAL_ASSERT(projected_queries.device().is_cpu(), "the fused additive kernel got ",
                        projected_queries.device());
  return additive_autograd(projected_queries, projected_keys, w_v.reshape({-1}),
                           lengths_arg(valid_lens), softmax);
}

// W (rows, cols) of a bias-free Linear layer, on the device and in the dtype
// of `ref`.
void check_linear_weight(const char* fn, const char* name, const torch::Tensor& W, int64_t rows,
                         int64_t cols, const char* ref_name, const torch::Tensor& ref) {
  check_floating(fn, name, W, 2);
  TORCH_CHECK(
      W.size(0) == rows && W.size(1) == cols,
      fmt::format("{}: {} must have shape [{}, {}], got {}", fn, name, rows, cols, shape_of(W)));
  check_same_device(fn, ref_name, ref, name, W);
  check_same_dtype(fn, ref_name, ref, name, W);
}

}  // namespace

torch::Tensor additive_scores_nocheck(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                                      AttentionBackend backend) {
  constexpr const char* fn = "d2l::additive_scores";
  AdditiveParams params;
  params.queries = projected_queries;
  params.stage = AdditiveStage::kScores;
  params.backend = backend;
  switch (select_additive(fn, params, /*explain=*/false).path) {
    case AdditivePath::kFusedScores:
      return fused_additive(projected_queries, projected_keys, w_v, {}, /*softmax=*/false);
    case AdditivePath::kComposite: return composite_scores(projected_queries, projected_keys, w_v);
    default: return chunked_additive_scores(projected_queries, projected_keys, w_v);
  }
}

namespace {

// The weights by the scores' path (kFusedScores, kChunked or kComposite),
// masked by the lengths or, where lengths cannot say it, the boolean mask.
torch::Tensor additive_weights(AdditivePath path, const torch::Tensor& projected_queries,
                               const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                               const ResolvedMask& mask) {
  if (path == AdditivePath::kFusedScores) {
    return fused_additive(projected_queries, projected_keys, w_v, mask.lens, /*softmax=*/true);
  }
  auto scores = path == AdditivePath::kComposite
                    ? composite_scores(projected_queries, projected_keys, w_v)
                    : chunked_additive_scores(projected_queries, projected_keys, w_v);
  return mask.allowed.defined() ? composite_masked_softmax_where(scores, mask.allowed)
                                : composite_masked_softmax(scores, mask.lens);
}

// Additive attention by `path` after the projections: (output, weights
// before dropout).
std::tuple<torch::Tensor, torch::Tensor> run_projected(
    AdditivePath path, const torch::Tensor& projected_queries, const torch::Tensor& projected_keys,
    const torch::Tensor& values, const torch::Tensor& w_v, const ResolvedMask& mask, double dropout,
    bool training) {
  if (path == AdditivePath::kFusedValues) {
    TORCH_INTERNAL_ASSERT(values.device().is_cpu(), "the fused additive kernel got values on ",
                          values.device());
    return additive_values_autograd(projected_queries, projected_keys, values, w_v.reshape({-1}),
                                    lengths_arg(mask.lens));
  }
  auto weights = additive_weights(path, projected_queries, projected_keys, w_v, mask);
  auto output = torch::bmm(dropout_weights(weights, dropout, training), values);
  return {std::move(output), std::move(weights)};
}

// The path, logged when D2L_LOG_PATH asks.
AdditivePath select_logged(const char* fn, const AdditiveParams& params) {
  const bool log = logging_paths();
  const auto selection = select_additive(fn, params, log);
  if (log) log_path(fn, params.backend, to_string(selection.path), selection.reasons);
  return selection.path;
}

// Lengths alone, as the book's callers pass them.
ResolvedMask lengths_only(const torch::Tensor& valid_lens) {
  return {valid_lens, std::nullopt, {}, {}};
}

}  // namespace

torch::Tensor additive_weights_nocheck(const torch::Tensor& projected_queries,
                                       const torch::Tensor& projected_keys,
                                       const torch::Tensor& w_v, const torch::Tensor& valid_lens,
                                       AttentionBackend backend) {
  AdditiveParams params;
  params.queries = projected_queries;
  params.stage = AdditiveStage::kScores;
  params.backend = backend;
  const auto path = select_additive("d2l::AdditiveAttention", params, /*explain=*/false).path;
  return additive_weights(path, projected_queries, projected_keys, w_v, lengths_only(valid_lens));
}

std::tuple<torch::Tensor, torch::Tensor> additive_attention_projected(
    const torch::Tensor& projected_queries, const torch::Tensor& projected_keys,
    const torch::Tensor& values, const torch::Tensor& w_v, const torch::Tensor& valid_lens,
    double dropout, bool training, AttentionBackend backend) {
  AdditiveParams params;
  params.queries = projected_queries;
  params.stage = AdditiveStage::kProjected;
  params.backend = backend;
  params.dropout = dropout;
  params.training = training;
  const auto path = select_logged("d2l::AdditiveAttention", params);
  return run_projected(path, projected_queries, projected_keys, values, w_v,
                       lengths_only(valid_lens), dropout, training);
}

torch::Tensor chunked_additive_scores(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                                      int64_t chunk_bytes) {
  return chunked_additive_autograd(projected_queries, projected_keys, w_v, chunk_bytes);
}

// The module's own checks: its inputs against its options, in its words.
void check_module_inputs(const char* fn, const AdditiveAttentionOptions& options,
                         const torch::Tensor& queries, const torch::Tensor& keys,
                         const torch::Tensor& W_q) {
  TORCH_CHECK(queries.size(2) == options.query_size(),
              fmt::format("{}: queries must have query_size={} features, got queries {}", fn,
                          options.query_size(), shape_of(queries)));
  TORCH_CHECK(keys.size(2) == options.key_size(),
              fmt::format("{}: keys must have key_size={} features, got keys {}", fn,
                          options.key_size(), shape_of(keys)));
  check_same_device(fn, "W_q.weight", W_q, "queries", queries);
  check_same_dtype(fn, "W_q.weight", W_q, "queries", queries);
}

namespace {

// functional::additive_attention's checks, with messages naming `fn` (the
// function or the module that was called; a module passes its options,
// checked after the inputs' own shapes), and what decides its path.
AdditiveParams checked_params(const char* fn, const AdditiveAttentionOptions* module_options,
                              const torch::Tensor& queries, const torch::Tensor& keys,
                              const torch::Tensor& values,
                              const functional::AdditiveAttentionFuncOptions& o) {
  const auto range = check_qkv(fn, queries, keys, values, o.valid_lens());
  if (module_options != nullptr) check_module_inputs(fn, *module_options, queries, keys, o.W_q());
  check_floating(fn, "W_q", o.W_q(), 2);
  const int64_t h = o.W_q().size(0);
  check_linear_weight(fn, "W_q", o.W_q(), h, queries.size(2), "queries", queries);
  check_linear_weight(fn, "W_k", o.W_k(), h, keys.size(2), "queries", queries);
  check_linear_weight(fn, "w_v", o.w_v(), 1, h, "queries", queries);
  check_dropout(fn, o.dropout());
  check_masks(fn, o.mask(), queries, keys);
  AdditiveParams params;
  params.queries = queries;
  params.stage = AdditiveStage::kFull;
  params.mask = resolve_masks(fn, o.mask(), range, queries.size(0), queries.size(1), keys.size(1),
                              queries.device());
  params.backend = o.backend();
  params.dropout = o.dropout();
  params.training = o.training();
  return params;
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> additive_attention(
    const char* fn, const AdditiveAttentionOptions* module_options, const torch::Tensor& queries,
    const torch::Tensor& keys, const torch::Tensor& values,
    const functional::AdditiveAttentionFuncOptions& o) {
  const auto params = checked_params(fn, module_options, queries, keys, values, o);
  const auto path = select_logged(fn, params);
  auto [output, weights] =
      path == AdditivePath::kFusedProjections
          ? additive_projected_autograd(queries, keys, values, o.W_q(), o.W_k(), o.w_v(),
                                        lengths_arg(params.mask.lens))
          : run_projected(path, linear(queries, o.W_q(), {}, o.backend()),
                          linear(keys, o.W_k(), {}, o.backend()), values, o.w_v(), params.mask,
                          o.dropout(), o.training());
  if (!o.need_weights()) weights = torch::Tensor();
  return {std::move(output), std::move(weights)};
}

PathExplanation explain_additive_attention(const char* fn,
                                           const AdditiveAttentionOptions* module_options,
                                           const torch::Tensor& queries, const torch::Tensor& keys,
                                           const torch::Tensor& values,
                                           const functional::AdditiveAttentionFuncOptions& o) {
  auto selection =
      select_additive(fn, checked_params(fn, module_options, queries, keys, values, o), true);
  return {fn, o.backend(), to_string(selection.path), std::move(selection.reasons)};
}

}  // namespace detail

namespace functional {

torch::Tensor additive_scores(const torch::Tensor& projected_queries,
                              const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                              const AdditiveScoresFuncOptions& options) {
  constexpr const char* fn = "d2l::additive_scores";
  detail::check_floating(fn, "projected_queries", projected_queries, 3);
  detail::check_floating(fn, "projected_keys", projected_keys, 3);
  detail::check_floating(fn, "w_v", w_v, 2);
  const int64_t h = projected_queries.size(2);
  TORCH_CHECK(projected_queries.size(0) == projected_keys.size(0) && projected_keys.size(2) == h &&
                  w_v.size(0) == 1 && w_v.size(1) == h,
              fmt::format("{}: expected projected_queries (B, n, h), projected_keys (B, m, h) and "
                          "w_v (1, h), got {}, {} and {}",
                          fn, detail::shape_of(projected_queries), detail::shape_of(projected_keys),
                          detail::shape_of(w_v)));
  detail::check_same_device(fn, "projected_queries", projected_queries, "projected_keys",
                            projected_keys);
  detail::check_same_device(fn, "projected_queries", projected_queries, "w_v", w_v);
  detail::check_same_dtype(fn, "projected_queries", projected_queries, "projected_keys",
                           projected_keys);
  detail::check_same_dtype(fn, "projected_queries", projected_queries, "w_v", w_v);
  return detail::additive_scores_nocheck(projected_queries, projected_keys, w_v, options.backend());
}

AdditiveAttentionFuncOptions::AdditiveAttentionFuncOptions(torch::Tensor W_q, torch::Tensor W_k,
                                                           torch::Tensor w_v)
    : W_q_(std::move(W_q)), W_k_(std::move(W_k)), w_v_(std::move(w_v)) {}

std::tuple<torch::Tensor, torch::Tensor> additive_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AdditiveAttentionFuncOptions& options) {
  return detail::additive_attention("d2l::additive_attention", nullptr, queries, keys, values,
                                    options);
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values,
                             const functional::AdditiveAttentionFuncOptions& options) {
  return detail::explain_additive_attention("d2l::additive_attention", nullptr, queries, keys,
                                            values, options);
}

AdditiveAttentionOptions::AdditiveAttentionOptions(int64_t key_size, int64_t query_size,
                                                   int64_t num_hiddens)
    : key_size_(key_size), query_size_(query_size), num_hiddens_(num_hiddens) {}

AdditiveAttentionImpl::AdditiveAttentionImpl(int64_t key_size, int64_t query_size,
                                             int64_t num_hiddens, double dropout)
    : AdditiveAttentionImpl(
          AdditiveAttentionOptions(key_size, query_size, num_hiddens).dropout(dropout)) {}

AdditiveAttentionImpl::AdditiveAttentionImpl(const AdditiveAttentionOptions& options_)
    : options(options_) {
  reset();
}

void AdditiveAttentionImpl::reset() {
  constexpr const char* fn = "d2l::AdditiveAttention";
  TORCH_CHECK(options.key_size() > 0 && options.query_size() > 0 && options.num_hiddens() > 0,
              fmt::format("{}: key_size, query_size and num_hiddens must be positive, got "
                          "key_size={}, query_size={}, num_hiddens={}",
                          fn, options.key_size(), options.query_size(), options.num_hiddens()));
  detail::check_dropout(fn, options.dropout());
  using torch::nn::LinearOptions;
  W_k = register_module(
      "W_k",
      torch::nn::Linear(LinearOptions(options.key_size(), options.num_hiddens()).bias(false)));
  W_q = register_module(
      "W_q",
      torch::nn::Linear(LinearOptions(options.query_size(), options.num_hiddens()).bias(false)));
  w_v = register_module("w_v",
                        torch::nn::Linear(LinearOptions(options.num_hiddens(), 1).bias(false)));
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void AdditiveAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::AdditiveAttention(key_size={}, query_size={}, num_hiddens={}, "
      "dropout={})",
      options.key_size(), options.query_size(), options.num_hiddens(), options.dropout());
}

namespace {

// What forward runs: the module's weights, the registered dropout module's
// p and mode (as in the book) and its options.
functional::AdditiveAttentionFuncOptions module_call(const AdditiveAttentionImpl& module,
                                                     const AttentionMask& mask, bool need_weights) {
  return functional::AdditiveAttentionFuncOptions(module.W_q->weight, module.W_k->weight,
                                                  module.w_v->weight)
      .mask(mask)
      .dropout(module.dropout->options.p())
      .training(module.dropout->is_training())
      .backend(module.options.backend())
      .need_weights(need_weights);
}

}  // namespace

torch::Tensor AdditiveAttentionImpl::forward(const torch::Tensor& queries,
                                             const torch::Tensor& keys, const torch::Tensor& values,
                                             const AttentionMask& mask) {
  const bool record = detail::records_weights(options.record_attention_weights());
  auto [output, weights] = detail::additive_attention(
      "d2l::AdditiveAttention", &options, queries, keys, values, module_call(*this, mask, record));
  if (record) detail::record_weights(attention_weights, weights);
  return output;
}

std::tuple<torch::Tensor, torch::Tensor> AdditiveAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AttentionMask& mask) {
  return detail::additive_attention("d2l::AdditiveAttention", &options, queries, keys, values,
                                    module_call(*this, mask, /*need_weights=*/true));
}

PathExplanation AdditiveAttentionImpl::explain_path(const torch::Tensor& queries,
                                                    const torch::Tensor& keys,
                                                    const torch::Tensor& values,
                                                    const AttentionMask& mask) const {
  return detail::explain_additive_attention("d2l::AdditiveAttention", &options, queries, keys,
                                            values, module_call(*this, mask, true));
}

torch::Tensor AdditiveAttentionImpl::last_attention_weights() const {
  return detail::load_weights(attention_weights);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void AdditiveAttentionImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::AdditiveAttention::load");
}

}  // namespace d2l
