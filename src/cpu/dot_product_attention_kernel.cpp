// Flash dot-product attention on the CPU, forward and backward: blocks of
// queries against blocks of keys with an online softmax, never holding more
// than one block of scores, and skipping every key block past the valid
// lengths (Note [Flash attention]). Compiled once per instruction set (Note
// [CPU kernels per instruction set]).

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "cpu/dot_product_attention_kernel.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

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

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// ---------------------------------------------------------------- forward

template <typename T>
struct ForwardArgs {
  Dims s;
  const T *q, *k, *v;
  RowLengths lens;
  T scale;
  T *out, *lse;
  T* weights;  // (B, n, m), or null when no weights are asked
  int64_t kb;  // the key block (key_block_size)
};

// One thread's state for a block of W = kTileCols query rows, held
// transposed: a query is a column, so the softmax's bookkeeping (maxima,
// sums, corrections) runs on whole vectors of queries.
template <typename T>
struct ForwardScratch {
  static constexpr int64_t W = kTileCols<T>;
  std::unique_ptr<T[]> qt;  // Qᵀ of the block (d × W), zero past its rows
  std::unique_ptr<T[]> st;  // Sᵀ, then Pᵀ, of one key block (kb × W)
  std::unique_ptr<T[]> ot;  // Oᵀ accumulated (dv × W)
  alignas(64) T limit[W];   // per query: its length, then its valid keys in the key block
  alignas(64) T row_max[W], row_sum[W];
  std::vector<int64_t> len;
  std::vector<T> block_max;  // with weights: each key block's maximum, per query

  ForwardScratch(const Dims& s, int64_t kb, int64_t key_blocks)
      : qt(uninitialized_buffer<T>(s.d * W)),
        st(uninitialized_buffer<T>(kb * W)),
        ot(uninitialized_buffer<T>(s.dv * W)),
        len(W),
        block_max(W * key_blocks) {}
};

// Sᵀ = K Qᵀ for keys [j0, j0 + kc), their exponentials Pᵀ relative to the
// running maximum of each query, the sums and Oᵀ += Vᵀ Pᵀ, with Oᵀ rescaled
// where a maximum grew. Entries of keys past a query's length are -inf before
// the maximum and exactly 0 after the exponential, whatever the padding held.
template <typename T>
void attend_key_block(const ForwardArgs<T>& a, ForwardScratch<T>& w, int64_t b, int64_t j0,
                      int64_t kc, bool all_valid) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size(), W = ForwardScratch<T>::W;
  static_assert(W == 2 * S, "a block of queries is two vectors");
  const Dims& s = a.s;
  T* st = w.st.get();
  gemm<T>(kc, 1, s.d, a.k + (b * s.m + j0) * s.d, s.d, w.qt.get(), W, 0, st, W, false);
  const V minus_inf(-std::numeric_limits<T>::infinity()), vscale(a.scale);
  V max0 = minus_inf, max1 = minus_inf;
  if (all_valid) {
    for (int64_t j = 0; j < kc; ++j) {
      max0 = at::vec::maximum(max0, V::loadu(st + j * W));
      max1 = at::vec::maximum(max1, V::loadu(st + j * W + S));
    }
  } else {
    // Keys valid for each query in this block: clamp(len - j0, 0, kc), exact in T.
    const V lim0 = V::loadu(w.limit), lim1 = V::loadu(w.limit + S);
    for (int64_t j = 0; j < kc; ++j) {
      const V key(static_cast<T>(j));
      const V x0 = V::blendv(minus_inf, V::loadu(st + j * W), key < lim0);
      const V x1 = V::blendv(minus_inf, V::loadu(st + j * W + S), key < lim1);
      x0.store(st + j * W);
      x1.store(st + j * W + S);
      max0 = at::vec::maximum(max0, x0);
      max1 = at::vec::maximum(max1, x1);
    }
  }
  const V old0 = V::loadu(w.row_max), old1 = V::loadu(w.row_max + S);
  const V new0 = at::vec::maximum(old0, max0 * vscale);
  const V new1 = at::vec::maximum(old1, max1 * vscale);
  // A query with no valid key so far keeps -inf and shifts by 0 (its
  // entries are -inf, so their exponentials are 0); an unchanged maximum
  // (-inf included) corrects by exactly 1.
  const V zero(T(0)), one(T(1));
  const V shift0 = V::blendv(new0, zero, new0 == minus_inf);
  const V shift1 = V::blendv(new1, zero, new1 == minus_inf);
  const V corr0 = V::blendv(softmax_exp(old0 - shift0), one, old0 == new0);
  const V corr1 = V::blendv(softmax_exp(old1 - shift1), one, old1 == new1);
  V sum0 = zero, sum1 = zero;
  for (int64_t j = 0; j < kc; ++j) {
    const V p0 = softmax_exp(at::vec::fmadd(V::loadu(st + j * W), vscale, zero - shift0));
    const V p1 = softmax_exp(at::vec::fmadd(V::loadu(st + j * W + S), vscale, zero - shift1));
    p0.store(st + j * W);
    p1.store(st + j * W + S);
    sum0 = sum0 + p0;
    sum1 = sum1 + p1;
  }
  at::vec::fmadd(V::loadu(w.row_sum), corr0, sum0).store(w.row_sum);
  at::vec::fmadd(V::loadu(w.row_sum + S), corr1, sum1).store(w.row_sum + S);
  new0.store(w.row_max);
  new1.store(w.row_max + S);
  T* ot = w.ot.get();
  for (int64_t c = 0; c < s.dv; ++c) {
    (V::loadu(ot + c * W) * corr0).store(ot + c * W);
    (V::loadu(ot + c * W + S) * corr1).store(ot + c * W + S);
  }
  // Oᵀ += Vᵀ Pᵀ: V's rows read transposed, Pᵀ one tile of queries wide.
  gemm<T, true>(s.dv, 1, kc, a.v + (b * s.m + j0) * s.dv, s.dv, st, W, 0, ot, W, true);
}

// With weights, a key block's exponentials go out as they are made, relative
// to the query's maximum at the time; once its final maximum and sum are
// known, each block is rescaled by exp(block max - max) / sum, and the keys
// past its length are zeroed. The weights are the only (B, n, m) memory.
template <typename T>
void write_weights(const ForwardArgs<T>& a, const ForwardScratch<T>& w, int64_t b, int64_t i0,
                   int64_t rows, int64_t j0, int64_t kc) {
  constexpr int64_t W = ForwardScratch<T>::W;
  const Dims& s = a.s;
  const T* st = w.st.get();
  for (int64_t c = 0; c < rows; ++c) {
    T* weights = a.weights + (b * s.n + i0 + c) * s.m + j0;
    for (int64_t j = 0; j < kc; ++j) weights[j] = st[j * W + c];
  }
}

template <typename T>
void finish_weights(const ForwardArgs<T>& a, const ForwardScratch<T>& w, int64_t b, int64_t i0,
                    int64_t rows) {
  const Dims& s = a.s;
  const int64_t key_blocks = div_up(s.m, a.kb);
  for (int64_t c = 0; c < rows; ++c) {
    T* weights = a.weights + (b * s.n + i0 + c) * s.m;
    const int64_t len = w.len[c];
    for (int64_t j0 = 0; j0 < len; j0 += a.kb) {
      const T factor =
          std::exp(w.block_max[c * key_blocks + j0 / a.kb] - w.row_max[c]) / w.row_sum[c];
      scale_row(weights + j0, std::min(a.kb, len - j0), factor);
    }
    std::fill(weights + len, weights + s.m, T(0));
  }
}

// Query rows [i0, i0 + rows) of batch entry b, rows <= W.
template <typename T>
void forward_block(const ForwardArgs<T>& a, ForwardScratch<T>& w, int64_t b, int64_t i0,
                   int64_t rows) {
  constexpr int64_t W = ForwardScratch<T>::W;
  const Dims& s = a.s;
  int64_t longest = 0, shortest = s.m;
  for (int64_t c = 0; c < W; ++c) {
    w.len[c] = c < rows ? a.lens.at(b * s.n + i0 + c, s.m) : 0;
    longest = std::max(longest, w.len[c]);
    if (c < rows) shortest = std::min(shortest, w.len[c]);
  }
  pack_transposed(a.q + (b * s.n + i0) * s.d, rows, s.d, w.qt.get());
  std::fill_n(w.ot.get(), s.dv * W, T(0));
  std::fill_n(w.row_max, W, -std::numeric_limits<T>::infinity());
  std::fill_n(w.row_sum, W, T(0));
  const int64_t key_blocks = div_up(s.m, a.kb);
  for (int64_t j0 = 0; j0 < longest; j0 += a.kb) {
    const int64_t kc = std::min(a.kb, longest - j0);
    // Every query of the block sees every key of this one (rows past the
    // block's end have length 0, so a partial block always masks).
    const bool all_valid = rows == W && shortest - j0 >= kc;
    for (int64_t c = 0; c < W; ++c) {
      w.limit[c] = static_cast<T>(std::clamp<int64_t>(w.len[c] - j0, 0, kc));
    }
    attend_key_block(a, w, b, j0, kc, all_valid);
    if (a.weights != nullptr) {
      write_weights(a, w, b, i0, rows, j0, kc);
      for (int64_t c = 0; c < rows; ++c) {
        w.block_max[c * key_blocks + j0 / a.kb] = w.row_max[c];
      }
    }
  }
  const T* ot = w.ot.get();
  for (int64_t c = 0; c < rows; ++c) {
    T* out = a.out + (b * s.n + i0 + c) * s.dv;
    const bool empty = w.len[c] == 0;
    const T inv = empty ? T(0) : T(1) / w.row_sum[c];
    for (int64_t f = 0; f < s.dv; ++f) out[f] = ot[f * W + c] * inv;
    a.lse[b * s.n + i0 + c] =
        empty ? -std::numeric_limits<T>::infinity() : w.row_max[c] + std::log(w.row_sum[c]);
  }
  if (a.weights != nullptr) finish_weights(a, w, b, i0, rows);
}

// ------------------------------------------------- forward, a few queries

// A block of only a few queries (decoding: one query a step) runs row by row
// instead: as a block of W columns (32 floats on AVX-512), at one query 31 of
// every 32 lanes of its products and exponentials would be padding. A row's
// scores are dot products with its valid keys (scaled), then their
// exponentials and Σ p V, two passes over at most kRowChunk scores a thread
// (longer rows go chunk by chunk with an online softmax); with weights the
// whole row's scores are kept and written in place, contiguous.

// x · y over n elements.
template <typename T>
T dot(const T* x, const T* y, int64_t n) {
  using V = Vectorized<T>;
  V acc(T(0));
  int64_t c = 0;
  for (; c + V::size() <= n; c += V::size()) {
    acc = at::vec::fmadd(V::loadu(x + c), V::loadu(y + c), acc);
  }
  if (c < n) acc = at::vec::fmadd(partial_load(x + c, n - c), partial_load(y + c, n - c), acc);
  return horizontal_sum(acc);
}

// y[0:n] = alpha · x[0:n], or += with kAccumulate.
template <bool kAccumulate, typename T>
void axpy(T* y, const T* x, T alpha, int64_t n) {
  using V = Vectorized<T>;
  const V valpha(alpha);
  int64_t c = 0;
  for (; c + V::size() <= n; c += V::size()) {
    const V x_c = V::loadu(x + c);
    (kAccumulate ? at::vec::fmadd(valpha, x_c, V::loadu(y + c)) : valpha * x_c).store(y + c);
  }
  if (c < n) {
    const V x_c = partial_load(x + c, n - c);
    partial_store(kAccumulate ? at::vec::fmadd(valpha, x_c, partial_load(y + c, n - c))
                              : valpha * x_c,
                  y + c, n - c);
  }
}

// Keys a row's scores are computed for at a time when no weights are asked
// for: 2 KiB of float scores a thread, in L1, instead of a row of m (8 KiB
// a thread at m = 2048, which put the unmasked one-query forward's heap
// peak 3.6-9.3 KiB above SDPA's).
constexpr int64_t kRowChunk = 512;

template <typename T>
struct RowScratch {
  // Scores of a chunk, or with weights of the whole row, rounded up to a
  // tile: the exponentials' last vector stores whole.
  std::unique_ptr<T[]> scores;
  int64_t room;

  RowScratch(const Dims& s, bool whole_rows)
      : room(round_up_to_tile<T>(whole_rows ? s.m : std::min(s.m, kRowChunk))) {
    scores = uninitialized_buffer<T>(room);
  }
};

// out[0:cols] = factor · Σ_{j < L} p[j] V[j, 0:cols] for cols <= G vectors,
// accumulated in G registers over one pass down V's rows (row stride ldv);
// the last vector partial where the columns end.
// With `keep` (a chunk of a row after the first), out = keep · out +
// factor · Σ instead.
template <typename T, int G>
void weighted_sum_group(const T* p, const T* v, int64_t ldv, int64_t L, int64_t cols, T* out,
                        T factor, const T* keep) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  V acc[G];
  for (int g = 0; g < G; ++g) acc[g] = V(T(0));
  const int64_t whole = cols / S, tail = cols % S;
  for (int64_t j = 0; j < L; ++j) {
    const V pj(p[j]);
    const T* row = v + j * ldv;
    for (int64_t g = 0; g < whole; ++g) acc[g] = at::vec::fmadd(pj, V::loadu(row + g * S), acc[g]);
    if (tail > 0) acc[whole] = at::vec::fmadd(pj, partial_load(row + whole * S, tail), acc[whole]);
  }
  const V vfactor(factor);
  if (keep != nullptr) {
    const V vkeep(*keep);
    for (int64_t g = 0; g < whole; ++g) {
      at::vec::fmadd(vkeep, V::loadu(out + g * S), acc[g] * vfactor).store(out + g * S);
    }
    if (tail > 0) {
      const V old = partial_load(out + whole * S, tail);
      partial_store(at::vec::fmadd(vkeep, old, acc[whole] * vfactor), out + whole * S, tail);
    }
    return;
  }
  for (int64_t g = 0; g < whole; ++g) (acc[g] * vfactor).store(out + g * S);
  if (tail > 0) partial_store(acc[whole] * vfactor, out + whole * S, tail);
}

// out[0:dv] = factor · Σ_{j < L} p[j] V[j, :], one pass down V per 4 vectors
// of columns.
template <typename T>
void weighted_sum(const T* p, const T* v, int64_t dv, int64_t L, T* out, T factor,
                  const T* keep = nullptr) {
  constexpr int64_t G = 4, S = Vectorized<T>::size();
  for (int64_t f0 = 0; f0 < dv; f0 += G * S) {
    weighted_sum_group<T, G>(p, v + f0, dv, L, std::min(G * S, dv - f0), out + f0, factor, keep);
  }
}

// The shift of a row's exponentials for a running maximum: the maximum, or
// 0 while it is -inf (every score so far -inf), so that those scores'
// exponentials are 0 rather than NaN, as the blocks do.
template <typename T>
T shift_for(T mx) {
  return mx == -std::numeric_limits<T>::infinity() ? T(0) : mx;
}

// A row's softmax over keys [j0, j1) of its batch entry (k, v), not yet
// normalised: out = Σ e^(s_j - shift) V[j] and the sum of those
// exponentials, with shift = shift_for(maximum of the scores s_j). The
// keys go kRowChunk at a time, online: the output so far is rescaled by
// e^(old shift - new shift) as each chunk raises the maximum.
template <typename T>
struct RowPartial {
  T mx, sum;
};

template <typename T>
RowPartial<T> row_partial(const ForwardArgs<T>& a, RowScratch<T>& w, const T* q, const T* k,
                          const T* v, int64_t j0, int64_t j1, T* out) {
  const Dims& s = a.s;
  T* sc = w.scores.get();
  RowPartial<T> r{-std::numeric_limits<T>::infinity(), T(0)};
  if (j0 == j1) std::fill_n(out, s.dv, T(0));
  for (int64_t c0 = j0; c0 < j1; c0 += kRowChunk) {
    const int64_t c = std::min(kRowChunk, j1 - c0);
    for (int64_t j = 0; j < c; ++j) sc[j] = a.scale * dot(q, k + (c0 + j) * s.d, s.d);
    const T mx = std::max(r.mx, row_max(sc, c, w.room));
    // Nothing to keep after the first chunk, or after chunks of -inf only
    // (their output is 0; e^(0 - mx) could overflow).
    const bool nothing = c0 == j0 || r.mx == -std::numeric_limits<T>::infinity();
    const T keep = nothing ? T(0) : std::exp(r.mx - mx);
    r.sum = r.sum * keep + exp_row(sc, c, c, T(1), shift_for(mx));
    weighted_sum(sc, v + c0 * s.dv, s.dv, c, out, T(1), c0 == j0 ? nullptr : &keep);
    r.mx = mx;
  }
  return r;
}

// Query row i of batch entry b.
template <typename T>
void forward_row(const ForwardArgs<T>& a, RowScratch<T>& w, int64_t b, int64_t i) {
  const Dims& s = a.s;
  const int64_t row = b * s.n + i, L = a.lens.at(row, s.m);
  T* out = a.out + row * s.dv;
  T* weights = a.weights != nullptr ? a.weights + row * s.m : nullptr;
  if (L == 0) {
    std::fill_n(out, s.dv, T(0));
    a.lse[row] = -std::numeric_limits<T>::infinity();
    if (weights != nullptr) std::fill_n(weights, s.m, T(0));
    return;
  }
  const T* q = a.q + row * s.d;
  const T* k = a.k + b * s.m * s.d;
  if (weights == nullptr && L > kRowChunk) {
    const RowPartial<T> r = row_partial(a, w, q, k, a.v + b * s.m * s.dv, 0, L, out);
    scale_row(out, s.dv, T(1) / r.sum);
    a.lse[row] = shift_for(r.mx) + std::log(r.sum);
    return;
  }
  T* sc = w.scores.get();
  for (int64_t j = 0; j < L; ++j) sc[j] = a.scale * dot(q, k + j * s.d, s.d);
  const T mx = row_max(sc, L, w.room);
  // A maximum of -inf (every score -inf) gives NaN here as it does in the
  // blocks and the composite path: such keys hold infinities.
  const T sum = exp_row(sc, L, L, T(1), mx);
  const T inv = T(1) / sum;
  a.lse[row] = mx + std::log(sum);
  weighted_sum(sc, a.v + b * s.m * s.dv, s.dv, L, out, inv);
  if (weights != nullptr) {
    std::copy_n(sc, L, weights);
    scale_row(weights, L, inv);
    std::fill(weights + L, weights + s.m, T(0));
  }
}

// Whether a block of `rows` queries (of at most W) runs row by row. A block
// costs about the same whatever its rows, a row about a third of a full
// block: at m = 512, d = 64, AVX-512 float (one thread), a block took 630 µs
// per 32 batch entries from 2 to 24 rows, rows 55 µs each (8 rows 440 µs,
// 12 rows 660 µs).
template <typename T>
bool by_rows(int64_t rows) {
  return rows * 3 <= ForwardScratch<T>::W;
}

// Decoding with fewer batch entries than threads (one sequence's heads, say)
// splits each row's keys over threads instead (as flash-decoding does on
// GPUs): `splits` parts of at least kRowChunk keys each, every part a
// row_partial into its own slot of dv + 2 values (out, maximum, sum), then
// one pass per row combines them, each part's output and sum rescaled by
// e^(its shift - the row's shift). Without it, B·H = 1 ran on one thread
// whatever the pool.
template <typename T>
int64_t key_splits(const Dims& s, int64_t tasks, int64_t longest, bool weights) {
  const int64_t threads = at::get_num_threads();
  if (weights || tasks >= threads || !by_rows<T>(s.n)) return 1;
  return std::clamp<int64_t>(std::min(threads / tasks, longest / kRowChunk), 1, threads);
}

template <typename T>
void forward_split(const ForwardArgs<T>& a, int64_t splits) {
  const Dims& s = a.s;
  const int64_t slot = s.dv + 2, rows = s.B * s.n;
  std::vector<T> parts(rows * splits * slot);
  std::vector<int64_t> costs(rows * splits);
  for (int64_t t = 0; t < rows * splits; ++t) {
    costs[t] = (div_up(a.lens.at(t / splits, s.m), splits) + 1) * macs_to_grain(s);
  }
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    RowScratch<T> w(s, false);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / splits, part = t % splits, b = row / s.n;
      const int64_t L = a.lens.at(row, s.m);
      T* out = parts.data() + t * slot;
      const RowPartial<T> r =
          row_partial(a, w, a.q + row * s.d, a.k + b * s.m * s.d, a.v + b * s.m * s.dv,
                      L * part / splits, L * (part + 1) / splits, out);
      out[s.dv] = r.mx;
      out[s.dv + 1] = r.sum;
    }
  });
  constexpr T kNone = -std::numeric_limits<T>::infinity();
  for (int64_t row = 0; row < rows; ++row) {
    T* out = a.out + row * s.dv;
    const T* first = parts.data() + row * splits * slot;
    if (a.lens.at(row, s.m) == 0) {
      std::fill_n(out, s.dv, T(0));
      a.lse[row] = kNone;
      continue;
    }
    T mx = kNone;
    for (int64_t p = 0; p < splits; ++p) mx = std::max(mx, first[p * slot + s.dv]);
    T sum = 0;
    for (int64_t p = 0; p < splits; ++p) {
      const T* part = first + p * slot;
      // A part of -inf scores only holds zeros (and e^(0 - mx) may overflow).
      const T factor = part[s.dv] == kNone ? T(0) : std::exp(part[s.dv] - shift_for(mx));
      sum += factor * part[s.dv + 1];
      if (p == 0) {
        std::copy_n(part, s.dv, out);
        scale_row(out, s.dv, factor);
      } else {
        axpy<true>(out, part, factor, s.dv);
      }
    }
    scale_row(out, s.dv, T(1) / sum);
    a.lse[row] = shift_for(mx) + std::log(sum);
  }
}

template <typename T>
void forward_typed(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                   const at::TensorBase& lens, double scale, const at::TensorBase& out,
                   const at::TensorBase& lse, const at::TensorBase& weights) {
  constexpr int64_t W = ForwardScratch<T>::W;
  const Dims s = dims_of(q, v);
  const RowLengths row_lens = row_lengths(lens, s.n);
  const int64_t blocks = div_up(s.n, W);
  std::vector<int64_t> costs(s.B * blocks);
  int64_t longest_any = 0;
  for (int64_t t = 0; t < s.B * blocks; ++t) {
    const int64_t b = t / blocks, i0 = t % blocks * W;
    const int64_t rows = std::min(W, s.n - i0);
    const int64_t longest = longest_length(row_lens, s, b, i0, rows);
    longest_any = std::max(longest_any, longest);
    // Each visited key costs a row d + dv multiply-adds, and the block's
    // packing and output W rows (macs_to_grain).
    costs[t] = (rows * longest + (by_rows<T>(rows) ? rows : W)) * macs_to_grain(s);
  }
  const ForwardArgs<T> args{s,
                            q.data_ptr<T>(),
                            k.data_ptr<T>(),
                            v.data_ptr<T>(),
                            row_lens,
                            T(scale),
                            out.data_ptr<T>(),
                            lse.data_ptr<T>(),
                            weights.defined() ? weights.data_ptr<T>() : nullptr,
                            key_block_size<T>(longest_any, 2)};
  const int64_t splits = key_splits<T>(s, s.B * blocks, longest_any, args.weights != nullptr);
  if (splits > 1) return forward_split(args, splits);
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    std::optional<ForwardScratch<T>> scratch;
    std::optional<RowScratch<T>> row_scratch;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, i0 = t % blocks * W;
      const int64_t rows = std::min(W, s.n - i0);
      if (by_rows<T>(rows)) {
        if (!row_scratch) row_scratch.emplace(s, args.weights != nullptr);
        for (int64_t i = i0; i < i0 + rows; ++i) forward_row(args, *row_scratch, b, i);
      } else {
        if (!scratch) {
          scratch.emplace(s, args.kb, args.weights != nullptr ? div_up(s.m, args.kb) : 0);
        }
        forward_block(args, *scratch, b, i0, rows);
      }
    }
  });
}

void forward(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
             const at::TensorBase& lens, double scale, const at::TensorBase& out,
             const at::TensorBase& lse, const at::TensorBase& weights) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::flash_attention_forward", [&] {
    forward_typed<scalar_t>(q, k, v, lens, scale, out, lse, weights);
  });
}

// ---------------------------------------------------------------- backward

template <typename T>
struct BackwardArgs {
  Dims s;
  const T *q, *k, *v, *out, *dout, *lse;
  const T *qpad, *kpad, *dopad;  // rows padded to ldq / ldq / ldv
  int64_t ldq, ldv;
  RowLengths lens;
  T scale;
  T *dq, *dk, *dv;
  // kDqLocks of them, a query block's rows of dQ taking one; null where
  // the sums are made deterministic (DqTarget) and no two threads add into
  // the same rows.
  std::mutex* dq_locks;
};

constexpr int64_t kDqLocks = 64;

// Where a run adds its tasks' shares of dQ for batch entry b: dQ's rows, or,
// for the entry a continuation run starts inside (deterministic sums, see
// Continuations), the run's own n × d share.
template <typename T>
struct DqTarget {
  int64_t entry = -1;
  T* share = nullptr;

  T* rows(const BackwardArgs<T>& a, int64_t b) const {
    return b == entry ? share : a.dq + b * a.s.n * a.s.d;
  }
};

// A's lock for a query block's rows of dQ, or none (deterministic sums).
template <typename T>
std::unique_lock<std::mutex> dq_lock(const BackwardArgs<T>& a, int64_t slot) {
  if (a.dq_locks == nullptr) return {};
  return std::unique_lock<std::mutex>(a.dq_locks[slot % kDqLocks]);
}

template <typename T>
struct BackwardScratch {
  int64_t kb;  // the call's key block (key_block_size), the row stride of p and dp
  // p and dp, then dS in dp's place; dk, dv and dq only where the outputs'
  // rows are not whole tiles (else the products accumulate in the outputs).
  std::vector<T> p, dp, dk, dv, dq, delta;
  T *dk_rows = nullptr, *dv_rows = nullptr;  // where the current key block accumulates
  std::vector<int64_t> len;
  // Kᵀ and Vᵀ of the task's key block in panels (each key block belongs to
  // one task, so nothing is packed twice).
  std::unique_ptr<T[]> kp, vtp;
  DqTarget<T> target;

  BackwardScratch(const Dims& s, int64_t ldq, int64_t ldv, int64_t kb)
      : kb(kb),
        p(kQueryBlock * kb),
        dp(kQueryBlock * kb),
        dk(ldq == s.d ? 0 : kb * ldq),
        dv(ldv == s.dv ? 0 : kb * ldv),
        dq(ldq == s.d ? 0 : kQueryBlock * ldq),
        delta(kQueryBlock),
        len(kQueryBlock),
        kp(uninitialized_buffer<T>(kb * s.d)),
        vtp(uninitialized_buffer<T>(kb * s.dv)) {}
};

// One query block's contribution to key block [j0, j0 + kc) of batch entry b.
template <typename T>
void backward_pair(const BackwardArgs<T>& a, BackwardScratch<T>& w, int64_t b, int64_t i0,
                   int64_t rows, int64_t j0, int64_t kc) {
  constexpr int64_t W = kTileCols<T>;
  using V = Vectorized<T>;
  const Dims& s = a.s;
  const int64_t tiles = div_up(kc, W);
  const int64_t row0 = b * s.n + i0;
  gemm<T>(rows, tiles, s.d, a.q + row0 * s.d, s.d, w.kp.get(), W, s.d * W, w.p.data(), w.kb, false);
  gemm<T>(rows, tiles, s.dv, a.dout + row0 * s.dv, s.dv, w.vtp.get(), W, s.dv * W, w.dp.data(),
          w.kb, false);
  const V vscale(a.scale);
  for (int64_t r = 0; r < rows; ++r) {
    T* p = w.p.data() + r * w.kb;
    T* ds = w.dp.data() + r * w.kb;
    const int64_t valid = std::clamp<int64_t>(w.len[r] - j0, 0, kc);
    exp_row(p, valid, kc, a.scale, a.lse[row0 + r]);
    // dS = scale · P ∘ (dP - D) on the valid keys, D = rowsum(dO ∘ O), and
    // exactly 0 past them, where dP may hold anything that padding values
    // produce.
    const V delta(w.delta[r]);
    int64_t j = 0;
    for (; j + V::size() <= valid; j += V::size()) {
      (vscale * V::loadu(p + j) * (V::loadu(ds + j) - delta)).store(ds + j);
    }
    if (j < valid) {
      const V g = vscale * V::loadu(p + j) * (V::loadu(ds + j) - delta);
      set_first(V(T(0)), g, valid - j).store(ds + j);
      j += V::size();
    }
    if (j < kc) std::fill(ds + j, ds + kc, T(0));
  }
  // dV += Pᵀ dO and dK += dSᵀ Q, reading P and dS transposed.
  gemm<T, true>(kc, a.ldv / W, rows, w.p.data(), w.kb, a.dopad + row0 * a.ldv, a.ldv, W,
                w.dv_rows, a.ldv, true);
  gemm<T, true>(kc, a.ldq / W, rows, w.dp.data(), w.kb, a.qpad + row0 * a.ldq, a.ldq, W,
                w.dk_rows, a.ldq, true);
  // dQ += dS K into the query block's rows under their lock: no per-thread
  // copy of dQ (nor a share of it, where its rows are whole tiles).
  const T* kpad = a.kpad + (b * s.m + j0) * a.ldq;
  T* dq_rows = w.target.rows(a, b) + i0 * s.d;
  const int64_t slot = b * div_up(s.n, kQueryBlock) + i0 / kQueryBlock;
  if (w.dq.empty()) {
    const auto guard = dq_lock(a, slot);
    gemm<T>(rows, a.ldq / W, kc, w.dp.data(), w.kb, kpad, a.ldq, W, dq_rows, s.d, true);
    return;
  }
  gemm<T>(rows, a.ldq / W, kc, w.dp.data(), w.kb, kpad, a.ldq, W, w.dq.data(), a.ldq, false);
  const auto guard = dq_lock(a, slot);
  for (int64_t r = 0; r < rows; ++r) {
    T* dq = dq_rows + r * s.d;
    const T* share = w.dq.data() + r * a.ldq;
    for (int64_t c = 0; c < s.d; ++c) dq[c] += share[c];
  }
}

// dK and dV of key block [j0, j0 + kc) of batch entry b, and its share of dQ.
// Each key block starts at a different query block, so that threads working
// on one batch entry seldom wait for the same lock of dQ.
template <typename T>
void backward_block(const BackwardArgs<T>& a, BackwardScratch<T>& w, int64_t b, int64_t j0,
                    int64_t kc) {
  const Dims& s = a.s;
  pack_transposed(a.k + (b * s.m + j0) * s.d, kc, s.d, w.kp.get());
  pack_transposed(a.v + (b * s.m + j0) * s.dv, kc, s.dv, w.vtp.get());
  w.dk_rows = w.dk.empty() ? a.dk + (b * s.m + j0) * s.d : w.dk.data();
  w.dv_rows = w.dv.empty() ? a.dv + (b * s.m + j0) * s.dv : w.dv.data();
  std::fill_n(w.dk_rows, kc * a.ldq, T(0));
  std::fill_n(w.dv_rows, kc * a.ldv, T(0));
  const int64_t blocks = div_up(s.n, kQueryBlock);
  for (int64_t q = 0; q < blocks; ++q) {
    const int64_t i0 = (j0 / w.kb + q) % blocks * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, s.n - i0);
    int64_t longest = 0;
    for (int64_t r = 0; r < rows; ++r) {
      w.len[r] = a.lens.at(b * s.n + i0 + r, s.m);
      longest = std::max(longest, w.len[r]);
    }
    if (longest <= j0) continue;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = b * s.n + i0 + r;
      w.delta[r] = dot(a.dout + i * s.dv, a.out + i * s.dv, s.dv);
    }
    backward_pair(a, w, b, i0, rows, j0, std::min(kc, longest - j0));
  }
  for (int64_t j = 0; j < kc; ++j) {
    if (!w.dk.empty()) {
      std::memcpy(a.dk + (b * s.m + j0 + j) * s.d, w.dk.data() + j * a.ldq, s.d * sizeof(T));
    }
    if (!w.dv.empty()) {
      std::memcpy(a.dv + (b * s.m + j0 + j) * s.dv, w.dv.data() + j * a.ldv, s.dv * sizeof(T));
    }
  }
}

// Scratch of backward_rows for a batch entry of n queries: each query's
// share of dQ (n × d), and for one vector of keys their scores and dO·v,
// then p and dS.
template <typename T>
struct RowsScratch {
  explicit RowsScratch(const Dims& s)
      : dq_shares(s.n * s.d), p(Vectorized<T>::size()), ds(Vectorized<T>::size()) {}
  std::vector<T> dq_shares, p, ds;
  DqTarget<T> target;
};

// Key block [j0, j0 + kc) of batch entry b when the batch entry has only a
// few queries (decoding shapes): query by query and, within a query, one
// vector of keys at a time, as the forward's forward_row, with no packing,
// no padded copies and no register tiles of which one row is real. For a
// vector of keys the query's dot products (q·k and dO·v, independent chains)
// come first, then p = exp(scale·q·k - lse) and dS = scale·p·(dO·v - D) in
// one vector (a libm expf per pair took a tenth of the book's
// forward+backward at 2 threads; a vector across queries, one lane at one
// query, made decoding slower); then each key's rows of dV and dK get p·dO
// and dS·q, and the query's share of dQ gets dS·k, added into dQ under the
// batch entry's lock at the end. The block ends at the batch entry's
// longest length, so every key of it is seen: the first query that sees a
// key writes its rows of dK and dV and later ones add to them (no zero-fill
// pass first). Lanes past a query's valid keys hold stale values and are
// never read.
template <typename T>
void backward_rows(const BackwardArgs<T>& a, RowsScratch<T>& w, int64_t b, int64_t j0,
                   int64_t kc) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  const Dims& s = a.s;
  const int64_t row0 = b * s.n;
  T *p = w.p.data(), *ds = w.ds.data();
  std::fill(w.dq_shares.begin(), w.dq_shares.end(), T(0));
  T* dk = a.dk + (b * s.m + j0) * s.d;
  T* dv = a.dv + (b * s.m + j0) * s.dv;
  const T* k = a.k + (b * s.m + j0) * s.d;
  const T* v = a.v + (b * s.m + j0) * s.dv;
  const V vscale(a.scale);
  int64_t written = 0;  // keys [0, written) of the block have their rows of dK and dV
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t valid = std::clamp<int64_t>(a.lens.at(row0 + i, s.m) - j0, 0, kc);
    if (valid == 0) continue;
    const T* q = a.q + (row0 + i) * s.d;
    const T* dout = a.dout + (row0 + i) * s.dv;
    T* dq_share = w.dq_shares.data() + i * s.d;
    const V lse(a.lse[row0 + i]), delta(dot(dout, a.out + (row0 + i) * s.dv, s.dv));
    for (int64_t g = 0; g < valid; g += S) {
      const int64_t r = std::min(S, valid - g);
      for (int64_t j = 0; j < r; ++j) {
        p[j] = dot(q, k + (g + j) * s.d, s.d);
        ds[j] = dot(dout, v + (g + j) * s.dv, s.dv);
      }
      const V e = softmax_exp(vscale * V::loadu(p) - lse);
      e.store(p);
      (vscale * e * (V::loadu(ds) - delta)).store(ds);
      for (int64_t j = 0; j < r; ++j) {
        const int64_t key = g + j;
        if (key >= written) {
          axpy<false>(dv + key * s.dv, dout, p[j], s.dv);
          axpy<false>(dk + key * s.d, q, ds[j], s.d);
        } else {
          axpy<true>(dv + key * s.dv, dout, p[j], s.dv);
          axpy<true>(dk + key * s.d, q, ds[j], s.d);
        }
        axpy<true>(dq_share, k + key * s.d, ds[j], s.d);
      }
    }
    written = std::max(written, valid);
  }
  T* dq = w.target.rows(a, b);
  const auto guard = dq_lock(a, b);
  for (int64_t i = 0; i < s.n; ++i) {
    if (a.lens.at(row0 + i, s.m) > j0) {
      axpy<true>(dq + i * s.d, w.dq_shares.data() + i * s.d, T(1), s.d);
    }
  }
}

// Whether the runs of the block path can add every shared batch entry's dQ
// in run order by scheduling alone, with no share and no lock: each run that
// continues an entry also holds tasks of other entries, which it runs first,
// and takes its part of the continued entry last, after the run before it
// (which runs that entry's tasks first) is done with them. It must not wait
// long: the earlier run's part must cost no more than the later run's other
// tasks. Waits point only to earlier runs, whose first tasks wait for
// nothing, so runs that share a thread (in order) cannot deadlock.
inline bool ordered_runs(const Continuations& c, const std::vector<int64_t>& bounds,
                         const std::vector<int64_t>& task_b, const std::vector<int64_t>& costs) {
  for (int64_t i = 0; i < c.size(); ++i) {
    const int64_t r = c.run[i], b = c.entry[i];
    const int64_t t0 = bounds[r], t1 = bounds[r + 1];
    if (task_b[t1 - 1] == b) return false;  // nothing else to run first
    int64_t others = 0, earlier = 0;
    for (int64_t t = t0; t < t1; ++t) others += task_b[t] == b ? 0 : costs[t];
    for (int64_t t = t0 - 1; t >= bounds[r - 1] && task_b[t] == b; --t) earlier += costs[t];
    if (earlier > others) return false;
  }
  return true;
}

// Whether the backward runs row by row (backward_rows) for n queries a batch
// entry whose valid lengths reach `longest`. Measured one thread, d = dv = 64,
// AVX-512 float, random lengths, forward+backward, rows against blocks: one to
// three queries 0.29-0.51x (n 1, m 2048: 3.5 against 12.0 ms), four 0.33x at
// m 64 and 0.99x at m 512; ten 0.82x at m 64 (d2l's (64, 10, 10), d 32:
// 150 against 221 us) but 1.52x at m 128; six at m 128 1.47x, sixteen at m 64
// 1.41x.
inline bool backward_by_rows(int64_t n, int64_t longest) {
  return n <= 4 || (n <= 12 && longest <= 64);
}

template <typename T>
void backward_typed(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                    const at::TensorBase& lens, double scale, const at::TensorBase& out,
                    const at::TensorBase& dout, const at::TensorBase& lse, const at::TensorBase& dq,
                    const at::TensorBase& dk, const at::TensorBase& dv) {
  const Dims s = dims_of(q, v);
  const T *qd = q.data_ptr<T>(), *kd = k.data_ptr<T>(), *vd = v.data_ptr<T>();
  const T *od = out.data_ptr<T>(), *dod = dout.data_ptr<T>();
  const RowLengths row_lens = row_lengths(lens, s.n);
  // Keys at or past a batch entry's longest length get no gradient.
  std::vector<int64_t> batch_longest(s.B);
  for (int64_t b = 0; b < s.B; ++b) batch_longest[b] = longest_length(row_lens, s, b, 0, s.n);
  T *dqd = dq.data_ptr<T>(), *dkd = dk.data_ptr<T>(), *dvd = dv.data_ptr<T>();
  // The zeros of the gradients, in parallel where there are at least kGrain
  // of them: dq (which the tasks add their shares to) and the rows of dk and
  // dv past each batch entry's longest length (the tasks write the rows below
  // it). With a grain of one batch entry, the toy shape (2 entries, 10 keys)
  // opened a parallel region for a few dozen zeros, and its forward+backward took
  // 19.1 us on 2 threads against 16.3 us on 1.
  const int64_t zeros_per_entry = s.n * s.d + s.m * (s.d + s.dv);
  at::parallel_for(0, s.B, grain_for(zeros_per_entry), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      std::fill_n(dqd + b * s.n * s.d, s.n * s.d, T(0));
      const int64_t from = b * s.m + batch_longest[b], to = (b + 1) * s.m;
      std::fill(dkd + from * s.d, dkd + to * s.d, T(0));
      std::fill(dvd + from * s.dv, dvd + to * s.dv, T(0));
    }
  });
  const int64_t longest =
      batch_longest.empty() ? 0 : *std::max_element(batch_longest.begin(), batch_longest.end());
  // A batch entry of a few queries runs row by row (backward_rows), which reads
  // every operand in place: no padded copies.
  const bool rows_path = backward_by_rows(s.n, longest);
  const Padded<T> qpad(qd, rows_path ? 0 : s.B * s.n, s.d),
      kpad(kd, rows_path ? 0 : s.B * s.m, s.d), dopad(dod, rows_path ? 0 : s.B * s.n, s.dv);
  // dQ's sums in a fixed order (Continuations) on the rows path, where a
  // run's share of an entry is n <= 12 rows, and wherever deterministic
  // algorithms are asked for (torch::use_deterministic_algorithms): there a
  // run that starts inside a batch entry holds n × d of its own, which at one
  // sequence of 8192 queries (d 64, 2 threads) puts the forward+backward's
  // peak at 4.5 MiB instead of 2.5, above SDPA's 4.1. Otherwise the runs
  // order the sums by scheduling where they can (ordered_runs: each shared
  // entry spans two runs, the later of which has other work to do first),
  // and only where they cannot do key blocks add into dQ under locks, in
  // the order the threads reach them.
  const bool deterministic = rows_path || at::globalContext().deterministicAlgorithms();
  const int64_t kb = key_block_size<T>(longest, 4);
  // Tasks: the key blocks of each batch entry below its longest length, at a
  // cost of the rows and keys their query blocks visit.
  std::vector<int64_t> task_b, task_j0, costs;
  for (int64_t b = 0; b < s.B; ++b) {
    std::vector<int64_t> block_longest;
    for (int64_t i0 = 0; i0 < s.n; i0 += kQueryBlock) {
      block_longest.push_back(longest_length(row_lens, s, b, i0, std::min(kQueryBlock, s.n - i0)));
    }
    for (int64_t j0 = 0; j0 < batch_longest[b]; j0 += kb) {
      // The key block's packing, and per visited (row, key) the
      // multiply-adds of five products (S, dP, dV, dK, dQ), 5/2 of the
      // forward's two (macs_to_grain). Costed as a forward pair, the book's
      // (64, 10, 10, d 32) backward came to 1.9 kGrain, stayed on the
      // calling thread, and its forward+backward took as long on 2 threads
      // as on 1.
      int64_t cost = std::min(kb, batch_longest[b] - j0);
      for (const int64_t block : block_longest) {
        cost += (rows_path ? s.n : kQueryBlock) * std::clamp<int64_t>(block - j0, 0, kb);
      }
      cost = cost * macs_to_grain(s) * 5 / 2;
      task_b.push_back(b);
      task_j0.push_back(j0);
      costs.push_back(cost);
    }
  }
  if (costs.empty()) return;
  const std::vector<int64_t> bounds = run_bounds(costs);
  const Continuations continued = continuations(bounds, [&](int64_t t) { return task_b[t]; });
  // Where every shared entry can be summed in run order by scheduling alone
  // (ordered_runs), no shares and no locks.
  const bool ordered = !deterministic && continued.size() > 0 &&
                       ordered_runs(continued, bounds, task_b, costs);
  const Continuations shared = deterministic ? continued : Continuations{};
  std::array<std::mutex, kDqLocks> dq_locks;
  const BackwardArgs<T> args{s,         qd,        kd,         vd,      od,       dod,
                             lse.data_ptr<T>(),    qpad.data,  kpad.data, dopad.data,
                             qpad.ld,   dopad.ld,  row_lens,   T(scale), dqd,     dkd,
                             dvd,       deterministic || ordered ? nullptr : dq_locks.data()};
  const int64_t share_size = s.n * s.d;
  const auto shares = shared.size() > 0 ? uninitialized_buffer<T>(shared.size() * share_size)
                                         : std::unique_ptr<T[]>();
  const auto target_of = [&](int64_t r) {
    DqTarget<T> target;
    if (const int64_t slot = shared.slot_of(r); slot >= 0) {
      target.entry = shared.entry[slot];
      target.share = shares.get() + slot * share_size;
      std::fill_n(target.share, share_size, T(0));
    }
    return target;
  };
  // ready[r]: run r - 1 has added its tasks of the entry run r continues.
  std::vector<std::atomic<bool>> ready(ordered ? bounds.size() : 0);
  for_each_run(bounds, [&](int64_t r, int64_t t0, int64_t t1) {
    if (rows_path) {
      RowsScratch<T> scratch(s);
      scratch.target = target_of(r);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = task_b[t], j0 = task_j0[t];
        backward_rows(args, scratch, b, j0, std::min(kb, batch_longest[b] - j0));
      }
      return;
    }
    BackwardScratch<T> scratch(s, qpad.ld, dopad.ld, kb);
    scratch.target = target_of(r);
    const auto run = [&](int64_t first, int64_t last) {
      for (int64_t t = first; t < last; ++t) {
        const int64_t b = task_b[t], j0 = task_j0[t];
        backward_block(args, scratch, b, j0, std::min(kb, batch_longest[b] - j0));
      }
    };
    if (!ordered) return run(t0, t1);
    // The entry this run continues (its head) goes last, once the run that
    // holds the entry's first tasks has added them; the entry the next run
    // continues (its tail) goes first, and says so when done.
    int64_t head_end = t0, tail_begin = t1;
    if (continued.slot_of(r) >= 0) {
      while (task_b[head_end] == task_b[t0]) ++head_end;
    }
    if (continued.slot_of(r + 1) >= 0) {
      while (tail_begin > head_end && task_b[tail_begin - 1] == task_b[t1 - 1]) --tail_begin;
    }
    run(tail_begin, t1);
    if (tail_begin < t1) ready[r + 1].store(true, std::memory_order_release);
    run(head_end, tail_begin);
    if (t0 < head_end) {
      while (!ready[r].load(std::memory_order_acquire)) std::this_thread::yield();
      run(t0, head_end);
    }
  });
  add_shares(shared, shares.get(), share_size, [&](int64_t b) { return dqd + b * share_size; });
}

void backward(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
              const at::TensorBase& lens, double scale, const at::TensorBase& out,
              const at::TensorBase& dout, const at::TensorBase& lse, const at::TensorBase& dq,
              const at::TensorBase& dk, const at::TensorBase& dv) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::flash_attention_backward", [&] {
    backward_typed<scalar_t>(q, k, v, lens, scale, out, dout, lse, dq, dk, dv);
  });
}

}  // namespace

const DotProductAttentionKernels& dot_product_attention_kernels() {
  static const DotProductAttentionKernels table{&forward, &backward};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
