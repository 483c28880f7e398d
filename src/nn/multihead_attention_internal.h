#pragma once

// d2l::nn::MultiheadAttention's checks and what a call runs
// (nn/multihead_attention_checks.cpp), for nn/multihead_attention.cpp.

#include <d2l/nn.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace d2l::nn::impl {

// The sizes of one call: L queries, S keys, N batch entries, E features.
struct Sizes {
  int64_t L = 0, S = 0, N = 0, E = 0;
};

// A float mask as Python uses it: 0 and -inf only is a boolean mask (true at
// -inf); NaN and +inf are refused (adding them makes a row NaN).
struct ReadMask {
  torch::Tensor as_bool;   // defined when the mask is boolean or 0/-inf
  torch::Tensor additive;  // defined otherwise, in the scores' dtype
};

/// The call's masks read once, whether it takes the additive path and why,
/// and the projections' weights as the separate or packed ones give them.
struct Plan {
  Sizes s;
  ReadMask kpm, attn;
  bool additive = false;
  std::string why_additive;
  torch::Tensor W_q, W_k, W_v, b_q, b_k, b_v;
};

/// The checks of every argument (errors naming `fn`, before any
/// computation), then the plan.
Plan plan_call(const char* fn, const torch::Tensor& query, const torch::Tensor& key,
               const torch::Tensor& value,
               const functional::MultiheadAttentionForwardFuncOptions& o);

}  // namespace d2l::nn::impl
