// The flash dot-product attention on bfloat16 operands, forward and
// backward, for CPUs with AVX512-BF16 (Note [bfloat16 flash attention],
// below). This file holds the note and the table of kernels; the forward
// pass is in dot_product_attention_bf16_forward_kernel.cpp, the backward in
// dot_product_attention_bf16_backward_kernel.cpp, what both use in
// flash_bf16-inl.h (pairs, products) and flash_blocks-inl.h (blocks,
// arguments, shared with the float kernels).

#include "cpu/dot_product_attention_bf16_kernel_parts.h"
#include "cpu/dot_product_attention_kernel.h"

// Note [bfloat16 flash attention]
// VDPBF16PS (AVX512-BF16: Zen 4 and later, Cooper Lake and Sapphire Rapids
// and later) multiplies 32 bfloat16 pairs and adds them to 16 float lanes:
// twice the multiply-adds of an FMA per instruction, at an FMA's rate on
// the cores we measured. The float kernel (Note [Flash attention]) widens
// bfloat16 to float first; this one keeps the operands of every product in
// bfloat16 and everything else in float, as FlashAttention and SDPA's
// bfloat16 kernels do.
//
// Each product's operands hold pairs of elements adjacent along its
// reduction dimension, one pair per 32-bit lane (flash_bf16-inl.h): the
// rows of a bfloat16 tensor are already pairs of features (read in place
// where the feature count is even, else from a copy with a zero after each
// row), while pairs of keys or of queries are packed. The forward is the
// float kernel's block path: Sᵀ = K Qᵀ with Qᵀ packed per block in pairs of
// features; the mask, maxima, exponentials and sums on float Sᵀ; Pᵀ rounded
// to bfloat16 in pairs of keys (two keys' exponentials interleaved as they
// are made); Oᵀ += Vᵀ Pᵀ with V packed in pairs of keys once per batch entry
// by each thread that runs blocks of it (below the entry's longest length,
// into the thread's buffer: packing it per block cost more than the
// block's products). Oᵀ is float until it is
// divided by the sum and rounded; lse is float. The backward is the float
// kernel's block path too, parallel over (batch entry, key block), with
// query blocks of 96 rows (48 pairs: the products over queries run 48
// steps): P = Q Kᵀ and dP = dO Vᵀ with Kᵀ and Vᵀ packed per task in pairs of
// features; P and dS made two query rows at a time straight into their
// bfloat16 layouts, pairs of queries for dV += Pᵀ dO and dK += dSᵀ Q (Q and
// dO packed once per call in pairs of queries) and pairs of keys for
// dQ += dS K (K packed per task in pairs of keys). dK and dV
// accumulate in float per task, dQ in a float (B, n, d) buffer whose sums
// run in an order fixed by the work split (Continuations, as the float
// kernel's rows path), each rounded to bfloat16 once. D = rowsum(dO ∘ O)
// is taken from the bfloat16 output, in float.
//
// The register tiles are 8 rows × 32 columns (16 accumulators: VDPBF16PS
// takes 6 cycles), and the probabilities' exponential is a cheaper one
// (exp_bf16, relative error 5e-5) that both passes share.
//
// What this costs in accuracy beyond the float kernel on the same bfloat16
// inputs: P (in the forward, and P and dS in the backward) rounded to
// bfloat16, a relative error of at most u = 2^-8 per entry, beside each
// result's own rounding (u). Sums stay float (VDPBF16PS adds in float; it
// flushes bfloat16 denormals to zero). The output's extra error is then
// Σ δp_j v_j / Σ p_j, at most u · max |v| and, the roundings having random
// signs, about u · |v| · sqrt(Σ p²) / Σ p: it does not grow with m.
// tests/test_flash_attention_bf16.cpp measures the output's and the
// gradients' against the float64 composite path on the same inputs (up to
// 0.7 u for the output, 1.4 u for dK and dV, 2.7 u for dQ, whose terms
// cancel; the widened float kernel: under 1 u) and asserts bounds.
//
// Masking is the float kernel's: entries past a query's length are -inf
// before the maximum and exactly 0 after the exponential (and dS exactly 0
// there), keys past a block's longest length are never read, and a pair
// that would reach past it is completed with a zero, never with the next
// key: inf or NaN in padding reaches no result. Weights are not written.
//
// Batch entries of fewer than kMinBf16Queries queries (decoding) run row by
// row (flash_bf16_rows-inl.h), as the float kernel's few-query blocks do:
// nothing packed, Q, K, V and dO read in place; each query's scores are
// dot products in VDPBF16PS over pairs of features, its P (and in the
// backward dS) rounded to bfloat16 in pairs of keys for P V (dS K), two
// rows of V (K) interleaved into pairs of keys in registers; dK and dV in
// float per key block, rounded once. Rows with fewer batch entries than
// threads split their keys over threads in the forward, as the float
// kernel's forward_split.
//
// Compiled once, with the AVX-512 kernels' flags and -mavx512bf16, as
// CPU_CAPABILITY=AVX512_BF16 (src/CMakeLists.txt): ATen's Vectorized inline
// functions then live in a namespace of their own too, so that none
// compiled with -mavx512bf16 is shared with the AVX-512 files, which run on
// CPUs without it. Chosen when d2l::cpu_isa() is CpuIsa::kAvx512Bf16 (Note
// [CPU kernels per instruction set]); an AMX kernel would be a level above.

namespace d2l::cpu {
namespace CPU_CAPABILITY {

const DotProductAttentionBf16Kernels& dot_product_attention_bf16_kernels() {
  static const DotProductAttentionBf16Kernels table{&dot_product_attention_bf16_forward,
                                                    &dot_product_attention_bf16_backward};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
