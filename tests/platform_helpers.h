#pragma once

// What test_platform.cpp and test_platform_sdpa.cpp share: dot-product
// attention on a given path, and the valid lengths every path is checked with.

#include <torch/torch.h>

#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace d2l::testing {

inline std::tuple<torch::Tensor, torch::Tensor> dot(const torch::Tensor& q, const torch::Tensor& k,
                                                    const torch::Tensor& v,
                                                    const torch::Tensor& lens,
                                                    AttentionBackend path,
                                                    bool need_weights = false) {
  return d2l::functional::dot_product_attention(q, k, v,
                                                d2l::functional::DotProductAttentionFuncOptions()
                                                    .valid_lens(lens)
                                                    .dropout(0.0)
                                                    .training(false)
                                                    .backend(path)
                                                    .need_weights(need_weights));
}

inline std::vector<torch::Tensor> length_cases(int64_t B, int64_t n, int64_t m) {
  return {torch::Tensor(), torch::randint(0, m + 3, {B}),    // 0, below, at and above m
          torch::randint(0, m + 3, {B, n}),                  // per query
          torch::randint(0, m + 3, {B}).to(torch::kDouble),  // whole numbers in float
          torch::zeros({B}, torch::kLong),                   // no valid key at all
          // The SDPA path's shortcuts: no row without a key (no fix-up), one
          // length for all (keys narrowed, no mask), every key valid (no mask).
          torch::randint(1, m + 1, {B, n}), torch::full({B}, (m + 1) / 2, torch::kLong),
          torch::full({B}, m + 1, torch::kInt)};
}

}  // namespace d2l::testing
