#pragma once

// The fused additive attention's CPU kernels (additive_attention_kernel.cpp;
// see Note [CPU kernels per instruction set] in dispatch.h).

#include <ATen/core/TensorBase.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/dispatch.h"

namespace d2l::cpu {

/// Shapes: q (B, n, h), k (B, m, h), w (h), out and y (B, n, m). Every
/// tensor contiguous, one dtype (float or double); `lens` as in
/// MaskedSoftmaxKernels. (The kernels transpose each batch entry's keys and
/// values themselves, per thread, into buffers padded to whole vectors.)
struct AdditiveAttentionKernels {
  /// out[b, i, j] = sum_c w[c] tanh(q[b, i, c] + k[b, j, c]); with
  /// `softmax`, out holds the masked softmax of those scores instead.
  void (*forward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& w,
                  const at::TensorBase& out, const at::TensorBase& lens, bool softmax);
  /// Gradients of forward with respect to q, k and w, recomputing tanh. `y`
  /// is forward's output (used when `softmax`). dq, dk and dw are overwritten.
  void (*backward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& w,
                   const at::TensorBase& y, const at::TensorBase& dout, const at::TensorBase& dq,
                   const at::TensorBase& dk, const at::TensorBase& dw, const at::TensorBase& lens,
                   bool softmax);
  /// forward with `softmax`, followed by the product with the values, in the
  /// same pass over each row: y (B, n, m) the weights, o (B, n, d) = y · v for
  /// v (B, m, d). Only a row's valid keys reach o, so whatever the values hold
  /// at padding keys (inf, NaN) cannot leak.
  void (*forward_values)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& w,
                         const at::TensorBase& v, const at::TensorBase& y, const at::TensorBase& o,
                         const at::TensorBase& lens);
  /// Gradients of forward_values from do (B, n, d) and, when defined, dy (B,
  /// n, m), a gradient reaching the weights themselves. dq, dk, dw and dv
  /// (B, m, d) are overwritten.
  void (*backward_values)(const at::TensorBase& q, const at::TensorBase& k,
                          const at::TensorBase& w, const at::TensorBase& v,
                          const at::TensorBase& y, const at::TensorBase& dout,
                          const at::TensorBase& dy, const at::TensorBase& dq,
                          const at::TensorBase& dk, const at::TensorBase& dw,
                          const at::TensorBase& dv, const at::TensorBase& lens);
  /// y = tanh(x), elementwise: the function additive attention spends its time
  /// in (a rational approximation for float, see additive_blocks-inl.h).
  void (*tanh)(const at::TensorBase& x, const at::TensorBase& y);
};

D2L_DECLARE_CPU_KERNELS(AdditiveAttentionKernels, additive_attention_kernels)

}  // namespace d2l::cpu
