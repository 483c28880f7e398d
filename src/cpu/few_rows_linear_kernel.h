#pragma once

// A Linear layer's product for inputs of a few rows (few_rows_linear_kernel.cpp;
// see Note [CPU kernels per instruction set] in dispatch.h), under
// detail::linear (autograd/linear.cpp).

#include <ATen/core/TensorBase.h>

#include <cstdint>

#include "cpu/dispatch.h"

namespace d2l::cpu {

/// The most rows `forward` takes.
inline constexpr int64_t kFewRows = 8;

struct FewRowsLinearKernels {
  /// out[r][c] = Σ_k x[r][k] · W[c][k] (+ bias[c]) for every row r of x and
  /// c0 <= c < c1. x (rows, K) with rows <= kFewRows, W (N, K), out (rows,
  /// N), bias empty or (N): contiguous, one dtype, float or double. The
  /// columns [c0, c1) only are written, so that threads may share `out`.
  void (*forward)(const at::TensorBase& x, const at::TensorBase& W, const at::TensorBase& bias,
                  const at::TensorBase& out, int64_t c0, int64_t c1);
  /// The same on raw contiguous arrays (bias nullptr: none), for callers
  /// that hold their own buffers (the Transformer decoder's fused step).
  void (*forward_float)(const float* x, int64_t rows, int64_t K, const float* W, int64_t N,
                        const float* bias, float* out, int64_t c0, int64_t c1);
  void (*forward_double)(const double* x, int64_t rows, int64_t K, const double* W, int64_t N,
                         const double* bias, double* out, int64_t c0, int64_t c1);
};

D2L_DECLARE_CPU_KERNELS(FewRowsLinearKernels, few_rows_linear_kernels)

}  // namespace d2l::cpu
