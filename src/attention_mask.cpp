// LibTorch's masks as the library's lengths (Note [Masks as lengths]).

#include "attention_mask_internal.h"

#include <fmt/format.h>

#include <vector>

namespace d2l::detail {
namespace {

std::string dtype_and_shape(const torch::Tensor& t) {
  return fmt::format("{} {}", c10::toString(t.scalar_type()), shape_of(t));
}

void check_bool_mask(const char* fn, const char* name, const torch::Tensor& mask,
                     const torch::Tensor& queries, const torch::Tensor& keys,
                     const std::string& shapes, bool shape_ok, const char* meaning) {
  check_strided_layout(fn, name, mask);
  TORCH_CHECK(mask.scalar_type() == torch::kBool && shape_ok,
              fmt::format("{}: {} must be a torch::kBool tensor of shape {} ({}) for queries {} "
                          "and keys {}, got {}{}",
                          fn, name, shapes, meaning, shape_of(queries), shape_of(keys),
                          dtype_and_shape(mask),
                          mask.scalar_type() == torch::kBool
                              ? ""
                              : "; a float mask that adds -inf is (mask == -INFINITY)"));
  check_same_device(fn, "queries", queries, name, mask);
}

// Rows of `mask` (..., m) that are false up to a point and true after it
// (a prefix of seen keys): their lengths, int64 (...), or undefined when some
// row is not so.
torch::Tensor prefix_lengths(const torch::Tensor& mask) {
  const int64_t m = mask.size(-1);
  auto lens = mask.logical_not().sum(-1);
  const auto positions = torch::arange(m, lens.options());
  const bool prefix = torch::equal(mask, positions >= lens.unsqueeze(-1));
  return prefix ? lens : torch::Tensor();
}

// The minimum of two lengths tensors of shapes (B), (B, n) or (1, n), either
// possibly undefined; (B) with (B, n) or (1, n) gives (B, n).
torch::Tensor min_lengths(const torch::Tensor& a, const torch::Tensor& b, int64_t batch,
                          int64_t n) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  if (a.dim() == 1 && b.dim() == 1) return torch::minimum(a, b);
  const auto as_2d = [&](const torch::Tensor& t) {
    return t.dim() == 1 ? t.view({batch, 1}) : t;
  };
  return torch::minimum(as_2d(a), as_2d(b)).expand({batch, n});
}

}  // namespace

void check_masks(const char* fn, const AttentionMask& mask, const torch::Tensor& queries,
                 const torch::Tensor& keys, int64_t heads) {
  const int64_t batch = queries.size(0), n = queries.size(1), m = keys.size(1);
  const auto& kp = mask.key_padding_mask();
  if (kp.defined()) {
    check_bool_mask(fn, "key_padding_mask", kp, queries, keys, fmt::format("[{}, {}]", batch, m),
                    kp.dim() == 2 && kp.size(0) == batch && kp.size(1) == m,
                    "true marks a padding key");
  }
  const auto& am = mask.attn_mask();
  if (am.defined()) {
    const bool rows_ok = (am.dim() == 2 || am.dim() == 3) && am.size(-2) == n && am.size(-1) == m;
    // dim() first: size(0) of a 0-dim mask would be ATen's error, not ours.
    const bool batch_ok =
        am.dim() == 2 ||
        (am.dim() == 3 && (am.size(0) == batch || (heads > 1 && am.size(0) == batch * heads)));
    const auto shapes =
        heads > 1 ? fmt::format("[{}, {}], [{}, {}, {}] or [{}, {}, {}] (batch * num_heads={})", n,
                                m, batch, n, m, batch * heads, n, m, heads)
                  : fmt::format("[{}, {}] or [{}, {}, {}]", n, m, batch, n, m);
    check_bool_mask(fn, "attn_mask", am, queries, keys, shapes, rows_ok && batch_ok,
                    "true marks a pair that may not attend, as in torch::nn::MultiheadAttention; "
                    "the opposite of SDPA's boolean mask");
  }
  TORCH_CHECK(!mask.is_causal() || m >= n,
              fmt::format("{}: is_causal aligns the last query with the last key (query i sees "
                          "keys j <= i + m - n) and needs at least as many keys as queries, got "
                          "queries {} and keys {}; pass an attn_mask for another alignment",
                          fn, shape_of(queries), shape_of(keys)));
}

ResolvedMask resolve_masks(const char* fn, const AttentionMask& mask,
                           const std::optional<LengthRange>& range, int64_t batch, int64_t n,
                           int64_t m, const c10::Device& device) {
  const auto& valid_lens = mask.valid_lens();
  if (!has_masks(mask)) return {valid_lens, range, {}, {}};
  const auto long_options = torch::TensorOptions().dtype(torch::kLong).device(device);
  // Lengths above m mean m; clamped before the conversion, which 1e20 would
  // overflow (as float64: 1.13 has no float16 or bfloat16 clamp on the CPU).
  torch::Tensor lens;
  if (valid_lens.defined()) {
    lens = at::isFloatingType(valid_lens.scalar_type())
               ? valid_lens.to(torch::kDouble).clamp_max(static_cast<double>(m)).to(torch::kLong)
               : valid_lens.to(torch::kLong).clamp_max(m);
  }
  // Masks that lengths cannot express, true where a key is hidden,
  // broadcastable to (B, n, m).
  std::vector<torch::Tensor> hidden;
  std::string because;
  const auto add_general = [&](torch::Tensor hide, const char* name) {
    hidden.push_back(std::move(hide));
    because += fmt::format("{}{} is not a prefix of keys in every row", because.empty() ? "" : "; ",
                           name);
  };
  const auto& kp = mask.key_padding_mask();
  if (kp.defined()) {
    auto kp_lens = prefix_lengths(kp);
    if (kp_lens.defined()) {
      lens = min_lengths(lens, kp_lens, batch, n);
    } else {
      add_general(kp.view({batch, 1, m}), "key_padding_mask");
    }
  }
  if (mask.is_causal()) {
    const auto causal = torch::arange(1 + m - n, 1 + m, long_options).view({1, n});
    lens = min_lengths(lens, causal, batch, n);
    if (lens.size(0) != batch) lens = lens.expand({batch, n});
  }
  if (mask.attn_mask().defined()) {
    const auto& given = mask.attn_mask();
    const auto am = given.dim() == 2 ? given.unsqueeze(0) : given;
    auto am_lens = prefix_lengths(am);
    if (am_lens.defined()) {
      lens = min_lengths(lens, am_lens, batch, n);
      if (lens.size(0) != batch) lens = lens.expand({batch, n});
    } else {
      add_general(am, "attn_mask");
    }
  }
  if (hidden.empty()) {
    // Every key seen by every query: no mask at all, the unmasked paths.
    if (lens.defined()) lens = lens.contiguous();
    auto lens_range = lens.defined() ? check_length_values(fn, "lengths", lens) : std::nullopt;
    if (lens_range && lens_range->shortest >= m) return {{}, std::nullopt, {}, {}};
    return {std::move(lens), std::move(lens_range), {}, {}};
  }
  auto hide = hidden[0];
  for (size_t i = 1; i < hidden.size(); ++i) hide = hide.logical_or(hidden[i]);
  if (lens.defined()) {
    const auto per_query = lens.dim() == 1 ? lens.view({batch, 1}) : lens;
    hide = hide.logical_or(torch::arange(m, long_options) >= per_query.unsqueeze(-1));
  }
  auto allowed = hide.logical_not().expand({batch, n, m}).contiguous();
  return {{}, std::nullopt, std::move(allowed), std::move(because)};
}

ResolvedMask repeat_per_head(ResolvedMask mask, int64_t heads) {
  const auto repeat = [heads](const torch::Tensor& t) {
    return t.defined() ? t.repeat_interleave(heads, /*dim=*/0) : t;
  };
  mask.lens = repeat(mask.lens);
  mask.allowed = repeat(mask.allowed);
  if (mask.range && mask.range->on_host.defined()) {
    mask.range->on_host = repeat(mask.range->on_host);
  }
  return mask;
}

}  // namespace d2l::detail
