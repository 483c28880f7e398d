#pragma once

// The checked arguments of d2l::nn::functional::scaled_dot_product_attention
// (Note [Python's SDPA] in scaled_dot_product_attention.cpp): the checks in
// scaled_dot_product_attention_checks.cpp, the paths in
// scaled_dot_product_attention.cpp.

#include <d2l/backend.h>
#include <d2l/scaled_dot_product_attention.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace d2l::detail {

constexpr const char* kSdpaFn = "d2l::nn::functional::scaled_dot_product_attention";

using Shape = std::vector<int64_t>;

// A call's checked arguments and what they come to.
struct SdpaCall {
  torch::Tensor query, key, value, mask;
  /// The output's leading dimensions (..., Hq), and the keys' and values'
  /// heads after broadcasting (Hq without enable_gqa).
  Shape batch;
  int64_t heads_k = 1, heads_v = 1;
  int64_t L = 0, S = 0, E = 0, Ev = 0;
  bool gqa = false, is_causal = false;
  /// The causal diagonal's offset: query i sees keys j <= i + diagonal (0,
  /// or S - L for CausalVariant::kLowerRight).
  int64_t diagonal = 0;
  /// The sliding window's edges (unset: unbounded), about the diagonal.
  std::optional<int64_t> window_left, window_right;
  double scale = 1.0;
  double dropout = 0.0;
  AttentionBackend backend = AttentionBackend::kAuto;

  int64_t entries() const {
    int64_t n = 1;
    for (auto s : batch) n *= s;
    return n;
  }
  int64_t heads_q() const { return batch.empty() ? 1 : batch.back(); }
  bool windowed() const { return window_left.has_value() || window_right.has_value(); }
};

/// Query i's keys [first, end) among S under a causal mask on `diagonal`
/// and a window about it (Note [Bands of keys]); [0, 0) where it sees none.
std::pair<int64_t, int64_t> row_band(int64_t i, int64_t S, int64_t diagonal, bool causal,
                                     std::optional<int64_t> left, std::optional<int64_t> right);

/// row_band of queries 0 .. L - 1 as a (1, L, 2) int64 tensor of bands.
torch::Tensor window_bands(const SdpaCall& c);

/// Which of the (L, S) pairs the causal mask and the window keep (boolean).
torch::Tensor window_keep(const SdpaCall& c);

/// The checks of the options that stand alone (dropout_p, scale, the
/// window), as `fn`'s errors.
void check_options(const char* fn,
                   const nn::functional::ScaledDotProductAttentionFuncOptions& options);

/// The call's checks, Python's and ours, before anything runs: each bad
/// argument a c10::Error naming kSdpaFn, the argument and what it got.
SdpaCall check_call(const torch::Tensor& query, const torch::Tensor& key,
                    const torch::Tensor& value,
                    const nn::functional::ScaledDotProductAttentionFuncOptions& options);

}  // namespace d2l::detail
