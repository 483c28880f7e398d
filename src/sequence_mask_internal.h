#pragma once

#include <torch/types.h>

#include <cstdint>

namespace d2l::detail {

/// Boolean (rows, cols) mask, true where the column index is below the row's
/// length; `lens` holds `rows` lengths in any shape. The one mask that
/// sequence_mask, the composite masked softmax and its gradient all build.
torch::Tensor length_mask(const torch::Tensor& lens, int64_t rows, int64_t cols);

/// `lens` in a dtype in which comparing them with integer positions is
/// exact: float16 and bfloat16 lengths go to float32 (which holds every value
/// of both), for ATen compares an int64 position with a bfloat16 length in
/// bfloat16, where position 275 rounds to 276 and a length of 276 lets 275
/// keys through. Other dtypes are returned as they are.
torch::Tensor comparable_lengths(const torch::Tensor& lens);

}  // namespace d2l::detail
