#pragma once

// A Linear layer's product on weights packed once (packed_linear_kernel.cpp;
// Note [CPU kernels per instruction set] in dispatch.h), under
// detail::linear_into (autograd/linear.cpp, which keeps the packed copies:
// packed_weights.cpp).

#include <cstdint>

#include "cpu/dispatch.h"

namespace d2l::cpu {

struct PackedLinearKernels {
  /// Columns of one panel of packed weights (two vectors of the set's
  /// floats: 16 with AVX2, 32 with AVX-512).
  int64_t panel;
  /// Panels forward takes together (over each, the tiles of rows; then the
  /// rows left over across all of them): a range of panels should start at
  /// a multiple of it.
  int64_t group_panels;
  /// Packs W (N, K), contiguous, into ceil(N / panel) panels, each (K,
  /// panel) row-major: packed[(p · K + k) · panel + j] = W[p · panel + j][k],
  /// 0 past N.
  void (*pack)(const float* W, int64_t N, int64_t K, float* packed);
  /// out[r][c] = Σ_k x[r][k] · W[c][k] (+ bias[c]) for the rows of x (rows,
  /// K) and the columns c of panels [p0, p1), out (rows, N) row-major (bias
  /// nullptr: none). Every output is summed in one order (Note [Packed
  /// linear]), then the bias added: a row gets the same bits whatever the
  /// rows beside it, the number of threads and the instruction set (AVX2
  /// and AVX-512 alike; not the DEFAULT build, whose vectors do not fuse).
  void (*forward)(const float* x, int64_t rows, int64_t K, const float* packed, int64_t N,
                  const float* bias, float* out, int64_t p0, int64_t p1);
};

D2L_DECLARE_CPU_KERNELS(PackedLinearKernels, packed_linear_kernels)

}  // namespace d2l::cpu
