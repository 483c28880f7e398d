#pragma once

// The flash dot-product kernel's backward by blocks: a thread's scratch
// (BackwardScratch), one query block's contribution to a key block
// (backward_pair) and a key block's dK, dV and share of dQ
// (backward_block). Note [Flash attention] in
// dot_product_attention_kernel.cpp; included by
// dot_product_attention_backward_kernel.cpp, once per instruction set.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cpu/flash_blocks-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

template <typename T>
struct BackwardScratch {
  int64_t kb;  // the call's key block (key_block_size), the row stride of p and dp
  // p and dp, then dS in dp's place; dk, dv and dq only where the outputs'
  // rows are not whole tiles (else the products accumulate in the outputs).
  std::vector<T> p, dp, dk, dv, dq, delta;
  std::vector<T> values;                     // a bfloat16 call's key block of V, widened
  T *dk_rows = nullptr, *dv_rows = nullptr;  // where the current key block accumulates
  // The rows the tiles read, padded to whole tiles (padded_rows): batch
  // entry `entry`'s Q and dO, and the current key block's K; in place where
  // the operands already are, else the thread's copies (a batch entry's
  // once, however many of its key blocks the thread takes).
  int64_t entry = -1;
  const T *q_rows = nullptr, *do_rows = nullptr, *k_rows = nullptr;
  std::vector<T> queries, douts, keys;
  std::vector<int64_t> first, len;  // a query block's bands (first 0 without bands)
  std::vector<KeySpan> spans;       // each query block's of batch entry `entry` (key_span)
  // Kᵀ and Vᵀ of the task's key block in panels (each key block belongs to
  // one task, so nothing is packed twice).
  std::unique_ptr<T[]> kp, vtp;
  DqTarget<T> target;

  // in_place: whether dK and dV are of type T (else rows of a key block
  // accumulate in dk and dv and are rounded once it is done).
  BackwardScratch(const Dims& s, int64_t ldq, int64_t ldv, int64_t kb, bool in_place)
      : kb(kb),
        p(kQueryBlock * kb),
        dp(kQueryBlock * kb),
        dk(in_place && ldq == s.d ? 0 : kb * ldq),
        dv(in_place && ldv == s.dv ? 0 : kb * ldv),
        dq(ldq == s.d ? 0 : kQueryBlock * ldq),
        delta(kQueryBlock),
        first(kQueryBlock),
        len(kQueryBlock),
        kp(uninitialized_buffer<T>(kb * s.d)),
        vtp(uninitialized_buffer<T>(kb * s.dv)) {}
};

// One query block's contribution to keys [j0 + k0, j0 + kc) of key block
// [j0, j0 + kc) of batch entry b: k0, a whole number of tiles, skips the
// key block's tiles before the query block's earliest first key (Note
// [Bands of keys]); 0 without bands.
template <typename T, typename In>
void backward_pair(const BackwardArgs<T, In>& a, BackwardScratch<T>& w, int64_t b, int64_t i0,
                   int64_t rows, int64_t j0, int64_t k0, int64_t kc) {
  constexpr int64_t W = kTileCols<T>;
  using V = Vectorized<T>;
  const Dims& s = a.s;
  // From here on the pair's keys: [j0, j0 + kc) and each operand's and
  // output's columns or rows of keys moved on by k0.
  j0 += k0;
  kc -= k0;
  const int64_t tiles = div_up(kc, W);
  const int64_t row0 = b * s.n + i0;
  T *pp = w.p.data() + k0, *dpp = w.dp.data() + k0;
  T *dk_rows = w.dk_rows + k0 * a.ldq, *dv_rows = w.dv_rows + k0 * a.ldv;
  // P and dP up to kc rounded to a vector: what exp_row and dS below read.
  const int64_t last_cols = kc - (tiles - 1) * W;
  const T* q_rows = w.q_rows + i0 * a.ldq;
  const T* do_rows = w.do_rows + i0 * a.ldv;
  gemm<T>(rows, tiles, s.d, q_rows, a.ldq, w.kp.get() + k0 * s.d, W, s.d * W, pp, w.kb, false,
          last_cols);
  gemm<T>(rows, tiles, s.dv, do_rows, a.ldv, w.vtp.get() + k0 * s.dv, W, s.dv * W, dpp, w.kb, false,
          last_cols);
  const V vscale(a.scale);
  for (int64_t r = 0; r < rows; ++r) {
    T* p = pp + r * w.kb;
    T* ds = dpp + r * w.kb;
    const int64_t valid = std::clamp<int64_t>(w.len[r] - j0, 0, kc);
    // Keys before the row's first (bands only) are computed, then zeroed.
    const int64_t skip = std::clamp<int64_t>(w.first[r] - j0, 0, valid);
    exp_row(p, valid, kc, a.lse[row0 + r] * FlashExp<T>::kLogBase);
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
    if (skip > 0) {
      std::fill_n(p, skip, T(0));
      std::fill_n(ds, skip, T(0));
    }
  }
  // dV += Pᵀ dO and dK += dSᵀ Q, reading P and dS transposed.
  gemm<T, true>(kc, a.ldv / W, rows, pp, w.kb, do_rows, a.ldv, W, dv_rows, a.ldv, true);
  gemm<T, true>(kc, a.ldq / W, rows, dpp, w.kb, q_rows, a.ldq, W, dk_rows, a.ldq, true);
  // dQ += dS K into the query block's rows under their lock: no per-thread
  // copy of dQ (nor a share of it, where its rows are whole tiles).
  const T* kpad = w.k_rows + k0 * a.ldq;
  T* dq_rows = w.target.rows(a, b) + i0 * s.d;
  const int64_t slot = b * div_up(s.n, kQueryBlock) + i0 / kQueryBlock;
  if (w.dq.empty()) {
    const auto guard = dq_lock(a, slot);
    gemm<T>(rows, a.ldq / W, kc, dpp, w.kb, kpad, a.ldq, W, dq_rows, s.d, true);
    return;
  }
  gemm<T>(rows, a.ldq / W, kc, dpp, w.kb, kpad, a.ldq, W, w.dq.data(), a.ldq, false);
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
template <typename T, typename In>
void backward_block(const BackwardArgs<T, In>& a, BackwardScratch<T>& w, int64_t b, int64_t j0,
                    int64_t kc) {
  const Dims& s = a.s;
  const int64_t blocks = div_up(s.n, kQueryBlock);
  if (w.entry != b) {
    w.q_rows = padded_rows(a.q + b * s.n * s.d, s.n, s.d, a.ldq, w.queries);
    w.do_rows = padded_rows(a.dout + b * s.n * s.dv, s.n, s.dv, a.ldv, w.douts);
    w.spans.resize(blocks);
    for (int64_t q = 0; q < blocks; ++q) {
      const int64_t i0 = q * kQueryBlock;
      w.spans[q] = key_span(a.lens, s, b, i0, std::min(kQueryBlock, s.n - i0));
    }
    w.entry = b;
  }
  w.k_rows = padded_rows(a.k + (b * s.m + j0) * s.d, kc, s.d, a.ldq, w.keys);
  pack_transposed(w.k_rows, kc, s.d, w.kp.get(), a.ldq);
  // Kᵀ as the scores' product reads it: multiplied by scale · kLogBase (Note
  // [Base-2 exponentials in the flash kernel]); dQ reads K itself.
  scale_row(w.kp.get(), div_up(kc, kTileCols<T>) * kTileCols<T> * s.d,
            a.scale * FlashExp<T>::kLogBase);
  if constexpr (std::is_same_v<In, T>) {
    pack_transposed(a.v + (b * s.m + j0) * s.dv, kc, s.dv, w.vtp.get());
  } else {
    w.values.resize(kc * s.dv);
    widen(a.v + (b * s.m + j0) * s.dv, kc * s.dv, w.values.data());
    pack_transposed(w.values.data(), kc, s.dv, w.vtp.get());
  }
  if constexpr (std::is_same_v<In, T>) {
    w.dk_rows = w.dk.empty() ? a.dk + (b * s.m + j0) * s.d : w.dk.data();
    w.dv_rows = w.dv.empty() ? a.dv + (b * s.m + j0) * s.dv : w.dv.data();
  } else {
    w.dk_rows = w.dk.data();
    w.dv_rows = w.dv.data();
  }
  std::fill_n(w.dk_rows, kc * a.ldq, T(0));
  std::fill_n(w.dv_rows, kc * a.ldv, T(0));
  // Only the query blocks whose keys reach the key block: with bands, a
  // key block of a sliding window meets a few of them, not all.
  for (int64_t q = 0; q < blocks; ++q) {
    const int64_t qb = (j0 / w.kb + q) % blocks, i0 = qb * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, s.n - i0);
    const KeySpan span = w.spans[qb];
    if (span.end <= j0 || span.first >= j0 + kc) continue;
    for (int64_t r = 0; r < rows; ++r) {
      w.len[r] = a.lens.at(b * s.n + i0 + r, s.m);
      w.first[r] = a.lens.first(b * s.n + i0 + r);
    }
    for (int64_t r = 0; r < rows; ++r) {
      w.delta[r] = dot(w.do_rows + (i0 + r) * a.ldv, a.out + (b * s.n + i0 + r) * s.dv, s.dv);
    }
    const int64_t k0 = std::max<int64_t>(span.first - j0, 0) / kTileCols<T> * kTileCols<T>;
    backward_pair(a, w, b, i0, rows, j0, k0, std::min(kc, span.end - j0));
  }
  for (int64_t j = 0; j < kc; ++j) {
    if (!w.dk.empty()) narrow(w.dk.data() + j * a.ldq, s.d, a.dk + (b * s.m + j0 + j) * s.d);
    if (!w.dv.empty()) narrow(w.dv.data() + j * a.ldv, s.dv, a.dv + (b * s.m + j0 + j) * s.dv);
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
