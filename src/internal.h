#pragma once

#include <torch/types.h>

namespace d2l::detail {

/// Boolean (rows, cols) mask, true where the column index is below the row's
/// length; `lens` holds `rows` lengths in any shape.
torch::Tensor length_mask(const torch::Tensor& lens, int64_t rows, int64_t cols);

/// Softmax over the last dimension, accumulating float16/bfloat16 in float.
torch::Tensor softmax_last_dim(const torch::Tensor& X);

/// composite::masked_softmax without the argument checks, for callers that
/// have already checked them.
torch::Tensor composite_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens);

/// d2l::masked_softmax without the argument checks.
torch::Tensor masked_softmax_nocheck(const torch::Tensor& X, const torch::Tensor& valid_lens);

}  // namespace d2l::detail

namespace d2l::detail {

/// functional::additive_scores without the argument checks.
torch::Tensor additive_scores_nocheck(const torch::Tensor& projected_queries,
                                      const torch::Tensor& projected_keys,
                                      const torch::Tensor& w_v);

}  // namespace d2l::detail
