#pragma once

// The fused masked softmax's CPU kernels (masked_softmax_kernel.cpp; see
// Note [CPU kernels per instruction set] in dispatch.h).

#include <ATen/core/TensorBase.h>

#include "cpu/dispatch.h"

namespace d2l::cpu {

/// Every tensor contiguous; x, y, dy and dx one dtype, float or double, with
/// the softmax over the last dimension. `lens` is int64: empty (all valid),
/// (B) or (B, n) for x of shape (B, n, m).
struct MaskedSoftmaxKernels {
  /// y = softmax(scale * x) over each row's first L entries, 0 after them. y
  /// may be x itself: a row reads each valid score before writing its weight,
  /// and zeroes the masked ones without reading them.
  void (*forward)(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& lens,
                  double scale);
  /// dx = scale * y * (dy - <dy, y>) over the valid entries, 0 after them.
  void (*backward)(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx,
                   const at::TensorBase& lens, double scale);
};

D2L_DECLARE_CPU_KERNELS(MaskedSoftmaxKernels, masked_softmax_kernels)

}  // namespace d2l::cpu
