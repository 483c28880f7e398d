#pragma once

// d2l 1.0's "Attention Pooling by Similarity": the similarity kernels and
// Nadaraya–Watson regression with any of them (docs/attention-pooling.md).

#include <torch/types.h>

#include <functional>
#include <tuple>

namespace d2l::v1 {

/// A similarity kernel: maps differences x_train_i - x_val_j, elementwise, to
/// unnormalised attention scores. Any callable Tensor -> Tensor: the four
/// kernels below, gaussian_with_width(sigma), or a lambda of your own.
using Kernel = std::function<torch::Tensor(const torch::Tensor&)>;

// The book's kernels, elementwise on a floating tensor `x` of any shape; each
// returns a tensor of x's shape, dtype and device, and throws c10::Error for an
// undefined, non-floating or non-strided `x`.

/// exp(-x² / 2).
torch::Tensor gaussian(const torch::Tensor& x);

/// 1 where |x| < 1, else 0 (strictly less, as the book's code; its text says
/// ≤). The book returns a boolean tensor, which its nadaraya_watson casts to
/// float32; this returns those numbers, 1 and 0, in x's dtype. Its gradient
/// is none, as the book's: a comparison is not differentiable.
torch::Tensor boxcar(const torch::Tensor& x);

/// 1 + 0·x, the book's formula: 1 everywhere x is finite (NaN where it is not),
/// with a zero gradient.
torch::Tensor constant(const torch::Tensor& x);

/// max(1 - |x|, 0).
torch::Tensor epanechikov(const torch::Tensor& x);

/// The book's gaussian_with_width: the kernel exp(-x² / (2σ²)). Throws
/// c10::Error unless `sigma` is positive and finite. Where 2σ² underflows in
/// x's compute type (float for float32, float16 and bfloat16), the book's
/// formula is 0/0 at x = 0: the kernel is then computed as exp(-(x/σ)² / 2),
/// or as its limit (1 at x = 0, 0 elsewhere) where σ itself underflows, so
/// that a finite x never gives NaN.
Kernel gaussian_with_width(double sigma);

/// The book's nadaraya_watson(x_train, y_train, x_val, kernel): with
/// dists = x_train (n_train, 1) - x_val (1, n_val) and k = kernel(dists),
///
///   attention_w = k / k.sum(0)        (n_train, n_val): column j holds the
///                                     weights of the training points for x_val[j]
///   y_hat       = y_train @ attention_w   (n_val)
///
/// Returns (y_hat, attention_w). x_train and y_train are 1-D of one length
/// n_train, x_val is 1-D; all three share one floating dtype and one device
/// (float16 on the CPU needs LibTorch 2.x). The kernel must return a tensor
/// of dists' shape on its device, of a floating, integer or boolean dtype: it
/// is cast to the inputs' dtype (the book casts to float32, which its float64
/// data cannot then multiply; in float32 the numbers are the book's). Autograd
/// differentiates through the kernel. Throws c10::Error, naming the argument,
/// for bad arguments; for an empty x_train with a non-empty x_val; and, after
/// calling the kernel, when its column of some x_val is all zero (the book's
/// 0/0: NaN weights and estimate), saying how many x_val and the first.
std::tuple<torch::Tensor, torch::Tensor> nadaraya_watson(const torch::Tensor& x_train,
                                                         const torch::Tensor& y_train,
                                                         const torch::Tensor& x_val,
                                                         const Kernel& kernel);

}  // namespace d2l::v1
