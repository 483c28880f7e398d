#pragma once

#include <torch/types.h>

namespace d2l {

/// Returns a copy of `X` (N, L, ...) whose entries at positions j >= valid_len[i]
/// along dim 1 are replaced by `value`; `X` itself is never modified (the book's
/// version writes into its argument). `valid_len` is (N), of any integer dtype.
torch::Tensor sequence_mask(const torch::Tensor& X, const torch::Tensor& valid_len,
                            double value = 0);

/// Softmax over the last axis of a 3-D `X` (batch, queries, keys) that ignores
/// the key positions at or past each row's valid length.
///
/// `valid_lens` is undefined (plain softmax), 1-D (batch) or 2-D (batch, queries),
/// of any integer dtype; a length above the number of keys means "all valid".
/// Differs from the book in one respect: a row with valid length 0 gets all-zero
/// weights, not the uniform weights that the book's -1e6 fill produces.
/// Masked scores never reach the result, even when they are inf or NaN.
/// Runs the fused kernel for CPU tensors and the composite path elsewhere.
torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens = {});

namespace composite {
/// The book's formulation (sequence mask + softmax), kept as the readable oracle
/// for the fused kernels. Same contract as d2l::masked_softmax.
torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens = {});
}  // namespace composite

namespace fused {
/// The fused CPU kernel (vectorised, parallel over rows, autograd-aware; float16
/// and bfloat16 computed in float). Same contract as d2l::masked_softmax, which
/// uses it for CPU tensors; throws c10::Error for tensors on another device.
torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens = {});
}  // namespace fused

}  // namespace d2l
