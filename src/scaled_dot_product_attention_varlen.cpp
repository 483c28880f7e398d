// d2l::nn::functional::scaled_dot_product_attention_varlen: packed
// sequences of different lengths with no padding (Note [Packed sequences as
// bands]). The checks, the bands, and the two ways it runs: one kernel call
// over every sequence and head, or, off the kernels (CUDA, dropout, the
// composite path asked, zero sizes), scaled_dot_product_attention on each
// sequence in turn, which is also the oracle the kernel call is tested
// against.

#include <d2l/scaled_dot_product_attention.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "cpu/kernel_args.h"
#include "dot_product_attention_internal.h"
#include "scaled_dot_product_attention_internal.h"
#include "select.h"

// Note [Packed sequences as bands]
// Packed, the B sequences of a head are one batch entry of Tq queries over Tk
// keys in which query row t of sequence s attends to the keys of s only:
// the band [cu_k[s] + first, cu_k[s] + end) where [first, end) is its band
// within the sequence (causal, the window; row_band). So one call of the
// flash kernels (Note [Bands of keys]) runs every sequence and head: (Hkv,
// g · Tq, E) with the g query heads of a key/value head folded into the
// entry (Note [Grouped heads as longer entries]) and bands shared by the g
// heads (period Tq). A block of rows visits only the keys between its
// rows' bands, so sequences cost what their own attention costs, and the
// threads split the blocks by their cost, not by sequence: one long
// sequence among short ones is spread over every thread. The queries are
// transposed to heads first (one copy of Q, K and V, as padding to (B, H,
// L, E) would also take), the output back.

namespace d2l::detail {
namespace {

constexpr const char* kVarlenFn = "d2l::nn::functional::scaled_dot_product_attention_varlen";

struct VarlenCall {
  torch::Tensor query, key, value;
  std::vector<int64_t> cu_q, cu_k;  // (B + 1), on the host
  int64_t heads_q = 0, heads_k = 0, heads_v = 0;
  nn::functional::ScaledDotProductAttentionFuncOptions options;
  double scale = 1.0;

  int64_t sequences() const { return static_cast<int64_t>(cu_q.size()) - 1; }
  int64_t Tq() const { return query.size(0); }
  // The query heads folded per key/value head: 1 where keys and values
  // differ in heads (both repeated to Hq then).
  int64_t group() const { return heads_k == heads_v ? heads_q / heads_k : 1; }
};

std::vector<int64_t> checked_offsets(const char* name, const torch::Tensor& cu, int64_t total,
                                     const char* rows) {
  TORCH_CHECK(cu.defined(), fmt::format("{}: {} must be a defined tensor", kVarlenFn, name));
  TORCH_CHECK(cu.dim() == 1 && cu.numel() >= 1 &&
                  (cu.scalar_type() == torch::kInt || cu.scalar_type() == torch::kLong),
              fmt::format("{}: {} must be 1-D int32 or int64 offsets (B + 1), got {} {}", kVarlenFn,
                          name, c10::toString(cu.scalar_type()), shape_of(cu)));
  const auto host = cu.to(torch::kCPU, torch::kLong).contiguous();
  std::vector<int64_t> out(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  TORCH_CHECK(out.front() == 0,
              fmt::format("{}: {} must start at 0, got {}", kVarlenFn, name, out.front()));
  for (size_t s = 1; s < out.size(); ++s) {
    TORCH_CHECK(out[s] >= out[s - 1],
                fmt::format("{}: {} must be non-decreasing, got {} then {} at index {}", kVarlenFn,
                            name, out[s - 1], out[s], s));
  }
  TORCH_CHECK(out.back() == total,
              fmt::format("{}: {} must end at the number of {} rows, {}, got {}", kVarlenFn, name,
                          rows, total, out.back()));
  return out;
}

VarlenCall check_varlen(const torch::Tensor& query, const torch::Tensor& key,
                        const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                        const torch::Tensor& cu_seqlens_k,
                        const nn::functional::ScaledDotProductAttentionFuncOptions& options) {
  const std::pair<const char*, const torch::Tensor*> inputs[] = {
      {"query", &query}, {"key", &key}, {"value", &value}};
  for (const auto& [name, t] : inputs) {
    TORCH_CHECK(t->defined(), fmt::format("{}: {} must be a defined tensor", kVarlenFn, name));
    check_strided_layout(kVarlenFn, name, *t);
    TORCH_CHECK(t->dim() == 3, fmt::format("{}: {} must be (total tokens, heads, features), got {}",
                                           kVarlenFn, name, shape_of(*t)));
    TORCH_CHECK(at::isFloatingType(t->scalar_type()),
                fmt::format("{}: {} must have a floating-point dtype, got {}", kVarlenFn, name,
                            c10::toString(t->scalar_type())));
  }
  check_same_dtype(kVarlenFn, "query", query, "key", key);
  check_same_dtype(kVarlenFn, "query", query, "value", value);
  check_same_device(kVarlenFn, "query", query, "key", key);
  check_same_device(kVarlenFn, "query", query, "value", value);
  TORCH_CHECK(query.size(2) == key.size(2) && key.size(0) == value.size(0),
              fmt::format("{}: query and key must have the same features E, and key and value "
                          "the same tokens, got query {}, key {} and value {}",
                          kVarlenFn, shape_of(query), shape_of(key), shape_of(value)));
  const int64_t hq = query.size(1), hk = key.size(1), hv = value.size(1);
  TORCH_CHECK(hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0,
              fmt::format("{}: the query heads must be a multiple of the key and value heads, "
                          "got query {}, key {} and value {}",
                          kVarlenFn, shape_of(query), shape_of(key), shape_of(value)));
  check_options(kVarlenFn, options);
  TORCH_CHECK(!options.attn_mask().defined(),
              fmt::format("{}: attn_mask is not taken (packed sequences have no padding; use "
                          "is_causal and the window), got attn_mask {}",
                          kVarlenFn, shape_of(options.attn_mask())));
  VarlenCall c;
  c.cu_q = checked_offsets("cu_seqlens_q", cu_seqlens_q, query.size(0), "query");
  c.cu_k = checked_offsets("cu_seqlens_k", cu_seqlens_k, key.size(0), "key");
  TORCH_CHECK(c.cu_q.size() == c.cu_k.size(),
              fmt::format("{}: cu_seqlens_q and cu_seqlens_k must hold the same number of "
                          "sequences, got {} and {}",
                          kVarlenFn, shape_of(cu_seqlens_q), shape_of(cu_seqlens_k)));
  c.query = query, c.key = key, c.value = value;
  c.heads_q = hq, c.heads_k = hk, c.heads_v = hv;
  c.options = options;
  c.scale = options.scale().value_or(1.0 / std::sqrt(static_cast<double>(query.size(2))));
  return c;
}

// Each packed query's keys (Note [Packed sequences as bands]): (1, Tq, 2).
torch::Tensor packed_bands(const VarlenCall& c) {
  auto bands = torch::empty({1, c.Tq(), 2}, torch::kLong);
  auto* data = bands.data_ptr<int64_t>();
  const bool lower_right = c.options.causal_variant() == nn::functional::CausalVariant::kLowerRight;
  for (int64_t s = 0; s < c.sequences(); ++s) {
    const int64_t L = c.cu_q[s + 1] - c.cu_q[s], S = c.cu_k[s + 1] - c.cu_k[s];
    for (int64_t i = 0; i < L; ++i) {
      auto [first, end] = row_band(i, S, lower_right ? S - L : 0, c.options.is_causal(),
                                   c.options.window_left(), c.options.window_right());
      if (end > 0) first += c.cu_k[s], end += c.cu_k[s];
      const int64_t t = c.cu_q[s] + i;
      data[2 * t] = first;
      data[2 * t + 1] = end;
    }
  }
  return bands;
}

// Why the kernels cannot run the call in one go, or empty where they can.
std::string off_kernels(const VarlenCall& c) {
  const auto backend = c.options.backend();
  if (!c.query.device().is_cpu()) return "not on the CPU (each sequence on its own)";
  if (backend == AttentionBackend::kComposite || backend == AttentionBackend::kSdpa) {
    return "a backend was asked for (each sequence on its own, on it)";
  }
  if (c.options.dropout_p() > 0) {
    return "dropout (each sequence on its own: the fused softmax that draws it masks by lengths)";
  }
  if (c.query.size(0) == 0 || c.key.size(0) == 0 || c.query.size(2) == 0) {
    return "a size is zero (each sequence on its own)";
  }
  return {};
}

// The kernel call's placeholder parameters: (Hkv, g · Tq, E) queries.
DotProductParams kernel_params(const VarlenCall& c, torch::Tensor bands) {
  const int64_t g = c.group();
  const auto one = torch::empty({1, 1, 1}, c.query.options());
  ResolvedMask mask;
  mask.lens = std::move(bands);
  return {one.expand({c.heads_q / g, g * c.Tq(), c.query.size(2)}),
          one.expand({c.heads_q / g, c.key.size(0), c.key.size(2)}),
          one.expand({c.heads_q / g, c.key.size(0), c.value.size(2)}),
          std::move(mask),
          c.options.backend(),
          0.0,
          /*training=*/false,
          /*need_weights=*/false,
          c.scale};
}

// (T, H, F) as (H / g, g · T, F) heads first, repeated to `heads` where g = 1
// and the heads differ.
torch::Tensor heads_first(const torch::Tensor& t, int64_t heads, int64_t g) {
  auto x = t.transpose(0, 1);
  if (g == 1 && t.size(1) != heads) x = x.repeat_interleave(heads / t.size(1), 0);
  return contiguous_input(x).view({heads / g, -1, t.size(2)});
}

torch::Tensor run_kernels(const VarlenCall& c, DotProductParams params, DotProductPath path) {
  const int64_t g = c.group();
  params.queries = heads_first(c.query, c.heads_q, g);
  params.keys = heads_first(c.key, c.heads_q / g, 1);
  params.values = heads_first(c.value, c.heads_q / g, 1);
  const auto out = std::get<0>(run_dot_product_attention(params, path));
  // A view: a contiguous copy would be a fourth buffer of the call's size,
  // whose first touch alone (page faults) costs as much as copying it.
  return out.view({c.heads_q, c.Tq(), c.value.size(2)}).transpose(0, 1);
}

// scaled_dot_product_attention on each sequence in turn.
torch::Tensor run_each(const VarlenCall& c) {
  auto options = c.options;
  options.enable_gqa(c.heads_k != c.heads_q || c.heads_v != c.heads_q);
  std::vector<torch::Tensor> outs;
  for (int64_t s = 0; s < c.sequences(); ++s) {
    const auto q = c.query.narrow(0, c.cu_q[s], c.cu_q[s + 1] - c.cu_q[s]).transpose(0, 1);
    const auto k = c.key.narrow(0, c.cu_k[s], c.cu_k[s + 1] - c.cu_k[s]).transpose(0, 1);
    const auto v = c.value.narrow(0, c.cu_k[s], c.cu_k[s + 1] - c.cu_k[s]).transpose(0, 1);
    outs.push_back(nn::functional::scaled_dot_product_attention(q, k, v, options).transpose(0, 1));
  }
  if (outs.empty()) return torch::empty({0, c.heads_q, c.value.size(2)}, c.query.options());
  return torch::cat(outs, 0);
}

struct VarlenPath {
  Selection<DotProductPath> selection;
  std::optional<DotProductParams> params;  // where the kernels run
};

VarlenPath choose(const VarlenCall& c, bool explain) {
  const std::string why = off_kernels(c);
  if (!why.empty()) {
    Selection<DotProductPath> each{DotProductPath::kComposite, {}};
    if (explain) each.reasons.push_back("flash: " + why);
    return {std::move(each), std::nullopt};
  }
  auto params = kernel_params(c, packed_bands(c));
  auto selection = select_dot_product(kVarlenFn, params, explain);
  return {std::move(selection), std::move(params)};
}

}  // namespace
}  // namespace d2l::detail

namespace d2l::nn {
namespace functional {

torch::Tensor scaled_dot_product_attention_varlen(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const torch::Tensor& cu_seqlens_q, const torch::Tensor& cu_seqlens_k,
    const ScaledDotProductAttentionFuncOptions& options) {
  using namespace d2l::detail;
  const auto call = check_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options);
  const bool log = logging_paths();
  auto [selection, params] = choose(call, log);
  if (log) {
    log_path(kVarlenFn, options.backend(), params ? to_string(selection.path) : "per_sequence",
             selection.reasons);
  }
  if (!params) return run_each(call);
  return run_kernels(call, std::move(*params), selection.path);
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                             const torch::Tensor& cu_seqlens_k,
                             const functional::ScaledDotProductAttentionFuncOptions& options) {
  using namespace d2l::detail;
  const auto call = check_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options);
  auto [selection, params] = choose(call, /*explain=*/true);
  const char* path = params ? to_string(selection.path) : "per_sequence";
  return {kVarlenFn, options.backend(), path, std::move(selection.reasons)};
}

}  // namespace d2l::nn
