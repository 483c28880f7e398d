// Flash dot-product attention on the CPU, forward and backward: blocks of
// queries against blocks of keys with an online softmax, never holding more
// than one block of scores, and skipping every key block past the valid
// lengths (Note [Flash attention]). Compiled once per instruction set (Note
// [CPU kernels per instruction set]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "cpu/dot_product_attention_kernel.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/vec_helpers-inl.h"

// Note [Flash attention]
// The forward pass takes a block of kQueryBlock query rows of one batch entry
// and walks the keys in key blocks (up to kKeyBlock: forward_key_block), as
// FlashAttention does: the block's
// scores S = Q Kᵀ (gemm-inl.h), a running row maximum and sum, and the
// output accumulated as Σ exp(scale·S - max) V, rescaled whenever the
// maximum grows. Only keys below the longest valid length among the block's
// rows are visited: with lengths (B) a whole batch entry stops at its
// length, so padding costs nothing, where SDPA's mask still computes it.
// Inside a visited block, a row's entries past its own length are set to
// exactly 0 before they meet V, so nothing stored in padding (inf, NaN) can
// reach an output. The pass keeps lse = max + log(sum) per row.
//
// The backward pass recomputes P = exp(scale·S - lse) block by block and is
// parallel over (batch entry, key block): each task owns its rows of dK and
// dV, and adds each query block's share of dQ to dQ under that block's lock
// (one of 64, by block index). D = rowsum(dO ∘ O), computed per query block
// where it is used, replaces the row sums of dP ∘ P. Pᵀ dO and dSᵀ Q read P
// and dS transposed in place.
//
// Work is split into one run of tasks per thread, of about equal cost (rows
// times visited keys): with random lengths, equal numbers of tasks would
// leave one thread with most of the keys. Operands are packed so that every
// vector load in the products is a whole, contiguous one: Kᵀ (and Vᵀ) in
// panels of one register tile of keys, and Q, K, V, dO with their feature
// dimension padded to whole tiles (copies only where it is not already). The
// panels are packed where they are used, not for the whole call: in the
// forward, groups of up to kGroupBlocks query blocks of one batch entry walk
// the keys together, and each key block is packed once per group; in the
// backward each task packs its own key block. Beyond its outputs and lse, a
// call holds per thread one key block's operands and one block of scores (or
// P and dP): never (B, n, m), nor a packed copy of all of K and V, nor a
// per-thread copy of dQ, nor a (B, n) buffer of D (these put the kernel's
// peak memory at up to three times SDPA's). Where a feature dimension is a
// whole number of register tiles (d = 64, say), the forward accumulates in
// its output rows and the backward in its rows of dK, dV and dQ; otherwise
// in per-thread scratch.

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// ---------------------------------------------------------------- forward

template <typename T>
struct ForwardArgs {
  Dims s;
  const T *q, *k, *vp;  // v padded
  int64_t ldv;
  RowLengths lens;
  T scale;
  T *out, *lse;
  T* weights;  // (B, n, m), or null when no weights are asked
};

// Up to this many consecutive query blocks of one batch entry walk the keys
// together: each key block is packed once for the group and meets every
// block of the group while it is in cache.
constexpr int64_t kGroupBlocks = 8;

// One thread's state. Row r of the group's block g is row g·kQueryBlock + r
// of acc, row_max, row_sum, len and block_max.
template <typename T>
struct ForwardScratch {
  int64_t kb;  // the call's key block (forward_key_block), the score block's row stride
  std::vector<T> scores, acc, row_max, row_sum;
  std::vector<T> block_max;  // with weights: the maximum each key block was exponentiated at
  std::vector<int64_t> len, longest;  // longest: per block of the group
  std::unique_ptr<T[]> kp;            // Kᵀ of one key block in panels

  ForwardScratch(const Dims& s, int64_t ldv, int64_t kb, int64_t key_blocks)
      : kb(kb),
        scores(kQueryBlock * kb),
        acc(ldv == s.dv ? 0 : kGroupBlocks * kQueryBlock * ldv),
        row_max(kGroupBlocks * kQueryBlock),
        row_sum(kGroupBlocks * kQueryBlock),
        block_max(kGroupBlocks * kQueryBlock * key_blocks),
        len(kGroupBlocks * kQueryBlock),
        longest(kGroupBlocks),
        kp(uninitialized_buffer<T>(kb * s.d)) {}
};

// Where block g of the group (rows from i0 of batch entry b) accumulates its
// output, rows ldv apart: in the output itself where its rows are whole
// tiles, else in the thread's scratch.
template <typename T>
T* accumulator(const ForwardArgs<T>& a, ForwardScratch<T>& w, int64_t b, int64_t i0, int64_t g) {
  const Dims& s = a.s;
  return a.ldv == s.dv ? a.out + (b * s.n + i0) * s.dv : w.acc.data() + g * kQueryBlock * a.ldv;
}

// With weights, a key block's exponentials go out as they are made, relative
// to the row maximum at the time; once the row's final maximum and sum are
// known, each block is rescaled by exp(block max - max) / sum, and the keys
// past the row's length are zeroed. The weights are the only (B, n, m)
// memory, written once and rescaled while they are in cache.
template <typename T>
void finish_weights(const ForwardArgs<T>& a, const ForwardScratch<T>& w, int64_t b, int64_t i0,
                    int64_t rows, int64_t g) {
  const Dims& s = a.s;
  const int64_t key_blocks = div_up(s.m, w.kb);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t x = g * kQueryBlock + r;
    T* weights = a.weights + (b * s.n + i0 + r) * s.m;
    const int64_t len = w.len[x];
    for (int64_t j0 = 0; j0 < len; j0 += w.kb) {
      const T factor =
          std::exp(w.block_max[x * key_blocks + j0 / w.kb] - w.row_max[x]) / w.row_sum[x];
      scale_row(weights + j0, std::min(w.kb, len - j0), factor);
    }
    std::fill(weights + len, weights + s.m, T(0));
  }
}

// Block g of the group (query rows [i0, i0 + rows) of batch entry b) against
// key block j0, whose Kᵀ is packed in w.kp: scores, the online softmax, and
// the output accumulated.
template <typename T>
void attend_key_block(const ForwardArgs<T>& a, ForwardScratch<T>& w, int64_t b, int64_t i0,
                      int64_t rows, int64_t g, int64_t j0) {
  constexpr int64_t W = kTileCols<T>;
  const Dims& s = a.s;
  const int64_t kc = std::min(w.kb, w.longest[g] - j0);
  T* acc_block = accumulator(a, w, b, i0, g);
  gemm<T>(rows, div_up(kc, W), s.d, a.q + (b * s.n + i0) * s.d, s.d, w.kp.get(), W, s.d * W,
          w.scores.data(), w.kb, /*accumulate=*/false);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t x = g * kQueryBlock + r;
    T* row = w.scores.data() + r * w.kb;
    const int64_t valid = std::clamp<int64_t>(w.len[x] - j0, 0, kc);
    if (valid == 0) {
      std::fill(row, row + kc, T(0));
      continue;
    }
    const T old_max = w.row_max[x];
    const T new_max = std::max(old_max, row_max(row, valid, w.kb) * a.scale);
    const T correction = old_max == new_max ? T(1) : std::exp(old_max - new_max);
    w.row_sum[x] = w.row_sum[x] * correction + exp_row(row, valid, kc, a.scale, new_max);
    w.row_max[x] = new_max;
    if (a.weights != nullptr) {
      std::memcpy(a.weights + (b * s.n + i0 + r) * s.m + j0, row, valid * sizeof(T));
      w.block_max[x * div_up(s.m, w.kb) + j0 / w.kb] = new_max;
    }
    if (correction != T(1)) {
      T* acc = acc_block + r * a.ldv;
      for (int64_t c = 0; c < a.ldv; ++c) acc[c] *= correction;
    }
  }
  gemm<T>(rows, a.ldv / W, kc, w.scores.data(), w.kb, a.vp + (b * s.m + j0) * a.ldv, a.ldv, W,
          acc_block, a.ldv, /*accumulate=*/true);
}

// Query blocks [first, first + count) of batch entry b, walking the keys
// below the group's longest length one key block at a time.
template <typename T>
void forward_group(const ForwardArgs<T>& a, ForwardScratch<T>& w, int64_t b, int64_t first,
                   int64_t count) {
  const Dims& s = a.s;
  auto rows_of = [&](int64_t g) { return std::min(kQueryBlock, s.n - (first + g) * kQueryBlock); };
  int64_t group_longest = 0;
  for (int64_t g = 0; g < count; ++g) {
    const int64_t i0 = (first + g) * kQueryBlock;
    w.longest[g] = 0;
    for (int64_t r = 0; r < rows_of(g); ++r) {
      const int64_t len = a.lens.at(b * s.n + i0 + r, s.m);
      w.len[g * kQueryBlock + r] = len;
      w.longest[g] = std::max(w.longest[g], len);
    }
    group_longest = std::max(group_longest, w.longest[g]);
    std::fill_n(accumulator(a, w, b, i0, g), rows_of(g) * a.ldv, T(0));
    std::fill_n(w.row_max.begin() + g * kQueryBlock, kQueryBlock,
                -std::numeric_limits<T>::infinity());
    std::fill_n(w.row_sum.begin() + g * kQueryBlock, kQueryBlock, T(0));
  }
  for (int64_t j0 = 0; j0 < group_longest; j0 += w.kb) {
    pack_transposed(a.k + (b * s.m + j0) * s.d, std::min(w.kb, group_longest - j0), s.d,
                    w.kp.get());
    for (int64_t g = 0; g < count; ++g) {
      if (w.longest[g] > j0)
        attend_key_block(a, w, b, (first + g) * kQueryBlock, rows_of(g), g, j0);
    }
  }
  for (int64_t g = 0; g < count; ++g) {
    const int64_t i0 = (first + g) * kQueryBlock;
    for (int64_t r = 0; r < rows_of(g); ++r) {
      const int64_t x = g * kQueryBlock + r;
      T* out = a.out + (b * s.n + i0 + r) * s.dv;
      const T* acc = accumulator(a, w, b, i0, g) + r * a.ldv;  // may be `out` itself
      const bool empty = w.len[x] == 0;
      const T inv = empty ? T(0) : T(1) / w.row_sum[x];
      for (int64_t c = 0; c < s.dv; ++c) out[c] = empty ? T(0) : acc[c] * inv;
      a.lse[b * s.n + i0 + r] =
          empty ? -std::numeric_limits<T>::infinity() : w.row_max[x] + std::log(w.row_sum[x]);
    }
    if (a.weights != nullptr) finish_weights(a, w, b, i0, rows_of(g), g);
  }
}

template <typename T>
void forward_typed(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                   const at::TensorBase& lens, double scale, const at::TensorBase& out,
                   const at::TensorBase& lse, const at::TensorBase& weights) {
  const Dims s = dims_of(q, v);
  const Padded<T> vp(v.data_ptr<T>(), s.B * s.m, s.dv);
  const ForwardArgs<T> args{s,
                            q.data_ptr<T>(),
                            k.data_ptr<T>(),
                            vp.data,
                            vp.ld,
                            row_lengths(lens, s.n),
                            T(scale),
                            out.data_ptr<T>(),
                            lse.data_ptr<T>(),
                            weights.defined() ? weights.data_ptr<T>() : nullptr};
  const int64_t blocks = div_up(s.n, kQueryBlock);
  std::vector<int64_t> costs(s.B * blocks);
  int64_t longest_any = 0;
  for (int64_t t = 0; t < s.B * blocks; ++t) {
    const int64_t b = t / blocks, i0 = t % blocks * kQueryBlock;
    const int64_t rows = std::min(kQueryBlock, s.n - i0);
    const int64_t longest = longest_length(args.lens, s, b, i0, rows);
    longest_any = std::max(longest_any, longest);
    costs[t] = rows * (longest + 16);
  }
  const int64_t kb = forward_key_block<T>(longest_any);
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    ForwardScratch<T> scratch(s, vp.ld, kb, args.weights != nullptr ? div_up(s.m, kb) : 0);
    for (int64_t t = t0; t < t1;) {
      const int64_t b = t / blocks, first = t % blocks;
      const int64_t count = std::min({kGroupBlocks, t1 - t, blocks - first});
      forward_group(args, scratch, b, first, count);
      t += count;
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
  std::mutex* dq_locks;  // kDqLocks of them; a query block's rows of dQ take one
};

constexpr int64_t kDqLocks = 64;

template <typename T>
struct BackwardScratch {
  int64_t kb;  // the call's key block (backward_key_block), the row stride of p and dp
  // p and dp, then dS in dp's place; dk, dv and dq only where the outputs'
  // rows are not whole tiles (else the products accumulate in the outputs).
  std::vector<T> p, dp, dk, dv, dq, delta;
  T *dk_rows = nullptr, *dv_rows = nullptr;  // where the current key block accumulates
  std::vector<int64_t> len;
  // Kᵀ and Vᵀ of the task's key block in panels (each key block belongs to
  // one task, so nothing is packed twice).
  std::unique_ptr<T[]> kp, vtp;

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

// x · y over n elements.
template <typename T>
T dot(const T* x, const T* y, int64_t n) {
  using V = Vectorized<T>;
  V acc(T(0));
  int64_t c = 0;
  for (; c + V::size() <= n; c += V::size()) acc = at::vec::fmadd(V::loadu(x + c), V::loadu(y + c), acc);
  if (c < n) acc = at::vec::fmadd(V::loadu(x + c, n - c), V::loadu(y + c, n - c), acc);
  return horizontal_sum(acc);
}

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
      V::set(V(T(0)), g, valid - j).store(ds + j);
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
  std::mutex& lock = a.dq_locks[(b * div_up(s.n, kQueryBlock) + i0 / kQueryBlock) % kDqLocks];
  if (w.dq.empty()) {
    std::lock_guard<std::mutex> guard(lock);
    gemm<T>(rows, a.ldq / W, kc, w.dp.data(), w.kb, kpad, a.ldq, W, a.dq + row0 * s.d, s.d, true);
    return;
  }
  gemm<T>(rows, a.ldq / W, kc, w.dp.data(), w.kb, kpad, a.ldq, W, w.dq.data(), a.ldq, false);
  std::lock_guard<std::mutex> guard(lock);
  for (int64_t r = 0; r < rows; ++r) {
    T* dq = a.dq + (row0 + r) * s.d;
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
  // The zeros of the gradients, in parallel: dq (which the tasks add their
  // shares to) and the rows of dk and dv past each batch entry's longest
  // length (the tasks write the rows below it).
  at::parallel_for(0, s.B, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      std::fill_n(dqd + b * s.n * s.d, s.n * s.d, T(0));
      const int64_t from = b * s.m + batch_longest[b], to = (b + 1) * s.m;
      std::fill(dkd + from * s.d, dkd + to * s.d, T(0));
      std::fill(dvd + from * s.dv, dvd + to * s.dv, T(0));
    }
  });
  const Padded<T> qpad(qd, s.B * s.n, s.d), kpad(kd, s.B * s.m, s.d), dopad(dod, s.B * s.n, s.dv);
  std::array<std::mutex, kDqLocks> dq_locks;
  const BackwardArgs<T> args{s,         qd,        kd,         vd,      od,       dod,
                             lse.data_ptr<T>(),    qpad.data,  kpad.data, dopad.data,
                             qpad.ld,   dopad.ld,  row_lens,   T(scale), dqd,     dkd,
                             dvd,       dq_locks.data()};
  const int64_t longest =
      batch_longest.empty() ? 0 : *std::max_element(batch_longest.begin(), batch_longest.end());
  const int64_t kb = backward_key_block<T>(longest);
  // Tasks: the key blocks of each batch entry below its longest length, at a
  // cost of the rows and keys their query blocks visit.
  std::vector<int64_t> task_b, task_j0, costs;
  for (int64_t b = 0; b < s.B; ++b) {
    std::vector<int64_t> block_longest;
    for (int64_t i0 = 0; i0 < s.n; i0 += kQueryBlock) {
      block_longest.push_back(longest_length(args.lens, s, b, i0, std::min(kQueryBlock, s.n - i0)));
    }
    for (int64_t j0 = 0; j0 < batch_longest[b]; j0 += kb) {
      int64_t cost = 16;
      for (const int64_t block : block_longest) {
        cost += kQueryBlock * std::clamp<int64_t>(block - j0, 0, kb);
      }
      task_b.push_back(b);
      task_j0.push_back(j0);
      costs.push_back(cost);
    }
  }
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    BackwardScratch<T> scratch(s, qpad.ld, dopad.ld, kb);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = task_b[t], j0 = task_j0[t];
      backward_block(args, scratch, b, j0, std::min(kb, batch_longest[b] - j0));
    }
  });
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
