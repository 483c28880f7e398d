#pragma once

#include <torch/types.h>

namespace d2l {

/// Returns a copy of `X` (N, L, ...) whose entries at positions j >= valid_len[i]
/// along dim 1 are replaced by `value`; `X` itself is never modified (the book's
/// version writes into its argument). `valid_len` is (N), of any integer dtype.
torch::Tensor sequence_mask(const torch::Tensor& X, const torch::Tensor& valid_len,
                            double value = 0);

}  // namespace d2l
