#pragma once

// The masked softmax's layers, for the other ops built on it: the checks and
// paths live in masked_softmax.cpp, the autograd function in
// autograd/masked_softmax.cpp, the kernel in cpu/masked_softmax_kernel.cpp.

#include <torch/types.h>

#include <d2l/backend.h>

namespace d2l::detail {

/// Softmax over the last dimension, accumulating float16/bfloat16 in float.
torch::Tensor softmax_last_dim(const torch::Tensor& X);

/// The book's formulation (sequence mask + softmax), without argument checks.
torch::Tensor composite_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens);

/// The same with a boolean mask `allowed` broadcastable to X, true where a
/// score is kept (Note [Masks as lengths]); a row that keeps none is zero.
torch::Tensor composite_masked_softmax_where(const torch::Tensor& X, const torch::Tensor& allowed);

/// d2l::masked_softmax without the argument checks.
torch::Tensor masked_softmax_nocheck(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                     AttentionBackend backend = AttentionBackend::kAuto);

/// The fused CPU masked softmax of softmax(scale * X), autograd-aware.
torch::Tensor fused_masked_softmax(const torch::Tensor& X, const torch::Tensor& valid_lens,
                                   double scale = 1.0);

/// fused_masked_softmax for scores the caller owns and no longer needs (a
/// fresh bmm result): when nothing records a graph through them and they are
/// contiguous float or double, the weights overwrite them (one B·n·m buffer
/// instead of two); otherwise the same as fused_masked_softmax.
torch::Tensor fused_masked_softmax_consuming(torch::Tensor X, const torch::Tensor& valid_lens,
                                             double scale = 1.0);

/// The CPU kernel's forward and backward on tensors of any floating dtype,
/// with `lens` from lengths_arg (cpu/kernel_args.h); no autograd.
torch::Tensor fused_softmax_forward(const torch::Tensor& X, const torch::Tensor& lens,
                                    double scale);
torch::Tensor fused_softmax_backward(const torch::Tensor& Y, const torch::Tensor& dY,
                                     const torch::Tensor& lens, double scale);

/// fused_softmax_forward recorded in the autograd graph
/// (autograd/masked_softmax.cpp).
torch::Tensor masked_softmax_autograd(const torch::Tensor& X, const torch::Tensor& lens,
                                      double scale);

}  // namespace d2l::detail
