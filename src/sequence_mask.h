#pragma once

#include <torch/types.h>

#include <cstdint>

namespace d2l::detail {

/// Boolean (rows, cols) mask, true where the column index is below the row's
/// length; `lens` holds `rows` lengths in any shape. The one mask that
/// sequence_mask, the composite masked softmax and its gradient all build.
torch::Tensor length_mask(const torch::Tensor& lens, int64_t rows, int64_t cols);

}  // namespace d2l::detail
