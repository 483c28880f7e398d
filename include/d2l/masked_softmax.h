#pragma once

#include <torch/types.h>

#include <d2l/backend.h>

namespace d2l {

/// Softmax over the last axis of a 3-D `X` (batch, queries, keys) that ignores
/// the key positions at or past each row's valid length.
///
/// `valid_lens` is undefined (plain softmax over the last axis of an `X` of any
/// rank), 1-D (batch) or 2-D (batch, queries), of any integer dtype; a length
/// above the number of keys means "all valid". Differs from the book in one
/// respect: a row with valid length 0 gets all-zero weights, not the uniform
/// weights that the book's -1e6 fill produces. Masked scores never reach the
/// result, even when they are inf or NaN.
///
/// `backend`: AttentionBackend::kComposite is the book's formulation
/// (sequence mask + softmax), the readable oracle; kFused the fused CPU
/// kernel (vectorised, parallel over rows, float16 and bfloat16 computed in
/// float), an error for tensors on another device; kAuto the fused kernel for
/// CPU tensors and the composite path elsewhere. kSdpa is an error.
torch::Tensor masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens = {},
                             AttentionBackend backend = AttentionBackend::kAuto);

}  // namespace d2l
