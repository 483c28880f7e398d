// d2l::nn::functional::scaled_dot_product_attention: Python's semantics
// (Note [Python's SDPA]) over the library's paths. The checks come first;
// then the call is flattened to the (B, n, d) batches the kernels take, its
// mask turned into lengths where it is a prefix in every row, and its
// grouped-query heads folded into the queries (Note [Grouped heads as
// longer entries]); the path is select_scaled_dot_product's (select.cpp).

#include <d2l/scaled_dot_product_attention.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "checks.h"
#include "cpu/kernel_args.h"
#include "dot_product_attention_internal.h"
#include "scaled_dot_product_attention_internal.h"
#include "select.h"

// Note [Python's SDPA]
// The function follows torch.nn.functional.scaled_dot_product_attention of
// PyTorch 2.11, checked case by case against it (tests/test_sdpa.cpp, fixtures
// from tests/fixtures/generate_fixtures_sdpa.py): inputs of at least two
// dimensions whose leading ones broadcast; a boolean mask that keeps a pair
// where true, or a float one added to the scaled scores; is_causal aligned at
// the top left and refused beside a mask; dropout drawn whenever dropout_p >
// 0; enable_gqa repeating each key/value head for its group of query heads
// (here: reading it in place); a row that sees no key gives zeros, forward
// and backward (Python's _safe_softmax, 2.5 and later; 2.1-2.4 gave NaN).
// Where Python accepts what cannot be meant, this refuses it, naming the
// argument: dropout_p outside [0, 1) (Python ignores a negative one and
// zeroes everything at 1), NaN or +inf in a float mask and a non-finite
// scale (Python returns NaN).
//
// Note [Grouped heads as longer entries]
// With query heads h = r · g + i (i < g) reading key/value head r, the g
// query heads of a group are contiguous in (B, Hq, L, E): viewed as (B ·
// Hkv, g · L, E) they are one batch entry of g · L queries over that
// entry's keys and values. So every kernel that takes (B, n, d) batches and
// lengths per query runs grouped-query attention unchanged, reading each
// key/value head once per block of queries (from any of the g heads), with
// dK and dV summed over the group inside the entry: no repeat, no scratch.
// Lengths per query, (B · Hq, L), view as (B · Hkv, g · L) the same way.

namespace d2l::detail {
namespace {

// The lengths (entries, L) of a mask that keeps a prefix of the keys in
// every row, undefined where every row keeps every key; nullopt for any
// other mask. `why` says what keeps it from lengths.
std::optional<torch::Tensor> mask_as_lengths(const SdpaCall& c, std::string* why) {
  const int64_t B = c.entries();
  if (c.is_causal) {
    if (c.diagonal == 0 && c.S <= 1) return torch::Tensor();  // every row sees every key
    auto lens = torch::arange(1 + c.diagonal, c.L + 1 + c.diagonal, torch::kLong).clamp(0, c.S);
    return lens.expand({B, c.L}).contiguous();
  }
  if (!c.mask.defined()) return torch::Tensor();
  auto keep = c.mask;
  if (keep.scalar_type() != torch::kBool) {
    const auto neginf = torch::isneginf(keep);
    if (!neginf.logical_or(keep == 0).all().item<bool>()) {
      *why = "a float attn_mask with biases other than 0 and -inf (the kernels mask by lengths)";
      return std::nullopt;
    }
    keep = neginf.logical_not();
  }
  auto sizes = keep.sizes().vec();
  sizes.back() = c.S;
  keep = keep.expand(sizes);
  const auto counts = keep.sum(-1);  // int64
  const auto prefix = torch::arange(c.S, counts.options()) < counts.unsqueeze(-1);
  if (!prefix.eq(keep).all().item<bool>()) {
    *why =
        "an attn_mask that is not a prefix of the keys in every row (the kernels mask by "
        "lengths)";
    return std::nullopt;
  }
  if (counts.numel() == 0 || counts.min().item<int64_t>() == c.S) return torch::Tensor();
  Shape rows = c.batch;
  rows.push_back(c.L);
  return counts.expand(rows).reshape({B, c.L}).contiguous();
}

// The bands (Note [Bands of keys]) of a call with a window: (1, L, 2), every
// entry alike, or (entries, L, 2) where a prefix mask shortens them per
// entry; nullopt where the mask is no prefix (the composite path applies it).
std::optional<torch::Tensor> window_as_bands(const SdpaCall& c, std::string* why) {
  auto bands = window_bands(c);
  if (c.is_causal || !c.mask.defined()) return bands;
  SdpaCall unwindowed = c;
  unwindowed.window_left = unwindowed.window_right = std::nullopt;
  const auto lens = mask_as_lengths(unwindowed, why);
  if (!lens) return std::nullopt;
  if (!lens->defined()) return bands;
  const auto first = bands.select(2, 0).expand({c.entries(), c.L});
  const auto end = torch::minimum(bands.select(2, 1).expand({c.entries(), c.L}), *lens);
  const auto empty = first >= end;
  return torch::stack({first.masked_fill(empty, 0), end.masked_fill(empty, 0)}, -1).contiguous();
}

// The group size the kernels fold: the query heads per key/value head where
// keys and values have the same heads, else 1 (both repeated to Hq).
int64_t fold_group(const SdpaCall& c) {
  return c.gqa && c.heads_k == c.heads_v ? c.heads_q() / c.heads_k : 1;
}

DotProductParams placeholder_params(const SdpaCall& c, ResolvedMask mask) {
  const int64_t g = fold_group(c), B = c.entries() / std::max<int64_t>(g, 1);
  const auto one = torch::empty({1, 1, 1}, c.query.options());
  return {one.expand({B, g * c.L, c.E}),
          one.expand({B, c.S, c.E}),
          one.expand({B, c.S, c.Ev}),
          std::move(mask),
          c.backend,
          c.dropout,
          /*training=*/c.dropout > 0,
          /*need_weights=*/false,
          c.scale};
}

// What decides the path, with the mask resolved where the kernels could run.
DotProductParams params_of(const SdpaCall& c, std::string* why) {
  ResolvedMask mask;
  const bool kernels_could_run = c.query.device().is_cpu() &&
                                 c.backend != AttentionBackend::kComposite &&
                                 c.backend != AttentionBackend::kSdpa;
  if (kernels_could_run) {
    if (c.E == 0) {
      mask.general_because = "E = 0 (every score is 0: uniform weights)";
    } else if (c.entries() == 0 || c.L == 0 || c.S == 0) {
      mask.general_because = "a size is zero";
    } else if (c.windowed() && c.dropout > 0) {
      mask.general_because =
          "dropout with a sliding window (the fused softmax that draws it masks by lengths)";
    } else if (auto lens = c.windowed() ? window_as_bands(c, why) : mask_as_lengths(c, why)) {
      mask.lens = std::move(*lens);
      if (mask.lens.dim() == 2) {
        mask.range = LengthRange{static_cast<double>(mask.lens.min().item<int64_t>()),
                                 static_cast<double>(mask.lens.max().item<int64_t>()),
                                 {}};
      }
    } else {
      mask.general_because = *why;
    }
  }
  return placeholder_params(c, std::move(mask));
}

// Keys or values of `heads` heads for the kernels: expanded to the call's
// leading dimensions with Hq / g heads, repeated where keys and values
// differ in heads, as (entries / g, S, features).
torch::Tensor flatten_kv(const SdpaCall& c, const torch::Tensor& t, int64_t heads, int64_t g) {
  auto x = t;
  Shape sizes = c.batch;
  if (c.gqa) {
    if (g == 1 && heads != c.heads_q()) x = x.repeat_interleave(c.heads_q() / heads, -3);
    sizes.back() = c.heads_q() / g;
  }
  sizes.push_back(c.S);
  sizes.push_back(t.size(-1));
  return contiguous_input(x.expand(sizes)).view({-1, c.S, t.size(-1)});
}

// Python's math path, the readable oracle every other path is tested
// against: the mask applied as Python applies it, then softmax (zeros for a
// row that sees no key), dropout and the values. float16 and bfloat16 run
// in float on the CPU, as Python's math path runs them.
torch::Tensor composite(const SdpaCall& c) {
  const auto type = c.query.scalar_type();
  const bool widen =
      c.query.device().is_cpu() && (type == torch::kHalf || type == torch::kBFloat16);
  const auto compute = [&](const torch::Tensor& t) { return widen ? t.to(torch::kFloat) : t; };
  auto q = compute(c.query), k = compute(c.key), v = compute(c.value);
  if (c.gqa) {
    k = k.repeat_interleave(c.heads_q() / c.heads_k, -3);
    v = v.repeat_interleave(c.heads_q() / c.heads_v, -3);
  }
  // E = 0: every score is an empty sum, 0, whatever the scale.
  auto scores = at::matmul(q, k.transpose(-2, -1));
  if (c.E > 0) scores = scores * c.scale;
  const double neginf = -std::numeric_limits<double>::infinity();
  if (c.is_causal) {
    const auto keep = torch::ones({c.L, c.S}, q.options().dtype(torch::kBool)).tril(c.diagonal);
    scores = scores.masked_fill(keep.logical_not(), neginf);
  } else if (c.mask.defined()) {
    scores = c.mask.scalar_type() == torch::kBool
                 ? scores.masked_fill(c.mask.logical_not(), neginf)
                 : scores + compute(c.mask).to(scores.scalar_type());
  }
  if (c.windowed()) scores = scores.masked_fill(window_keep(c).logical_not(), neginf);
  // A row of -inf scores gets zero weights and no NaN in its gradient: its
  // scores are made finite before the softmax and its weights zeroed after.
  const auto dead = (scores == neginf).all(-1, /*keepdim=*/true);
  auto weights = torch::softmax(scores.masked_fill(dead, 0), -1).masked_fill(dead, 0);
  if (c.dropout > 0) weights = torch::dropout(weights, c.dropout, /*train=*/true);
  auto out = at::matmul(weights, v);
  return widen ? out.to(type) : out;
}

#if D2L_HAS_SDPA
// LibTorch's own SDPA with the call's arguments; rows that see no key are
// zeroed where LibTorch (before 2.5) leaves NaN there.
torch::Tensor libtorch_sdpa_call(const SdpaCall& c) {
  auto k = c.key, v = c.value;
  auto mask = c.mask.defined() ? std::optional<torch::Tensor>(c.mask) : std::nullopt;
  bool is_causal = c.is_causal;
  if (c.windowed()) {
    // LibTorch has no window: the causal mask and the window as a boolean
    // mask, joined with the caller's.
    const auto keep = window_keep(c);
    if (!mask) {
      mask = keep;
    } else {
      mask = mask->scalar_type() == torch::kBool
                 ? mask->logical_and(keep)
                 : mask->masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity());
    }
    is_causal = false;
  } else if (is_causal && c.diagonal != 0) {
    // LibTorch's is_causal is the upper-left variant: the lower right one is
    // a boolean mask, as Python's causal_lower_right materialises it.
    mask = torch::ones({c.L, c.S}, c.query.options().dtype(torch::kBool)).tril(c.diagonal);
    is_causal = false;
  }
#if D2L_TORCH_VERSION_AT_LEAST(2, 5)
  if (mask && (c.diagonal < 0 || c.windowed())) {
    // Rows that see no key under a mask made here: zeros, whatever the
    // CUDA kernel would give.
    const bool keeps = mask->scalar_type() == torch::kBool;
    const auto dead = keeps ? mask->any(-1, /*keepdim=*/true).logical_not()
                            : torch::isneginf(*mask).all(-1, /*keepdim=*/true);
    const auto alive = keeps ? mask->logical_or(dead) : mask->masked_fill(dead, 0);
    return libtorch_sdpa(c.query, k, v, alive, c.dropout, false, c.scale, c.gqa)
        .masked_fill(dead, 0);
  }
  return libtorch_sdpa(c.query, k, v, mask, c.dropout, is_causal, c.scale, c.gqa);
#else
  if (c.gqa) {
    k = k.repeat_interleave(c.heads_q() / c.heads_k, -3);
    v = v.repeat_interleave(c.heads_q() / c.heads_v, -3);
  }
  torch::Tensor dead;
  if (mask) {
    const auto keep =
        mask->scalar_type() == torch::kBool ? *mask : torch::isneginf(*mask).logical_not();
    dead = keep.any(-1, /*keepdim=*/true).logical_not();
    mask =
        mask->scalar_type() == torch::kBool ? mask->logical_or(dead) : mask->masked_fill(dead, 0);
  }
  auto out = libtorch_sdpa(c.query, k, v, mask, c.dropout, is_causal, c.scale, false);
  return dead.defined() ? out.masked_fill(dead, 0) : out;
#endif
}
#endif

torch::Tensor run(const SdpaCall& c, DotProductParams params, DotProductPath path) {
  switch (path) {
    case DotProductPath::kSdpa:
#if D2L_HAS_SDPA
      return libtorch_sdpa_call(c);
#else
      TORCH_INTERNAL_ASSERT(false, "kSdpa without LibTorch 2.1");
#endif
    case DotProductPath::kComposite: return composite(c);
    default: break;
  }
  const int64_t g = fold_group(c);
  Shape q_sizes = c.batch;
  q_sizes.push_back(c.L);
  q_sizes.push_back(c.E);
  params.queries = contiguous_input(c.query.expand(q_sizes)).view({-1, g * c.L, c.E});
  params.keys = flatten_kv(c, c.key, c.heads_k, g);
  params.values = flatten_kv(c, c.value, c.heads_v, g);
  auto& lens = params.mask.lens;
  if (lens.dim() == 2) lens = lens.view({-1, g * c.L});
  // Bands per entry fold as lengths do; bands shared by every entry repeat
  // with period L, which the folded rows keep.
  if (lens.dim() == 3 && lens.size(0) > 1) lens = lens.view({-1, g * c.L, 2});
  auto out = std::get<0>(run_dot_product_attention(params, path));
  Shape out_sizes = c.batch;
  out_sizes.push_back(c.L);
  out_sizes.push_back(c.Ev);
  return out.view(out_sizes);
}

}  // namespace
}  // namespace d2l::detail

namespace d2l::nn {
namespace functional {

torch::Tensor scaled_dot_product_attention(const torch::Tensor& query, const torch::Tensor& key,
                                           const torch::Tensor& value,
                                           const ScaledDotProductAttentionFuncOptions& options) {
  using namespace d2l::detail;
  const auto call = check_call(query, key, value, options);
  std::string why;
  auto params = params_of(call, &why);
  const bool log = logging_paths();
  const auto selection = select_scaled_dot_product(kSdpaFn, params, log);
  if (log) log_path(kSdpaFn, call.backend, to_string(selection.path), selection.reasons);
  return run(call, std::move(params), selection.path);
}

}  // namespace functional

PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value,
                             const functional::ScaledDotProductAttentionFuncOptions& options) {
  using namespace d2l::detail;
  const auto call = check_call(query, key, value, options);
  std::string why;
  const auto params = params_of(call, &why);
  auto selection = select_scaled_dot_product(kSdpaFn, params, /*explain=*/true);
  return {kSdpaFn, call.backend, to_string(selection.path), std::move(selection.reasons)};
}

}  // namespace d2l::nn
