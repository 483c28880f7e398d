#pragma once

// The flash dot-product attention's CPU kernels (dot_product_attention_kernel.cpp;
// see Note [CPU kernels per instruction set] in dispatch.h).

#include <ATen/core/TensorBase.h>

#include <string>

#include "cpu/dispatch.h"

namespace d2l::cpu {

/// Shapes: q (B, n, d), k (B, m, d), v (B, m, dv), out and dout (B, n, dv),
/// lse (B, n). Every tensor contiguous and of one dtype (float or double),
/// except `lens`: int64, empty (every key valid), (B), (B, n) or bands
/// (X, P, 2). Row i of batch entry b attends to its first L = min(lens, m)
/// keys, or with bands to keys [first, min(end, m)) of pair (b · n + i) %
/// (X · P) (Note [Bands of keys]); keys outside a block of rows' span are
/// never read (Note [Flash attention]).
struct DotProductAttentionKernels {
  /// out = softmax(scale · q kᵀ, masked) v, never holding more than a block
  /// of scores; lse = log Σ exp(scale · q kᵀ) over the valid keys (the row's
  /// log-normaliser, -inf for a row with no valid key, whose output is 0).
  /// When `weights` is defined ((B, n, m), contiguous), the attention
  /// weights are written there too: 0 outside each row's keys, and all 0 in
  /// a row with no valid key.
  void (*forward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                  const at::TensorBase& lens, double scale, const at::TensorBase& out,
                  const at::TensorBase& lse, const at::TensorBase& weights);
  /// Gradients of forward with respect to q, k and v from dout, recomputing
  /// the scores block by block. dq, dk and dv are overwritten; keys outside every
  /// row's keys get zeros.
  void (*backward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                   const at::TensorBase& lens, double scale, const at::TensorBase& out,
                   const at::TensorBase& dout, const at::TensorBase& lse, const at::TensorBase& dq,
                   const at::TensorBase& dk, const at::TensorBase& dv);
  /// forward on bfloat16 q, k and v (out bfloat16 or float, lse float; no
  /// weights), in float without float copies of the operands: rows of a few
  /// queries (decoding) read K and V in place, widened in registers; blocks
  /// of queries widen their batch entry's keys and values once a thread,
  /// and each block's queries as they are packed. The float kernel's
  /// numbers on the widened inputs (a bfloat16 output rounded once).
  void (*forward_bf16)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                       const at::TensorBase& lens, double scale, const at::TensorBase& out,
                       const at::TensorBase& lse);
  /// backward on bfloat16 q, k, v and dout (out and lse float: the
  /// forward's float output) into bfloat16 dq, dk and dv, made in float (dk
  /// and dv a key block at a time) and rounded once: rows read every operand
  /// in place; blocks widen a batch entry's Q and dO once a thread into the
  /// rows padded to whole tiles their products read, and K and V a key block
  /// at a time.
  void (*backward_bf16)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                        const at::TensorBase& lens, double scale, const at::TensorBase& out,
                        const at::TensorBase& dout, const at::TensorBase& lse,
                        const at::TensorBase& dq, const at::TensorBase& dk,
                        const at::TensorBase& dv);
};

D2L_DECLARE_CPU_KERNELS(DotProductAttentionKernels, dot_product_attention_kernels)

/// The flash kernel on bfloat16 operands (Note [bfloat16 flash attention] in
/// dot_product_attention_bf16_kernel.cpp): its products in AVX512-BF16's
/// VDPBF16PS, everything else in float. q, k, v, out, dout, dq, dk and dv
/// bfloat16, lse float, shapes and lengths as DotProductAttentionKernels'.
/// It writes no weights; batch entries of fewer than kMinBf16Queries queries
/// run row by row inside it.
struct DotProductAttentionBf16Kernels {
  void (*forward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                  const at::TensorBase& lens, double scale, const at::TensorBase& out,
                  const at::TensorBase& lse);
  /// dq, dk and dv overwritten; sums of dQ in an order fixed by the thread
  /// count.
  void (*backward)(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                   const at::TensorBase& lens, double scale, const at::TensorBase& out,
                   const at::TensorBase& dout, const at::TensorBase& lse, const at::TensorBase& dq,
                   const at::TensorBase& dk, const at::TensorBase& dv);
};

/// Fewer queries a batch entry than this run the bfloat16 kernel's rows
/// (flash_bf16_rows-inl.h), as the float kernel's own blocks of at most a
/// third of a tile do: a block of 32 columns would be mostly padding. One
/// thread, 32 batch entries, 64 features, lengths random up to m (AMD Zen 5,
/// 2026-11-28), rows against blocks: forward at m = 512, 8 queries 180
/// against 233 µs, 12 queries 299 against 284; at m = 2048 rows stay ahead
/// to 16 queries; forward+backward at m = 512 even at 6 queries, at m = 2048
/// at 12.
constexpr int64_t kMinBf16Queries = 11;

namespace AVX512_BF16 {
const DotProductAttentionBf16Kernels& dot_product_attention_bf16_kernels();
}
/// The same passes with their products on AMX tiles (CpuIsa::kAmxBf16).
namespace AMX_BF16 {
const DotProductAttentionBf16Kernels& dot_product_attention_bf16_kernels();
}

/// The bfloat16 kernels, where the instruction set chosen for this process
/// has them (CpuIsa::kAvx512Bf16 or kAmxBf16), else nullptr: bfloat16 is
/// then widened to float for the float kernels.
const DotProductAttentionBf16Kernels* dot_product_attention_bf16_kernels();

/// Why the bfloat16 kernel's products do not run on AMX tiles in this
/// process although the CPU has AMX for bfloat16 (not asked for, Linux
/// refused the tile state, or this build has no AMX kernel), or empty: the
/// CPU has none, or they do. Asks Linux nothing.
std::string amx_unused_reason();

}  // namespace d2l::cpu
