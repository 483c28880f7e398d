#pragma once

// Blocks, packing and work splitting shared by the flash dot-product kernel's
// forward and backward (dot_product_attention_kernel.cpp, Note [Flash
// attention]); included inside each instruction set's CPU_CAPABILITY
// namespace.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu/gemm-inl.h"
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

// x (rows × cols) transposed into panels of W = kTileCols rows of x each:
// panel p is a row-major (cols × W) block, zero past `rows`.
template <typename T>
void pack_transposed(const T* x, int64_t rows, int64_t cols, T* out) {
  constexpr int64_t W = kTileCols<T>;
  for (int64_t p = 0; p < div_up(rows, W); ++p) {
    T* panel = out + p * cols * W;
    for (int64_t w = 0; w < W; ++w) {
      const int64_t r = p * W + w;
      for (int64_t c = 0; c < cols; ++c) panel[c * W + w] = r < rows ? x[r * cols + c] : T(0);
    }
  }
}

// A (rows × cols) matrix with its rows padded to `ld` = whole tiles: x itself
// when cols already is, else a zero-padded copy.
template <typename T>
struct Padded {
  std::vector<T> storage;
  const T* data;
  int64_t ld;

  Padded(const T* x, int64_t rows, int64_t cols) : data(x), ld(round_up_to_tile<T>(cols)) {
    if (ld == cols) return;
    storage.assign(rows * ld, T(0));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(&storage[r * ld], x + r * cols, cols * sizeof(T));
    data = storage.data();
  }
};

// s[0:valid] = exp(scale·s - shift) and s[valid:kc] = 0; returns the sum.
// Rows are whole tiles long (at least kc), so every load is a whole one.
template <typename T>
T exp_row(T* s, int64_t valid, int64_t kc, T scale, T shift) {
  using V = Vectorized<T>;
  const V vscale(scale), vshift(-shift);
  V vsum(T(0));
  int64_t j = 0;
  for (; j + V::size() <= valid; j += V::size()) {
    const V p = softmax_exp(at::vec::fmadd(V::loadu(s + j), vscale, vshift));
    p.store(s + j);
    vsum = vsum + p;
  }
  if (j < valid) {
    const V e = softmax_exp(at::vec::fmadd(V::loadu(s + j), vscale, vshift));
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

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
