// The checks of d2l::nn::functional::scaled_dot_product_attention: Python's
// (inputs, broadcasting, grouped heads, the mask's dtype and shape) and the
// library's own refusals (Note [Python's SDPA]).

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "checks.h"
#include "dot_product_attention_internal.h"
#include "scaled_dot_product_attention_internal.h"

namespace d2l::detail {
namespace {

Shape leading(const torch::Tensor& t) { return {t.sizes().begin(), t.sizes().end() - 2}; }

std::string shape_string(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Python's broadcast of two shapes, or nullopt where they do not broadcast.
std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < out.size() - a.size() ? 1 : a[i - (out.size() - a.size())];
    const int64_t y = i < out.size() - b.size() ? 1 : b[i - (out.size() - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

void check_mask(const SdpaCall& c) {
  const auto& mask = c.mask;
  check_strided_layout(kSdpaFn, "attn_mask", mask);
  const auto type = mask.scalar_type();
  TORCH_CHECK(type == torch::kBool || type == torch::kFloat || type == c.query.scalar_type(),
              fmt::format("{}: attn_mask must be boolean (true: the pair takes part), float32 or "
                          "the query's dtype {}, got {} attn_mask {}",
                          kSdpaFn, c10::toString(c.query.scalar_type()), c10::toString(type),
                          shape_of(mask)));
  check_same_device(kSdpaFn, "query", c.query, "attn_mask", mask);
  Shape scores = c.batch;
  scores.push_back(c.L);
  scores.push_back(c.S);
  const Shape given(mask.sizes().begin(), mask.sizes().end());
  const auto joined = broadcast(given, scores);
  TORCH_CHECK(joined && *joined == scores,
              fmt::format("{}: attn_mask {} must broadcast to the scores' shape {} (the output's "
                          "leading dimensions, L = {} queries, S = {} keys)",
                          kSdpaFn, shape_of(mask), shape_string(scores), c.L, c.S));
  if (type != torch::kBool && mask.numel() > 0) {
    TORCH_CHECK(!torch::isnan(mask).any().item<bool>(),
                fmt::format("{}: attn_mask {} holds NaN (use -inf to leave a pair out)", kSdpaFn,
                            shape_of(mask)));
    TORCH_CHECK(!torch::isposinf(mask).any().item<bool>(),
                fmt::format("{}: attn_mask {} holds +inf, which makes the softmax NaN", kSdpaFn,
                            shape_of(mask)));
  }
}

}  // namespace

void check_options(const char* fn,
                   const nn::functional::ScaledDotProductAttentionFuncOptions& options) {
  const double p = options.dropout_p();
  TORCH_CHECK(p >= 0 && p < 1, fmt::format("{}: dropout_p must be in [0, 1), got {}", fn, p));
  TORCH_CHECK(!options.scale() || std::isfinite(*options.scale()),
              fmt::format("{}: scale must be finite, got {}", fn, options.scale().value_or(0)));
  for (const auto& [name, edge] : {std::pair{"window_left", options.window_left()},
                                   std::pair{"window_right", options.window_right()}}) {
    TORCH_CHECK(!edge || *edge >= 0,
                fmt::format("{}: {} must be at least 0 (or unset: unbounded), got {}", fn, name,
                            edge.value_or(0)));
  }
}

SdpaCall check_call(const torch::Tensor& query, const torch::Tensor& key,
                    const torch::Tensor& value,
                    const nn::functional::ScaledDotProductAttentionFuncOptions& options) {
  const std::pair<const char*, const torch::Tensor*> inputs[] = {
      {"query", &query}, {"key", &key}, {"value", &value}};
  for (const auto& [name, t] : inputs) {
    TORCH_CHECK(t->defined(), fmt::format("{}: {} must be a defined tensor", kSdpaFn, name));
    check_strided_layout(kSdpaFn, name, *t);
    TORCH_CHECK(t->dim() >= 2, fmt::format("{}: {} must have at least 2 dimensions (..., L or S, "
                                           "E), got {}",
                                           kSdpaFn, name, shape_of(*t)));
    TORCH_CHECK(at::isFloatingType(t->scalar_type()),
                fmt::format("{}: {} must have a floating-point dtype, got {}", kSdpaFn, name,
                            c10::toString(t->scalar_type())));
  }
  check_same_dtype(kSdpaFn, "query", query, "key", key);
  check_same_dtype(kSdpaFn, "query", query, "value", value);
  check_same_device(kSdpaFn, "query", query, "key", key);
  check_same_device(kSdpaFn, "query", query, "value", value);
  TORCH_CHECK(query.size(-1) == key.size(-1),
              fmt::format("{}: query and key must have the same feature size E, got query {} and "
                          "key {}",
                          kSdpaFn, shape_of(query), shape_of(key)));
  TORCH_CHECK(key.size(-2) == value.size(-2),
              fmt::format("{}: key and value must have the same number of keys S, got key {} and "
                          "value {}",
                          kSdpaFn, shape_of(key), shape_of(value)));
  check_options(kSdpaFn, options);
  TORCH_CHECK(!(options.is_causal() && options.attn_mask().defined()),
              fmt::format("{}: is_causal and attn_mask are exclusive (as in Python), got "
                          "is_causal with attn_mask {}",
                          kSdpaFn, shape_of(options.attn_mask())));

  const double p = options.dropout_p();
  SdpaCall c;
  c.query = query, c.key = key, c.value = value, c.mask = options.attn_mask();
  c.L = query.size(-2), c.S = key.size(-2), c.E = query.size(-1), c.Ev = value.size(-1);
  c.is_causal = options.is_causal();
  if (options.causal_variant() == nn::functional::CausalVariant::kLowerRight)
    c.diagonal = c.S - c.L;
  c.window_left = options.window_left(), c.window_right = options.window_right();
  c.dropout = p;
  c.backend = options.backend();
  c.scale = options.scale().value_or(1.0 / std::sqrt(static_cast<double>(c.E)));
  Shape q = leading(query), k = leading(key), v = leading(value);
  if (options.enable_gqa() && !q.empty() && !k.empty() && !v.empty()) {
    const int64_t hq = q.back(), hk = k.back(), hv = v.back();
    TORCH_CHECK(hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0,
                fmt::format("{}: with enable_gqa the query heads (dimension -3) must be a "
                            "multiple of the key and value heads, got query {}, key {} and "
                            "value {}",
                            kSdpaFn, shape_of(query), shape_of(key), shape_of(value)));
    c.gqa = hk != hq || hv != hq;
    c.heads_k = hk, c.heads_v = hv;
    k.back() = hq, v.back() = hq;  // broadcast the rest as if repeated
  }
  auto batch = broadcast(q, k);
  if (batch) batch = broadcast(*batch, v);
  TORCH_CHECK(batch.has_value(),
              fmt::format("{}: the leading dimensions of query {}, key {} and value {} do not "
                          "broadcast{}",
                          kSdpaFn, shape_of(query), shape_of(key), shape_of(value),
                          options.enable_gqa() ? ""
                                               : " (fewer key/value heads than query heads need "
                                                 "enable_gqa)"));
  c.batch = std::move(*batch);
  if (!c.gqa) c.heads_k = c.heads_v = c.heads_q();
  if (c.mask.defined()) check_mask(c);
  return c;
}

std::pair<int64_t, int64_t> row_band(int64_t i, int64_t S, int64_t diagonal, bool causal,
                                     std::optional<int64_t> left, std::optional<int64_t> right) {
  const int64_t p = i + diagonal;
  const int64_t first = left ? std::max<int64_t>(0, p - *left) : 0;
  int64_t end = S;
  if (right) end = std::min(end, p + *right + 1);
  if (causal) end = std::min(end, p + 1);
  return first < end ? std::pair{first, end} : std::pair<int64_t, int64_t>{0, 0};
}

torch::Tensor window_bands(const SdpaCall& c) {
  auto bands = torch::empty({1, c.L, 2}, torch::kLong);
  auto* data = bands.data_ptr<int64_t>();
  for (int64_t i = 0; i < c.L; ++i) {
    std::tie(data[2 * i], data[2 * i + 1]) =
        row_band(i, c.S, c.diagonal, c.is_causal, c.window_left, c.window_right);
  }
  return bands;
}

torch::Tensor window_keep(const SdpaCall& c) {
  return band_keep(window_bands(c), 1, c.L, c.S).view({c.L, c.S}).to(c.query.device());
}

}  // namespace d2l::detail
