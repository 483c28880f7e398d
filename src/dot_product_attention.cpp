// Scaled dot-product attention: argument checks, the composite path (bmm,
// masked softmax, bmm; fused softmax on the CPU), the flash kernel's entry
// (autograd/dot_product_attention.cpp), LibTorch's SDPA with our masking
// contract, the functional form and the module. The choice among
// them is in select.cpp (Note [Choosing a path]).

#include <d2l/dot_product_attention.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "attention_weights.h"
#include "checked_load.h"
#include "checks.h"
#include "dot_product_attention_internal.h"
#include "masked_softmax_internal.h"
#include "sequence_mask_internal.h"

namespace d2l {
namespace detail {

#if D2L_HAS_SDPA
torch::Tensor libtorch_sdpa(const torch::Tensor& query, const torch::Tensor& key,
                            const torch::Tensor& value, const std::optional<torch::Tensor>& mask,
                            double dropout, bool is_causal, std::optional<double> scale,
                            bool enable_gqa) {
#if !D2L_TORCH_VERSION_AT_LEAST(2, 5)
  TORCH_INTERNAL_ASSERT(!enable_gqa, "enable_gqa needs LibTorch 2.5");
#endif
  const auto call = [&] {
#if D2L_TORCH_VERSION_AT_LEAST(2, 5)
    return at::scaled_dot_product_attention(query, key, value, mask, dropout, is_causal, scale,
                                            enable_gqa);
#else
    return at::scaled_dot_product_attention(query, key, value, mask, dropout, is_causal, scale);
#endif
  };
  const auto type = query.scalar_type();
  if (!query.device().is_cpu() || (type != torch::kBFloat16 && type != torch::kHalf)) return call();
  try {
    return call();
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("pack_vnni2") == std::string::npos) throw;
  }
  auto k = key, v = value;
  if (enable_gqa && key.dim() >= 3 && query.size(-3) != key.size(-3)) {
    k = key.repeat_interleave(query.size(-3) / key.size(-3), -3);
    v = value.repeat_interleave(query.size(-3) / value.size(-3), -3);
  }
  // The math path adds its mask: a boolean one becomes 0 where a pair takes
  // part and -inf elsewhere first, as at::scaled_dot_product_attention does.
  auto additive = mask;
  if (mask && mask->scalar_type() == torch::kBool) {
    additive = torch::zeros(mask->sizes(), query.options())
                   .masked_fill(mask->logical_not(), -std::numeric_limits<double>::infinity());
  }
  return std::get<0>(
      at::_scaled_dot_product_attention_math(query, k, v, additive, dropout, is_causal, {}, scale));
}
#endif

namespace {

#if D2L_HAS_SDPA
// at::scaled_dot_product_attention on (B, n, d) tensors with a boolean
// `attend` mask (B, 1, 1 or n, m) or none, and rows `no_valid_key` (B, n or
// 1, 1), when defined, zeroed after.
torch::Tensor sdpa_with_mask(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, const torch::Tensor& attend,
                             const torch::Tensor& no_valid_key, double dropout) {
  // An undefined tensor is not "no mask" to SDPA: it must be nullopt.
  const auto mask = attend.defined() ? std::optional<torch::Tensor>(attend) : std::nullopt;
  auto out = libtorch_sdpa(queries.unsqueeze(1), keys.unsqueeze(1), values.unsqueeze(1), mask,
                           dropout, /*is_causal=*/false, std::nullopt, /*enable_gqa=*/false)
                 .squeeze(1);
  return no_valid_key.defined() ? out.masked_fill(no_valid_key, 0) : out;
}
#endif

// LibTorch's SDPA with our masking contract (AttentionBackend::kSdpa). `range` is the
// lengths' (checked) range: it lets the mask go where it masks nothing and
// the keys past the longest length go without reading the device again.
torch::Tensor sdpa_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values, const torch::Tensor& valid_lens,
                             const std::optional<LengthRange>& range, double dropout) {
#if D2L_HAS_SDPA
  const int64_t batch = queries.size(0);
  int64_t m = keys.size(1);
  torch::Tensor attend, no_valid_key, visible_keys = keys, visible_values = values;
  if (valid_lens.defined() && range) {
    // Keys past the longest length of the batch are seen by no query: drop
    // them (a view).
    m = std::max<int64_t>(1, static_cast<int64_t>(std::min<double>(m, range->longest)));
    if (m < keys.size(1)) {
      visible_keys = keys.narrow(1, 0, m);
      visible_values = values.narrow(1, 0, m);
    }
    // Every row sees every remaining key: no mask, and SDPA may take its
    // unmasked kernels (flash attention on CUDA).
    if (range->shortest < m && range->on_host.defined() && valid_lens.dim() == 1 &&
        range->on_host.sizes() == valid_lens.sizes()) {
      // Lengths the check copied to the host (a few, on CUDA): both masks
      // are made there and go to the device in one copy, where making them
      // on the device takes several ops.
      // In double: exact for every checked length, 1e20 included.
      const auto lens = range->on_host.to(torch::kDouble).view({batch, 1});
      const auto positions = torch::arange(m, lens.options().dtype(torch::kLong));
      const auto padding = positions >= lens;  // (B, m): keys no query may see
      // A row with no valid key attends to every key and is zeroed below,
      // as in the branch after this one.
      auto sees = padding.logical_not();
      if (range->shortest <= 0) sees = sees.logical_or(lens <= 0);
      const auto masks = torch::stack({padding, sees}).to(keys.device());
      visible_keys = visible_keys.masked_fill(masks[0].unsqueeze(-1), 0);
      attend = masks[1].view({batch, 1, 1, m});
      if (range->shortest <= 0) no_valid_key = (lens <= 0).unsqueeze(-1).to(keys.device());
    } else if (range->shortest < m) {
      // Lengths as (B, 1) or (B, n); the mask broadcasts over queries for
      // the former, so it stays (B, 1, 1, m).
      const auto comparable = comparable_lengths(valid_lens);
      const auto lens = comparable.dim() == 1 ? comparable.view({batch, 1}) : comparable;
      const auto positions = torch::arange(m, lens.options().dtype(torch::kLong));
      attend = positions < lens.unsqueeze(-1);
      if (range->shortest <= 0) {
        // A row with no valid key attends to every key here and is zeroed
        // below: a fully masked row is NaN in SDPA before 2.5, and its zeros
        // from 2.5 on are not promised by every CUDA backend.
        no_valid_key = (lens <= 0).unsqueeze(-1);
        attend = attend.logical_or(no_valid_key);
      }
      // Keys that no query of an example may see are zeroed: SDPA applies
      // the boolean mask as an additive -inf, which would turn an inf or NaN
      // score of a padding key into NaN where the composite path masks it out.
      const auto max_len =
          lens.dim() == 2 && lens.size(1) > 1 ? std::get<0>(lens.max(1, /*keepdim=*/true)) : lens;
      visible_keys = visible_keys.masked_fill((positions >= max_len).unsqueeze(-1), 0);
      attend = attend.unsqueeze(1);
    }
  }
  return sdpa_with_mask(queries, visible_keys, visible_values, attend, no_valid_key, dropout);
#else
  (void)queries, (void)keys, (void)values, (void)valid_lens, (void)range, (void)dropout;
  TORCH_INTERNAL_ASSERT(false, "sdpa_attention without LibTorch 2.1");
#endif
}

// SDPA with a boolean mask lengths cannot express, (B, n, m), true where a
// query may see a key: rows that see no key attend to every key inside SDPA
// and are zeroed after, as above.
torch::Tensor sdpa_general_mask(const torch::Tensor& queries, const torch::Tensor& keys,
                                const torch::Tensor& values, const torch::Tensor& allowed,
                                double dropout) {
#if D2L_HAS_SDPA
  const auto no_valid_key = allowed.any(-1, /*keepdim=*/true).logical_not();
  return sdpa_with_mask(queries, keys, values, allowed.logical_or(no_valid_key).unsqueeze(1),
                        no_valid_key, dropout);
#else
  (void)queries, (void)keys, (void)values, (void)allowed, (void)dropout;
  TORCH_INTERNAL_ASSERT(false, "sdpa_general_mask without LibTorch 2.1");
#endif
}

}  // namespace

void check_dot_product_settings(const char* fn, const torch::Tensor& queries,
                                const torch::Tensor& keys, double dropout) {
  TORCH_CHECK(queries.size(2) == keys.size(2),
              fmt::format("{}: queries and keys must have the same feature size, got queries {} "
                          "and keys {}",
                          fn, detail::shape_of(queries), detail::shape_of(keys)));
  // Zero features would make every score 0 / sqrt(0): NaN weights, silently.
  TORCH_CHECK(queries.size(2) > 0,
              fmt::format("{}: queries and keys must have at least one feature (scores are "
                          "scaled by 1/sqrt(d)), got queries {} and keys {}",
                          fn, detail::shape_of(queries), detail::shape_of(keys)));
  check_dropout(fn, dropout);
}

PathExplanation explain_dot_product_attention(const char* fn, const DotProductParams& params) {
  check_dot_product_settings(fn, params.queries, params.keys, params.dropout);
  auto selection = select_dot_product(fn, params, /*explain=*/true);
  return {fn, params.backend, to_string(selection.path), std::move(selection.reasons)};
}

std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(const char* fn,
                                                               const DotProductParams& params) {
  check_dot_product_settings(fn, params.queries, params.keys, params.dropout);
  const bool log = logging_paths();
  const auto selection = select_dot_product(fn, params, log);
  if (log) log_path(fn, params.backend, to_string(selection.path), selection.reasons);
  return run_dot_product_attention(params, selection.path);
}

std::tuple<torch::Tensor, torch::Tensor> run_dot_product_attention(const DotProductParams& params,
                                                                   DotProductPath path) {
  const auto& queries = params.queries;
  const auto& keys = params.keys;
  const auto& values = params.values;
  const auto& mask = params.mask;
  const double dropout = params.dropout;
  const bool training = params.training, need_weights = params.need_weights;
  const auto sqrt_d = std::sqrt(static_cast<double>(queries.size(-1)));
  const double scale = params.scale.value_or(1.0 / sqrt_d);
  const double sdpa_dropout = training ? dropout : 0.0;
  switch (path) {
    case DotProductPath::kSdpa:
      return {mask.allowed.defined()
                  ? sdpa_general_mask(queries, keys, values, mask.allowed, sdpa_dropout)
                  : sdpa_attention(queries, keys, values, mask.lens, mask.range, sdpa_dropout),
              torch::Tensor()};
    case DotProductPath::kFlash:
      return flash_attention(queries, keys, values, mask.lens, scale, need_weights);
    case DotProductPath::kFlashBf16:
      return {flash_attention_bf16(queries, keys, values, mask.lens, scale), torch::Tensor()};
    default: break;
  }
  auto qk = torch::bmm(queries, keys.transpose(1, 2));
  // The book divides by sqrt(d); a given scale multiplies.
  const auto scaled = [&](const torch::Tensor& x) { return params.scale ? x * scale : x / sqrt_d; };
  // The fused kernel folds the 1/sqrt(d) scaling into its exponentials, and
  // without autograd writes the weights over qk, which nothing else holds.
  auto weights = mask.allowed.defined() ? composite_masked_softmax_where(scaled(qk), mask.allowed)
                 : path == DotProductPath::kFusedSoftmax
                     ? fused_masked_softmax_consuming(std::move(qk), mask.lens, scale)
                     : composite_masked_softmax(scaled(qk), mask.lens);
  auto output = torch::bmm(dropout_weights(weights, dropout, training), values);
  if (!need_weights) weights = torch::Tensor();
  return {std::move(output), std::move(weights)};
}

}  // namespace detail

namespace detail {
namespace {

// The checks of functional::dot_product_attention, and what decides its path.
DotProductParams checked_params(const char* fn, const torch::Tensor& queries,
                                const torch::Tensor& keys, const torch::Tensor& values,
                                const functional::DotProductAttentionFuncOptions& options) {
  const auto range = check_qkv(fn, queries, keys, values, options.valid_lens());
  check_masks(fn, options.mask(), queries, keys);
  return {queries,
          keys,
          values,
          resolve_masks(fn, options.mask(), range, queries.size(0), queries.size(1), keys.size(1),
                        queries.device()),
          options.backend(),
          options.dropout(),
          options.training(),
          options.need_weights()};
}

}  // namespace
}  // namespace detail

namespace functional {

std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const DotProductAttentionFuncOptions& options) {
  constexpr const char* fn = "d2l::dot_product_attention";
  return detail::dot_product_attention(fn,
                                       detail::checked_params(fn, queries, keys, values, options));
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values,
                             const functional::DotProductAttentionFuncOptions& options) {
  constexpr const char* fn = "d2l::dot_product_attention";
  return detail::explain_dot_product_attention(
      fn, detail::checked_params(fn, queries, keys, values, options));
}

DotProductAttentionImpl::DotProductAttentionImpl(double dropout)
    : DotProductAttentionImpl(DotProductAttentionOptions().dropout(dropout)) {}

DotProductAttentionImpl::DotProductAttentionImpl(const DotProductAttentionOptions& options_)
    : options(options_) {
  reset();
}

void DotProductAttentionImpl::reset() {
  detail::check_dropout("d2l::DotProductAttention", options.dropout());
  dropout = register_module("dropout", torch::nn::Dropout(options.dropout()));
}

void DotProductAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::DotProductAttention(dropout={})", options.dropout());
}

namespace {

// What forward runs: the registered dropout module's p and mode (as in the
// book) and the module's options.
functional::DotProductAttentionFuncOptions module_call(const DotProductAttentionImpl& module,
                                                       const AttentionMask& mask,
                                                       bool need_weights) {
  return functional::DotProductAttentionFuncOptions()
      .mask(mask)
      .dropout(module.dropout->options.p())
      .training(module.dropout->is_training())
      .backend(module.options.backend())
      .need_weights(need_weights);
}

}  // namespace

torch::Tensor DotProductAttentionImpl::forward(const torch::Tensor& queries,
                                               const torch::Tensor& keys,
                                               const torch::Tensor& values,
                                               const AttentionMask& mask) {
  const bool record = detail::records_weights(options.record_attention_weights());
  auto [output, weights] =
      functional::dot_product_attention(queries, keys, values, module_call(*this, mask, record));
  if (record) detail::record_weights(attention_weights, weights);
  return output;
}

std::tuple<torch::Tensor, torch::Tensor> DotProductAttentionImpl::forward_with_weights(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AttentionMask& mask) {
  return functional::dot_product_attention(queries, keys, values,
                                           module_call(*this, mask, /*need_weights=*/true));
}

PathExplanation DotProductAttentionImpl::explain_path(const torch::Tensor& queries,
                                                      const torch::Tensor& keys,
                                                      const torch::Tensor& values,
                                                      const AttentionMask& mask) const {
  return d2l::explain_path(
      queries, keys, values,
      module_call(*this, mask, detail::records_weights(options.record_attention_weights())));
}

torch::Tensor DotProductAttentionImpl::last_attention_weights() const {
  return detail::load_weights(attention_weights);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void DotProductAttentionImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::DotProductAttention::load");
}

}  // namespace d2l
