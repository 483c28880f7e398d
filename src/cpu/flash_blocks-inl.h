#pragma once

// Blocks, packing, the arguments of each pass and small vector helpers shared
// by the flash dot-product kernel's forward and backward
// (dot_product_attention_{forward,backward}_kernel.cpp, Note [Flash
// attention] in dot_product_attention_kernel.cpp); included inside each
// instruction set's CPU_CAPABILITY namespace.

#include <ATen/Parallel.h>
#include <ATen/core/TensorBase.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "cpu/gemm-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

constexpr int64_t kQueryBlock = 48;  // the backward's query rows: a multiple of kTileRows
// The largest key block: a multiple of every kTileCols (at most 32 floats
// with AVX-512).
constexpr int64_t kKeyBlock = 256;

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The key block of a call whose longest valid length is `longest`: a
// quarter of it, in whole tiles, from one tile up to kKeyBlock. A thread's
// scratch (a block of scores, or P and dP and the block's packed Kᵀ and Vᵀ)
// grows with the block, so short sequences get short blocks: at 128 keys
// and d = 64 one 128-key block held about 110 KiB a thread in the backward,
// 4 blocks of 32 keys hold 28 KiB (SDPA's own is about 30 KiB there; its
// BLAS packs in buffers it keeps for the process). From 1024 keys the block
// is kKeyBlock.
template <typename T>
int64_t key_block_size(int64_t longest, int64_t parts) {
  return std::clamp<int64_t>(round_up_to_tile<T>(div_up(longest, parts)), kTileCols<T>, kKeyBlock);
}

// n elements left uninitialized, for buffers that a parallel pass writes in
// full: std::vector would first zero them on the calling thread, a serial
// stretch (about 1 MB per buffer at the bench's mid shape) that kept the
// kernels from scaling with threads.
template <typename T>
std::unique_ptr<T[]> uninitialized_buffer(int64_t n) {
  return std::unique_ptr<T[]>(new T[n]);
}

struct Dims {
  int64_t B, n, m, d, dv;
};

// Tasks are costed in (row, key) pairs times this: the d + dv multiply-adds
// a pair costs, at about four to one of kGrain's units (a softmax entry's
// load, exponential and store). Counting pairs alone put the parallel
// threshold at 100 µs of work or more: the book's (64, 10, 10, d 32) ran on
// one thread (76 µs).
inline int64_t macs_to_grain(const Dims& s) { return std::max<int64_t>(1, (s.d + s.dv) / 4); }

Dims dims_of(const at::TensorBase& q, const at::TensorBase& v) {
  return {q.size(0), q.size(1), v.size(1), q.size(2), v.size(2)};
}

// x (rows × cols, row stride ldx, cols by default) transposed into panels of
// W = kTileCols rows of x each: panel p is a row-major (cols × W) block,
// zero past `rows`.
template <typename T>
void pack_transposed(const T* x, int64_t rows, int64_t cols, T* out, int64_t ldx = 0) {
  constexpr int64_t W = kTileCols<T>;
  if (ldx == 0) ldx = cols;
  for (int64_t p = 0; p < div_up(rows, W); ++p) {
    transpose_into(x + p * W * ldx, ldx, rows - p * W, W, cols, out + p * cols * W, W);
  }
}

// n values of x as T, into `out`.
template <typename T, typename In>
void widen(const In* x, int64_t n, T* out) {
  using V = Vectorized<T>;
  int64_t c = 0;
  for (; c + V::size() <= n; c += V::size()) load_widened(x + c).store(out + c);
  for (; c < n; ++c) out[c] = static_cast<T>(x[c]);
}

// Rows of x (`cols` wide, of type T or bfloat16) as T with their rows
// padded to `ld` = whole tiles: x itself where it already is, else a copy
// into `buffer`, each element written once (widened, then the padding's
// zeros).
template <typename T, typename In>
const T* padded_rows(const In* x, int64_t rows, int64_t cols, int64_t ld, std::vector<T>& buffer) {
  if constexpr (std::is_same_v<In, T>) {
    if (ld == cols) return x;
  }
  buffer.resize(rows * ld);
  for (int64_t r = 0; r < rows; ++r) {
    widen(x + r * cols, cols, buffer.data() + r * ld);
    std::fill(buffer.data() + r * ld + cols, buffer.data() + (r + 1) * ld, T(0));
  }
  return buffer.data();
}

// s[0:valid] = exp(s - shift) in the flash kernel's base (FlashExp: scores
// and shift already multiplied by scale · kLogBase) and s[valid:kc] = 0;
// returns the sum. Rows are whole tiles long (at least kc), so every load is
// a whole one.
template <typename T>
T exp_row(T* s, int64_t valid, int64_t kc, T shift) {
  using V = Vectorized<T>;
  const V vshift(shift);
  V vsum(T(0));
  int64_t j = 0;
  for (; j + V::size() <= valid; j += V::size()) {
    const V p = FlashExp<T>::exp(V::loadu(s + j) - vshift);
    p.store(s + j);
    vsum = vsum + p;
  }
  if (j < valid) {
    const V e = FlashExp<T>::exp(V::loadu(s + j) - vshift);
    const V p = set_first(V(T(0)), e, valid - j);
    p.store(s + j);
    vsum = vsum + p;
    j += V::size();
  }
  if (j < kc) std::fill(s + j, s + kc, T(0));
  return horizontal_sum(vsum);
}

// x[0:count] *= factor, in memory that may end at x + count.
template <typename T>
void scale_row(T* x, int64_t count, T factor) {
  using V = Vectorized<T>;
  const V vfactor(factor);
  int64_t j = 0;
  for (; j + V::size() <= count; j += V::size()) (V::loadu(x + j) * vfactor).store(x + j);
  if (j < count) partial_store(partial_load(x + j, count - j) * vfactor, x + j, count - j);
}

// The longest valid length among rows [i0, i0 + rows) of batch entry b.
int64_t longest_length(const RowLengths& lens, const Dims& s, int64_t b, int64_t i0, int64_t rows) {
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, lens.at(b * s.n + i0 + r, s.m));
  return longest;
}

// The keys rows [i0, i0 + rows) of batch entry b visit between them:
// [first, end), from the earliest first key of a row that sees any (Note
// [Bands of keys]) to the longest length; {0, 0} where no row sees a key.
struct KeySpan {
  int64_t first = 0, end = 0;
};

inline KeySpan key_span(const RowLengths& lens, const Dims& s, int64_t b, int64_t i0,
                        int64_t rows) {
  if (!lens.banded()) return {0, longest_length(lens, s, b, i0, rows)};
  KeySpan span{s.m, 0};
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = b * s.n + i0 + r, end = lens.at(row, s.m);
    if (end == 0) continue;
    span.first = std::min(span.first, lens.first(row));
    span.end = std::max(span.end, end);
  }
  return span.end == 0 ? KeySpan{} : span;
}

// With bands, the end of a block of rows' key block that starts at j0: at
// most kb keys, cut where the rows stop differing, at `latest` (the last of
// their first keys) and at `shortest` (the first of their ends), each made
// a multiple of `align` (key pairs: 2). Only the keys before latest and
// from shortest on are then masked (Note [Bands of keys]): a window of 512
// over blocks of 32 rows masks 62 of each block's 543 keys, not the
// 256-key blocks around them. Without bands, whole kb blocks from 0.
inline int64_t key_block_end(bool banded, int64_t j0, int64_t kb, int64_t latest, int64_t shortest,
                             int64_t longest, int64_t align) {
  int64_t end = std::min(j0 + kb, longest);
  if (!banded) return end;
  const int64_t head = (latest + align - 1) / align * align, body = shortest / align * align;
  if (j0 < head) return std::min(end, head);
  if (j0 < body) return std::min(end, body);
  return end;
}

// --------------------------------------------- the arguments of each pass

// In: the operands' type, T itself or bfloat16 (read in place by the rows,
// widened by the blocks); Out: the output's, In or, for a bfloat16 call
// under autograd, T (the backward's rowsum(dO ∘ O) then reads the output
// before its rounding, as where bfloat16 is widened whole).
template <typename T, typename In = T, typename Out = In>
struct ForwardArgs {
  Dims s;
  const In *q, *k, *v;
  RowLengths lens;
  T scale;
  Out* out;
  T* lse;
  T* weights;  // (B, n, m), or null when no weights are asked
  int64_t kb;  // the key block (key_block_size)
};

// In: the operands' type, T or bfloat16 (read in place or widened into the
// thread's padded rows); the forward's output, lse and dQ are T, dK and dV In
// (made in T, rounded once a key block is done).
template <typename T, typename In = T>
struct BackwardArgs {
  Dims s;
  const In *q, *k, *v;
  const T* out;
  const In* dout;
  const T* lse;
  int64_t ldq, ldv;  // whole tiles of d and dv: the blocks' padded rows of Q, K and dO
  RowLengths lens;
  T scale;
  T* dq;
  In *dk, *dv;  // in the operands' type; dQ in T (its sums span tasks)
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

  template <typename In>
  T* rows(const BackwardArgs<T, In>& a, int64_t b) const {
    return b == entry ? share : a.dq + b * a.s.n * a.s.d;
  }
};

// A's lock for a query block's rows of dQ, or none (deterministic sums).
template <typename T, typename In>
std::unique_lock<std::mutex> dq_lock(const BackwardArgs<T, In>& a, int64_t slot) {
  if (a.dq_locks == nullptr) return {};
  return std::unique_lock<std::mutex>(a.dq_locks[slot % kDqLocks]);
}

// ---------------------------------------------- row-by-row vector helpers

// x · y over n elements, y of type T or bfloat16 (load_widened).
template <typename T, typename In>
T dot(const T* x, const In* y, int64_t n) {
  using V = Vectorized<T>;
  V acc(T(0));
  int64_t c = 0;
  for (; c + V::size() <= n; c += V::size()) {
    acc = at::vec::fmadd(V::loadu(x + c), load_widened(y + c), acc);
  }
  if (c < n) acc = at::vec::fmadd(partial_load(x + c, n - c), load_widened(y + c, n - c), acc);
  return horizontal_sum(acc);
}

// y[0:n] = alpha · x[0:n], or += with kAccumulate; x of type T or bfloat16.
template <bool kAccumulate, typename T, typename In>
void axpy(T* y, const In* x, T alpha, int64_t n) {
  using V = Vectorized<T>;
  const V valpha(alpha);
  int64_t c = 0;
  for (; c + V::size() <= n; c += V::size()) {
    const V x_c = load_widened(x + c);
    (kAccumulate ? at::vec::fmadd(valpha, x_c, V::loadu(y + c)) : valpha * x_c).store(y + c);
  }
  if (c < n) {
    const V x_c = load_widened(x + c, n - c);
    partial_store(kAccumulate ? at::vec::fmadd(valpha, x_c, partial_load(y + c, n - c))
                              : valpha * x_c,
                  y + c, n - c);
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
