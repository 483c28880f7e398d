#pragma once

// The flash dot-product kernel's row-by-row paths, for blocks of a few
// queries (decoding: one query a step): the forward's (forward_row, and
// forward_split, which splits one row's keys over threads) and what the
// backward's (backward_rows, flash_rows_backward-inl.h) shares with them.
// Note [Flash attention] in dot_product_attention_kernel.cpp; included
// inside each instruction set's CPU_CAPABILITY namespace, by
// dot_product_attention_forward_kernel.cpp and
// dot_product_attention_backward_kernel.cpp.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/flash_blocks-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// ------------------------------------------------- forward, a few queries

// A block of only a few queries (decoding: one query a step) runs row by row
// instead: as a block of W columns (32 floats on AVX-512), at one query 31 of
// every 32 lanes of its products and exponentials would be padding. A row's
// scores are dot products with its valid keys (scaled), then their
// exponentials and Σ p V, two passes over at most kRowChunk scores a thread
// (longer rows go chunk by chunk with an online softmax); with weights the
// whole row's scores are kept and written in place, contiguous.

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
  // A bfloat16 row's query widened and its output before rounding.
  std::unique_ptr<T[]> query, out;

  RowScratch(const Dims& s, bool whole_rows)
      : room(round_up_to_tile<T>(whole_rows ? s.m : std::min(s.m, kRowChunk))) {
    scores = uninitialized_buffer<T>(room);
  }
};

// A row of n operands as T: x itself, or a bfloat16 row widened into the
// scratch's buffer.
template <typename T, typename In>
const T* widened_row(const In* x, int64_t n, std::unique_ptr<T[]>& buffer) {
  if constexpr (std::is_same_v<In, T>) {
    return x;
  } else {
    if (!buffer) buffer = uninitialized_buffer<T>(n);
    widen(x, n, buffer.get());
    return buffer.get();
  }
}

// Where a row's output of n values is made: the output itself, or for a
// bfloat16 output the scratch's buffer, rounded into it by store_row.
template <typename T, typename In>
T* output_row(In* x, int64_t n, std::unique_ptr<T[]>& buffer) {
  if constexpr (std::is_same_v<In, T>) {
    return x;
  } else {
    if (!buffer) buffer = uninitialized_buffer<T>(n);
    return buffer.get();
  }
}

template <typename T, typename In>
void store_row(const T* row, In* x, int64_t n) {
  if constexpr (!std::is_same_v<In, T>) narrow(row, n, x);
}

// out[0:cols] = factor · Σ_{j < L} p[j] V[j, 0:cols] for cols <= G vectors,
// accumulated in G registers over one pass down V's rows (row stride ldv);
// the last vector partial where the columns end.
// With `keep` (a chunk of a row after the first), out = keep · out +
// factor · Σ instead.
template <typename T, int G, typename In>
void weighted_sum_group(const T* p, const In* v, int64_t ldv, int64_t L, int64_t cols, T* out,
                        T factor, const T* keep) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  V acc[G];
  for (int g = 0; g < G; ++g) acc[g] = V(T(0));
  const int64_t whole = cols / S, tail = cols % S;
  for (int64_t j = 0; j < L; ++j) {
    const V pj(p[j]);
    const In* row = v + j * ldv;
    for (int64_t g = 0; g < whole; ++g) {
      acc[g] = at::vec::fmadd(pj, load_widened(row + g * S), acc[g]);
    }
    if (tail > 0) {
      acc[whole] = at::vec::fmadd(pj, load_widened(row + whole * S, tail), acc[whole]);
    }
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
template <typename T, typename In>
void weighted_sum(const T* p, const In* v, int64_t dv, int64_t L, T* out, T factor,
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

template <typename T, typename In, typename Out>
RowPartial<T> row_partial(const ForwardArgs<T, In, Out>& a, RowScratch<T>& w, const T* q,
                          const In* k, const In* v, int64_t j0, int64_t j1, T* out) {
  const Dims& s = a.s;
  T* sc = w.scores.get();
  RowPartial<T> r{-std::numeric_limits<T>::infinity(), T(0)};
  if (j0 == j1) std::fill_n(out, s.dv, T(0));
  const T scale = a.scale * FlashExp<T>::kLogBase;
  for (int64_t c0 = j0; c0 < j1; c0 += kRowChunk) {
    const int64_t c = std::min(kRowChunk, j1 - c0);
    for (int64_t j = 0; j < c; ++j) sc[j] = scale * dot(q, k + (c0 + j) * s.d, s.d);
    const T mx = std::max(r.mx, row_max(sc, c, w.room));
    // Nothing to keep after the first chunk, or after chunks of -inf only
    // (their output is 0; e^(0 - mx) could overflow).
    const bool nothing = c0 == j0 || r.mx == -std::numeric_limits<T>::infinity();
    const T keep = nothing ? T(0) : FlashExp<T>::exp(r.mx - mx);
    r.sum = r.sum * keep + exp_row(sc, c, c, shift_for(mx));
    weighted_sum(sc, v + c0 * s.dv, s.dv, c, out, T(1), c0 == j0 ? nullptr : &keep);
    r.mx = mx;
  }
  return r;
}

// Query row i of batch entry b (operands of type In, output of type Out;
// weights only where both are T), over its keys [F, L) (F = 0 without
// bands): nothing is computed for the keys outside them.
template <typename T, typename In, typename Out>
void forward_row(const ForwardArgs<T, In, Out>& a, RowScratch<T>& w, int64_t b, int64_t i) {
  const Dims& s = a.s;
  const int64_t row = b * s.n + i, L = a.lens.at(row, s.m), F = a.lens.first(row);
  T* out = output_row(a.out + row * s.dv, s.dv, w.out);
  T* weights = a.weights != nullptr ? a.weights + row * s.m : nullptr;
  if (L == 0) {
    std::fill_n(a.out + row * s.dv, s.dv, Out(0));
    a.lse[row] = -std::numeric_limits<T>::infinity();
    if (weights != nullptr) std::fill_n(weights, s.m, T(0));
    return;
  }
  const T* q = widened_row(a.q + row * s.d, s.d, w.query);
  const In* k = a.k + b * s.m * s.d;
  if (weights == nullptr && L - F > kRowChunk) {
    const RowPartial<T> r = row_partial(a, w, q, k, a.v + b * s.m * s.dv, F, L, out);
    scale_row(out, s.dv, T(1) / r.sum);
    store_row(out, a.out + row * s.dv, s.dv);
    a.lse[row] = FlashExp<T>::lse(shift_for(r.mx), r.sum);
    return;
  }
  T* sc = w.scores.get();
  const T scale = a.scale * FlashExp<T>::kLogBase;
  const int64_t count = L - F;
  for (int64_t j = 0; j < count; ++j) sc[j] = scale * dot(q, k + (F + j) * s.d, s.d);
  const T mx = row_max(sc, count, w.room);
  // A maximum of -inf (every score -inf) gives NaN here as it does in the
  // blocks and the composite path: such keys hold infinities.
  const T sum = exp_row(sc, count, count, mx);
  const T inv = T(1) / sum;
  a.lse[row] = FlashExp<T>::lse(mx, sum);
  weighted_sum(sc, a.v + (b * s.m + F) * s.dv, s.dv, count, out, inv);
  store_row(out, a.out + row * s.dv, s.dv);
  if (weights != nullptr) {
    std::fill(weights, weights + F, T(0));
    std::copy_n(sc, count, weights + F);
    scale_row(weights + F, count, inv);
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
  return rows * 3 <= kTileCols<T>;
}

// Decoding with fewer batch entries than threads (one sequence's heads, say)
// splits each row's keys over threads instead (as flash-decoding does on
// GPUs): `splits` parts of at least kRowChunk keys each, every part a
// row_partial into its own slot of dv + 2 values (out, maximum, sum), then
// one pass per row combines them, each part's output and sum rescaled by
// e^(its shift - the row's shift). Without it, B·H = 1 ran on one thread
// whatever the pool. `longest`: the most keys a row sees (its band's width).
template <typename T>
int64_t key_splits(const Dims& s, int64_t tasks, int64_t longest, bool weights) {
  const int64_t threads = at::get_num_threads();
  if (weights || tasks >= threads || !by_rows<T>(s.n)) return 1;
  return std::clamp<int64_t>(std::min(threads / tasks, longest / kRowChunk), 1, threads);
}

template <typename T, typename In, typename Out>
void forward_split(const ForwardArgs<T, In, Out>& a, int64_t splits) {
  const Dims& s = a.s;
  const int64_t slot = s.dv + 2, rows = s.B * s.n;
  std::vector<T> parts(rows * splits * slot);
  std::vector<int64_t> costs(rows * splits);
  for (int64_t t = 0; t < rows * splits; ++t) {
    const int64_t row = t / splits;
    const int64_t keys = a.lens.at(row, s.m) - a.lens.first(row);
    costs[t] = (div_up(keys, splits) + 1) * macs_to_grain(s);
  }
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    RowScratch<T> w(s, false);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / splits, part = t % splits, b = row / s.n;
      // Part `part` of the row's keys [F, L).
      const int64_t F = a.lens.first(row), keys = a.lens.at(row, s.m) - F;
      T* out = parts.data() + t * slot;
      const RowPartial<T> r = row_partial(
          a, w, widened_row(a.q + row * s.d, s.d, w.query), a.k + b * s.m * s.d,
          a.v + b * s.m * s.dv, F + keys * part / splits, F + keys * (part + 1) / splits, out);
      out[s.dv] = r.mx;
      out[s.dv + 1] = r.sum;
    }
  });
  constexpr T kNone = -std::numeric_limits<T>::infinity();
  std::unique_ptr<T[]> row_out;
  for (int64_t row = 0; row < rows; ++row) {
    T* out = output_row(a.out + row * s.dv, s.dv, row_out);
    const T* first = parts.data() + row * splits * slot;
    if (a.lens.at(row, s.m) == 0) {
      std::fill_n(a.out + row * s.dv, s.dv, Out(0));
      a.lse[row] = kNone;
      continue;
    }
    T mx = kNone;
    for (int64_t p = 0; p < splits; ++p) mx = std::max(mx, first[p * slot + s.dv]);
    T sum = 0;
    for (int64_t p = 0; p < splits; ++p) {
      const T* part = first + p * slot;
      // A part of -inf scores only holds zeros (and e^(0 - mx) may overflow).
      const T factor = part[s.dv] == kNone ? T(0) : FlashExp<T>::exp(part[s.dv] - shift_for(mx));
      sum += factor * part[s.dv + 1];
      if (p == 0) {
        std::copy_n(part, s.dv, out);
        scale_row(out, s.dv, factor);
      } else {
        axpy<true>(out, part, factor, s.dv);
      }
    }
    scale_row(out, s.dv, T(1) / sum);
    store_row(out, a.out + row * s.dv, s.dv);
    a.lse[row] = FlashExp<T>::lse(shift_for(mx), sum);
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
