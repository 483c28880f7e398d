// Flash dot-product attention on the CPU, forward and backward: blocks of
// queries against blocks of keys with an online softmax, never holding more
// than one block of scores, and skipping every key block past the valid
// lengths (Note [Flash attention], below). This file holds the note and the
// table of kernels; the forward pass is in
// dot_product_attention_forward_kernel.cpp, the backward in
// dot_product_attention_backward_kernel.cpp, what both use in
// flash_blocks-inl.h (blocks, packing, arguments), flash_rows-inl.h (blocks
// of a few queries, row by row) and gemm-inl.h (register-tiled products).
// Each is compiled once per instruction set (Note [CPU kernels per
// instruction set]).

#include "cpu/dot_product_attention_kernel.h"
#include "cpu/dot_product_attention_kernel_parts.h"

// Note [Flash attention]
// The forward pass takes a block of W = kTileCols query rows of one batch
// entry (32 floats with AVX-512) and walks the keys in key blocks
// (key_block_size), as FlashAttention does: the block's scores, a running
// maximum and sum per query, and the output accumulated as
// Σ exp(scale·S - max) V, rescaled whenever a maximum grows. It holds the
// block transposed, queries as columns: Sᵀ = K Qᵀ (gemm-inl.h) with Qᵀ
// packed once per block, Oᵀ += Vᵀ Pᵀ with V read transposed in place, and
// every maximum, sum and correction is a whole vector of queries (no scalar
// exp per row). Only keys below the longest valid length among the block's
// rows are visited: with lengths (B) a whole batch entry stops at its
// length, so padding costs nothing, where SDPA's mask still computes it.
// Inside a visited block, a query's entries past its own length are -inf
// before the maximum and exactly 0 after the exponential, so nothing stored
// in padding (inf, NaN) can reach an output. The pass keeps
// lse = max + log(sum) per row. A block of only a few queries (at most a
// third of W; one query per call when decoding) runs row by row instead
// (forward_row): dot products with the row's valid keys, their
// exponentials, Σ p V, with nothing computed for padding columns.
//
// The backward pass recomputes P = exp(scale·S - lse) block by block and is
// parallel over (batch entry, key block): each task owns its rows of dK and
// dV, and adds each query block's (kQueryBlock rows) share of dQ to dQ under
// that block's lock (one of 64, by block index), or, where the sums must come
// out the same from call to call (deterministic algorithms, and always on the
// rows path), with no lock and a share of dQ per run that starts inside a
// batch entry (Continuations). D = rowsum(dO ∘ O), computed
// per query block where it is used, replaces the row sums of dP ∘ P. Pᵀ dO
// and dSᵀ Q read P and dS transposed in place. A batch entry of a few
// queries (backward_by_rows) runs key by key instead (backward_rows), with
// no packing and no register tiles.
//
// Work is split into one run of tasks per thread, of about equal cost (rows
// times visited keys): with random lengths, equal numbers of tasks would
// leave one thread with most of the keys. Operands are packed so that every
// vector load in the products is a whole, contiguous one: Qᵀ of a query
// block in the forward, Kᵀ and Vᵀ of a key block in the backward, in panels
// of one register tile, and in the backward Q, K and dO with their feature
// dimension padded to whole tiles (copies only where it is not already).
// Beyond its outputs and lse, a call holds per thread one block's packed
// operands and one block of scores (or P and dP), or one chunk of a row's
// scores (kRowChunk; the row with weights): never (B, n, m), nor a
// packed copy of all of K and V, nor a per-thread copy of dQ, nor a (B, n)
// buffer of D (these put the kernel's peak memory at up to three times
// SDPA's). Where a feature dimension is a whole number of register tiles
// (d = 64, say), the backward accumulates in its rows of dK, dV and dQ;
// otherwise in per-thread scratch.

// Note [Bands of keys]
// Lengths of shape (X, P, 2) are bands: row r of the call (b · n + i) takes
// pair r % (X · P), [first, end), and attends to keys first <= j < min(end,
// m) (RowLengths in vec_helpers-inl.h). With first = 0 a band is a length;
// with first > 0 it is a sliding window, an end-aligned causal row, or, with
// every row of a packed batch in one entry, the keys of its own sequence
// (scaled_dot_product_attention_varlen). The kernels visit, for a block of
// rows, only the key blocks between the block's earliest first key and its
// longest end (key_span), and mask the keys before each row's first as they
// mask those past its length: so a window of w keys over n queries costs
// n · w, not n², and the rows of one packed sequence never read another's
// keys except where a block of rows spans two sequences. In the backward a
// key block visits only the query blocks whose span reaches it. An empty
// band is [0, 0) (normalised upstream), so a length of 0 still means "no
// key" everywhere.

namespace d2l::cpu {
namespace CPU_CAPABILITY {

const DotProductAttentionKernels& dot_product_attention_kernels() {
  static const DotProductAttentionKernels table{
      &dot_product_attention_forward, &dot_product_attention_backward,
      &dot_product_attention_forward_bf16, &dot_product_attention_backward_bf16};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
