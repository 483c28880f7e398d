#pragma once

// Small in-cache matrix products for the flash dot-product kernel
// (dot_product_attention_kernel.cpp), included inside each instruction set's
// CPU_CAPABILITY namespace. The kernel multiplies blocks of a few dozen rows
// thousands of times per call: a BLAS call per block would cost more in
// overhead and thread-pool traffic than the block's arithmetic (OpenBLAS
// spawns its own threads from inside ours), so the products are written here
// with Vectorized<T> register tiles.
//
// Layout: A is row-major (rows × K, row stride lda), or with kTransA its
// transpose is (K × rows, row stride lda): the backward multiplies by Pᵀ and
// dSᵀ straight from P and dS, with no transposed copy. B is a sequence of
// column tiles, each kTileCols<T> columns wide and row-major (K × tile, row
// stride ldb); tile t starts at B + t * b_tile_stride. That covers both a
// row-major matrix whose width is a multiple of the tile (b_tile_stride =
// tile width, ldb = width) and packed panels (ldb = tile width,
// b_tile_stride = K * tile width), which keep a transposed operand's rows
// contiguous. C's rows hold whole tiles: callers pad their buffers.

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

/// Columns of one register tile: two vectors.
template <typename T>
constexpr int64_t kTileCols = 2 * at::vec::Vectorized<T>::size();

/// Rows of one register tile: 6 × 2 accumulators, 2 loads of B and a
/// broadcast of A fill AVX2's 16 vector registers (gemm_tile).
constexpr int64_t kTileRows = 6;

template <typename T>
constexpr int64_t round_up_to_tile(int64_t x) {
  return (x + kTileCols<T> - 1) / kTileCols<T> * kTileCols<T>;
}

// C[0:6, 0:tile] (= or +=) A[0:6, 0:K] · B[0:K, 0:tile], with the six rows of
// A and C given as pointers (row r of A: a[r][k · step], step 1 unless A is
// read transposed): a block with fewer rows points the missing ones at a real
// row of A and at a scratch row of C. The twelve accumulators are
// named variables, not an array: GCC keeps an array of Vectorized in
// registers with one LibTorch's headers and spills it to the stack on every
// iteration with another's (measured: 2× slower on 2.11). Not inlined: inside
// the flash kernel's loops GCC ran short of registers and reloaded the six
// row pointers from the stack on every step (perf annotate; the forward took
// 1.5-1.8× as long); a call per tile costs nothing beside its K steps.
template <typename T, bool kTransA>
C10_NOINLINE void gemm_tile(int64_t K, const T* const* a, int64_t a_step, const T* B,
                            int64_t ldb, T* const* c, bool accumulate) {
  // A compile-time 1 for the common case, so its loads stay a plain a[k].
  const int64_t step = kTransA ? a_step : 1;
  using V = at::vec::Vectorized<T>;
  constexpr int64_t S = V::size();
  auto init = [&](int r, int half) {
    return accumulate ? V::loadu(c[r] + half * S) : V(T(0));
  };
  V c00 = init(0, 0), c01 = init(0, 1), c10 = init(1, 0), c11 = init(1, 1);
  V c20 = init(2, 0), c21 = init(2, 1), c30 = init(3, 0), c31 = init(3, 1);
  V c40 = init(4, 0), c41 = init(4, 1), c50 = init(5, 0), c51 = init(5, 1);
  const T *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  for (int64_t k = 0; k < K; ++k) {
    const V b0 = V::loadu(B + k * ldb);
    const V b1 = V::loadu(B + k * ldb + S);
    const int64_t ak = k * step;
    V x(a0[ak]);
    c00 = at::vec::fmadd(x, b0, c00);
    c01 = at::vec::fmadd(x, b1, c01);
    x = V(a1[ak]);
    c10 = at::vec::fmadd(x, b0, c10);
    c11 = at::vec::fmadd(x, b1, c11);
    x = V(a2[ak]);
    c20 = at::vec::fmadd(x, b0, c20);
    c21 = at::vec::fmadd(x, b1, c21);
    x = V(a3[ak]);
    c30 = at::vec::fmadd(x, b0, c30);
    c31 = at::vec::fmadd(x, b1, c31);
    x = V(a4[ak]);
    c40 = at::vec::fmadd(x, b0, c40);
    c41 = at::vec::fmadd(x, b1, c41);
    x = V(a5[ak]);
    c50 = at::vec::fmadd(x, b0, c50);
    c51 = at::vec::fmadd(x, b1, c51);
  }
  c00.store(c[0]);
  c01.store(c[0] + S);
  c10.store(c[1]);
  c11.store(c[1] + S);
  c20.store(c[2]);
  c21.store(c[2] + S);
  c30.store(c[3]);
  c31.store(c[3] + S);
  c40.store(c[4]);
  c41.store(c[4] + S);
  c50.store(c[5]);
  c51.store(c[5] + S);
}

/// C[0:rows, 0:tiles·kTileCols] (= or +=) A[0:rows, 0:K] · B (layout above;
/// with kTransA, A's element (i, k) is at A[k · lda + i]).
template <typename T, bool kTransA = false>
void gemm(int64_t rows, int64_t tiles, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, int64_t b_tile_stride, T* C, int64_t ldc, bool accumulate) {
  constexpr int64_t W = kTileCols<T>;
  const int64_t row_stride = kTransA ? 1 : lda;
  // Where the missing rows of a last, partial block of rows write.
  alignas(64) T spare[kTileRows][W];
  const T* a[kTileRows];
  T* c[kTileRows];
  // Column tiles outer: one tile of B stays in L1 for every block of rows.
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      for (int64_t r = 0; r < kTileRows; ++r) {
        const bool real = r0 + r < rows;
        a[r] = A + (real ? r0 + r : r0) * row_stride;
        c[r] = real ? C + (r0 + r) * ldc + t * W : spare[r];
        if (!real && accumulate) std::fill(spare[r], spare[r] + W, T(0));
      }
      gemm_tile<T, kTransA>(K, a, lda, B + t * b_tile_stride, ldb, c, accumulate);
    }
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
