#pragma once

// The Linear projections of the attention modules (AdditiveAttention's W_q
// and W_k, MultiHeadAttention's W_q, W_k, W_v and W_o): functional::linear,
// with its matrix products split over ATen's threads where LibTorch's BLAS
// would run them on one (autograd/linear.cpp).

#include <torch/types.h>

#include <d2l/backend.h>

namespace d2l::detail {

/// Whether linear() runs the products of x (..., in) · Wᵀ (out, in) itself:
/// on the CPU, in float or double, outside a parallel region, and large
/// enough to pay for a parallel region; then either x has fewer than
/// cpu::kFewRows rows (a decoding step: the few-rows kernel, by slices of
/// W's rows over ATen's threads, at any number of threads: BLAS runs such
/// products on one thread and below the speed of memory), or, with more
/// than one intra-op thread, LibTorch's BLAS is OpenBLAS sized to 1 thread
/// (d2l::set_num_threads, OPENBLAS_NUM_THREADS=1: README, "Two thread
/// pools") and the product splits by rows of x. MKL (PyPI's wheels) already
/// runs products of many rows on ATen's threads.
bool linear_splits_over_threads(const torch::Tensor& x, const torch::Tensor& W);

/// a (r, k) · b (k, c), a new (r, c) tensor, without autograd: split by rows
/// of `a` over ATen's threads under the conditions of
/// linear_splits_over_threads (r rows, r·k·c multiply-adds), else at::mm.
/// bfloat16 and float16 on a CPU without AVX512-BF16 are multiplied in float
/// and rounded once. For autograd functions that hold projections of their
/// own.
torch::Tensor mm_over_threads(const torch::Tensor& a, const torch::Tensor& b);

/// Whether mm_over_threads(a, b) multiplies in float: bfloat16 or float16 on
/// a CPU without AVX512-BF16, where ATen's own products are slow.
bool mm_widens(const torch::Tensor& a, const torch::Tensor& b);

/// y = x Wᵀ (+ b), the same as torch::nn::functional::linear (the same
/// checks and errors, gradients and double backward), split over threads
/// where linear_splits_over_threads says so: forward and input gradient by
/// rows of x, the weight gradient by rows of W. AttentionBackend::kComposite keeps
/// functional::linear, the book's op, always.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& W,
                     const torch::Tensor& b = torch::Tensor(),
                     AttentionBackend backend = AttentionBackend::kAuto);

/// out (rows, N) = x (rows, K) · Wᵀ (+ b) on arrays of the caller's (T:
/// float or double, W's dtype; W (N, K) and b (N) or undefined contiguous
/// on the CPU), without autograd, for callers that hold their own buffers
/// (the 0.17 Transformer decoder's fused step). Products of fewer than
/// 2^18 multiply-adds run on the calling thread (no tensor made, no
/// dispatch); larger ones as linear() runs them: the
/// few-rows kernel by slices of W's rows over ATen's threads below
/// cpu::kFewRows rows, else BLAS (split by rows where
/// linear_splits_over_threads says). Float products by a weight of fewer
/// than kPackedMinimumElements, and of 8 rows or more by a larger one, run
/// on the packed kernel, on a copy of W packed once (Note [Packed
/// weights]): small weights' products on the few-rows kernel spent as much
/// on its per-output reductions as on the multiply-adds (K = 32: the book's
/// Transformer). `check_bytes` has that copy compare W's bytes now rather
/// than once per decoding.
template <typename T>
void linear_into(T* out, const T* x, int64_t rows, const torch::Tensor& W, const torch::Tensor& b,
                 bool check_bytes = false);

}  // namespace d2l::detail
