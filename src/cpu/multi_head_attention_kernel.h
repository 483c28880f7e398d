#pragma once

// Multi-head attention's CPU kernels for small heads
// (multi_head_attention_kernel.cpp; see Note [CPU kernels per instruction
// set] in dispatch.h), under the fused multi-head node
// (autograd/multi_head_attention.cpp).

#include <ATen/core/TensorBase.h>

#include "cpu/dispatch.h"

namespace d2l::cpu {

/// Shapes: q (B, n, h), k (B, m, h), v (B, m, h), the projections with the
/// heads side by side (head i: features [i·d, (i + 1)·d), d = h / heads);
/// out and dout (B, n, h) the same way; weights, dweights and noise
/// (B·heads, n, m), head i of entry b at b·heads + i (the book's order). Every
/// tensor contiguous and of one dtype (float or double), except `lens`:
/// int64, empty (every key valid), (L) or (L, n) with L = B (one per entry)
/// or B·heads (one per head). `noise` is empty (no dropout) or the dropout's
/// multipliers (0 or 1 / (1 - p)). Row i sees its first min(len, m) keys;
/// no key past them is read, whatever it holds.
struct MultiHeadAttentionKernels {
  /// weights = softmax(scale · q kᵀ) per head, masked (0 past each row's
  /// length; a row with no valid key all 0), and out = (weights ∘ noise) v.
  void (*forward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                  const at::TensorBase& lens, const at::TensorBase& noise, int64_t heads,
                  double scale, const at::TensorBase& weights, const at::TensorBase& out);
  /// Gradients of forward with respect to q, k and v from dout and, when
  /// defined, dweights (the gradient reaching the weights), from the saved
  /// weights. dq, dk and dv are overwritten; keys that no row sees get 0.
  void (*backward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                   const at::TensorBase& lens, const at::TensorBase& noise, int64_t heads,
                   double scale, const at::TensorBase& weights, const at::TensorBase& dout,
                   const at::TensorBase& dweights, const at::TensorBase& dq,
                   const at::TensorBase& dk, const at::TensorBase& dv);
  /// forward on raw contiguous arrays, for callers that hold their own
  /// buffers (the Transformer's fused passes): q (B, n, h), k and v (B, m,
  /// h), lens one per entry (B) or nullptr (every key), weights (B·heads, n,
  /// m), out (B, n, h); no dropout. No tensor is made: a decoding step at the
  /// book's size made six per call, as long as the call's work.
  void (*forward_float)(const float* q, const float* k, const float* v, const int64_t* lens,
                        int64_t B, int64_t n, int64_t m, int64_t h, int64_t heads, double scale,
                        float* weights, float* out);
  void (*forward_double)(const double* q, const double* k, const double* v, const int64_t* lens,
                         int64_t B, int64_t n, int64_t m, int64_t h, int64_t heads, double scale,
                         double* weights, double* out);
};

D2L_DECLARE_CPU_KERNELS(MultiHeadAttentionKernels, multi_head_attention_kernels)

}  // namespace d2l::cpu
