#pragma once

// The flash dot-product kernel's backward for batch entries of a few queries
// (decoding shapes), row by row: backward_rows, beside the forward's rows in
// flash_rows-inl.h. Note [Flash attention] in
// dot_product_attention_kernel.cpp; included by
// dot_product_attention_backward_kernel.cpp, once per instruction set.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/flash_blocks-inl.h"
#include "cpu/flash_rows-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// Scratch of backward_rows for a batch entry of n queries: each query's
// share of dQ (n × d), and for one vector of keys their scores and dO·v,
// then p and dS.
template <typename T>
struct RowsScratch {
  explicit RowsScratch(const Dims& s)
      : dq_shares(s.n * s.d), p(Vectorized<T>::size()), ds(Vectorized<T>::size()) {}
  std::vector<T> dq_shares, p, ds;
  // A bfloat16 call's rows of dK and dV for the key block, in T until the
  // block is done.
  std::vector<T> dk_block, dv_block;
  DqTarget<T> target;
  // A bfloat16 call's query and upstream gradient rows, widened.
  std::unique_ptr<T[]> query, dout;
};

// Key block [j0, j0 + kc) of batch entry b when the batch entry has only a
// few queries (decoding shapes): query by query and, within a query, one
// vector of keys at a time, as the forward's forward_row, with no packing,
// no padded copies and no register tiles of which one row is real. For a
// vector of keys the query's dot products (q·k and dO·v, independent chains)
// come first, then p = exp(scale·q·k - lse) (in the kernel's base, Note
// [Base-2 exponentials in the flash kernel]) and dS = scale·p·(dO·v - D) in
// one vector (a libm expf per pair took a tenth of the book's
// forward+backward at 2 threads; a vector across queries, one lane at one
// query, made decoding slower); then each key's rows of dV and dK get p·dO
// and dS·q, and the query's share of dQ gets dS·k, added into dQ under the
// batch entry's lock at the end. The block ends at the batch entry's
// longest length, so every key of it is seen: the first query that sees a
// key writes its rows of dK and dV and later ones add to them (no zero-fill
// pass first); with bands (Note [Bands of keys]) a key of the block may be
// seen by no query, so the block's rows are zeroed first and every query
// adds. bfloat16 rows are made in T and rounded once the block is done.
// Lanes past a query's valid keys hold stale values and are never read.
template <typename T, typename In>
void backward_rows(const BackwardArgs<T, In>& a, RowsScratch<T>& w, int64_t b, int64_t j0,
                   int64_t kc) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  const Dims& s = a.s;
  const int64_t row0 = b * s.n;
  T *p = w.p.data(), *ds = w.ds.data();
  std::fill(w.dq_shares.begin(), w.dq_shares.end(), T(0));
  T *dk, *dv;
  if constexpr (std::is_same_v<In, T>) {
    dk = a.dk + (b * s.m + j0) * s.d;
    dv = a.dv + (b * s.m + j0) * s.dv;
  } else {
    w.dk_block.resize(kc * s.d);
    w.dv_block.resize(kc * s.dv);
    dk = w.dk_block.data();
    dv = w.dv_block.data();
  }
  const In* k = a.k + (b * s.m + j0) * s.d;
  const In* v = a.v + (b * s.m + j0) * s.dv;
  const V vscale(a.scale), vscale_base(a.scale * FlashExp<T>::kLogBase);
  int64_t written = 0;  // keys [0, written) of the block have their rows of dK and dV
  if (a.lens.banded()) {
    std::fill_n(dk, kc * s.d, T(0));
    std::fill_n(dv, kc * s.dv, T(0));
    written = kc;
  }
  for (int64_t i = 0; i < s.n; ++i) {
    // The query's keys of the block: [lo, valid).
    const int64_t valid = std::clamp<int64_t>(a.lens.at(row0 + i, s.m) - j0, 0, kc);
    const int64_t lo = std::clamp<int64_t>(a.lens.first(row0 + i) - j0, 0, valid);
    if (lo == valid) continue;
    const T* q = widened_row(a.q + (row0 + i) * s.d, s.d, w.query);
    const T* dout = widened_row(a.dout + (row0 + i) * s.dv, s.dv, w.dout);
    T* dq_share = w.dq_shares.data() + i * s.d;
    const V lse(a.lse[row0 + i] * FlashExp<T>::kLogBase),
        delta(dot(dout, a.out + (row0 + i) * s.dv, s.dv));
    for (int64_t g = lo; g < valid; g += S) {
      const int64_t r = std::min(S, valid - g);
      for (int64_t j = 0; j < r; ++j) {
        p[j] = dot(q, k + (g + j) * s.d, s.d);
        ds[j] = dot(dout, v + (g + j) * s.dv, s.dv);
      }
      const V e = FlashExp<T>::exp(vscale_base * V::loadu(p) - lse);
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
  if constexpr (!std::is_same_v<In, T>) {
    narrow(dk, written * s.d, a.dk + (b * s.m + j0) * s.d);
    narrow(dv, written * s.dv, a.dv + (b * s.m + j0) * s.dv);
  }
  T* dq = w.target.rows(a, b);
  const auto guard = dq_lock(a, b);
  for (int64_t i = 0; i < s.n; ++i) {
    if (a.lens.at(row0 + i, s.m) > j0 && a.lens.first(row0 + i) < j0 + kc) {
      axpy<true>(dq + i * s.d, w.dq_shares.data() + i * s.d, T(1), s.d);
    }
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
