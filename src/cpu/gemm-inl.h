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
/// broadcast of A fill AVX2's 16 vector registers (gemm_tile). AVX-512 has 32:
/// 8 × 2 there, which divides the blocks' usual sizes (32, 48, 64, 128 rows;
/// 6 rows computed 36 for a key block of 32, an eighth for nothing) and loads
/// B once per 16 multiply-adds instead of 12.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kTileRows = 8;
#else
constexpr int64_t kTileRows = 6;
#endif

template <typename T>
constexpr int64_t round_up_to_tile(int64_t x) {
  return (x + kTileCols<T> - 1) / kTileCols<T> * kTileCols<T>;
}

// C[0:R, 0:tile] (= or +=) A[0:R, 0:K] · B[0:K, 0:tile], R = kTileRows, with
// the rows of A and C given as pointers (row r of A: a[r][k · step], step 1 unless A is
// read transposed): a block with fewer rows points the missing ones at a real
// row of A and at a scratch row of C. The accumulators are
// named variables, not an array: GCC keeps an array of Vectorized in
// registers with one LibTorch's headers and spills it to the stack on every
// iteration with another's (measured: 2× slower on 2.11). Not inlined: inside
// the flash kernel's loops GCC ran short of registers and reloaded the
// row pointers from the stack on every step (perf annotate; the forward took
// 1.5-1.8× as long); a call per tile costs nothing beside its K steps.
template <typename T, bool kTransA, bool kHalf = false>
C10_NOINLINE void gemm_tile(int64_t K, const T* const* a, int64_t a_step, const T* B,
                            int64_t ldb, T* const* c, bool accumulate) {
  // A compile-time 1 for the common case, so its loads stay a plain a[k].
  const int64_t step = kTransA ? a_step : 1;
  using V = at::vec::Vectorized<T>;
  constexpr int64_t S = V::size();
  constexpr bool kEight = kTileRows == 8;
  auto init = [&](int r, int half) {
    const bool used = (half == 0 || !kHalf) && (r < 6 || kEight);
    return accumulate && used ? V::loadu(c[r] + half * S) : V(T(0));
  };
  V c00 = init(0, 0), c01 = init(0, 1), c10 = init(1, 0), c11 = init(1, 1);
  V c20 = init(2, 0), c21 = init(2, 1), c30 = init(3, 0), c31 = init(3, 1);
  V c40 = init(4, 0), c41 = init(4, 1), c50 = init(5, 0), c51 = init(5, 1);
  V c60 = init(6, 0), c61 = init(6, 1), c70 = init(7, 0), c71 = init(7, 1);
  const T *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  const T *a6 = kEight ? a[kTileRows - 2] : a0, *a7 = kEight ? a[kTileRows - 1] : a0;
  // With kHalf, the tile's first vector of columns only; rows 6 and 7 only
  // with 8-row tiles. The unused accumulators are dropped by the compiler.
  auto step_row = [&](const V& x, const V& b0, const V& b1, V& lo, V& hi) {
    lo = at::vec::fmadd(x, b0, lo);
    if constexpr (!kHalf) hi = at::vec::fmadd(x, b1, hi);
  };
  for (int64_t k = 0; k < K; ++k) {
    const V b0 = V::loadu(B + k * ldb);
    const V b1 = kHalf ? b0 : V::loadu(B + k * ldb + S);
    const int64_t ak = k * step;
    step_row(V(a0[ak]), b0, b1, c00, c01);
    step_row(V(a1[ak]), b0, b1, c10, c11);
    step_row(V(a2[ak]), b0, b1, c20, c21);
    step_row(V(a3[ak]), b0, b1, c30, c31);
    step_row(V(a4[ak]), b0, b1, c40, c41);
    step_row(V(a5[ak]), b0, b1, c50, c51);
    if constexpr (kEight) {
      step_row(V(a6[ak]), b0, b1, c60, c61);
      step_row(V(a7[ak]), b0, b1, c70, c71);
    }
  }
  auto store_row = [&](int r, const V& lo, const V& hi) {
    lo.store(c[r]);
    if constexpr (!kHalf) hi.store(c[r] + S);
  };
  store_row(0, c00, c01);
  store_row(1, c10, c11);
  store_row(2, c20, c21);
  store_row(3, c30, c31);
  store_row(4, c40, c41);
  store_row(5, c50, c51);
  if constexpr (kEight) {
    store_row(kTileRows - 2, c60, c61);
    store_row(kTileRows - 1, c70, c71);
  }
}

/// C[0:rows, 0:tiles·kTileCols] (= or +=) A[0:rows, 0:K] · B (layout above;
/// with kTransA, A's element (i, k) is at A[k · lda + i]). Where the caller
/// needs only the first last_cols <= Vectorized<T>::size() columns of the
/// last tile, that tile is computed half wide and its other half of C is
/// left as it was: a block of 40 keys is 48 columns of work, not 64.
template <typename T, bool kTransA = false>
void gemm(int64_t rows, int64_t tiles, int64_t K, const T* A, int64_t lda, const T* B,
          int64_t ldb, int64_t b_tile_stride, T* C, int64_t ldc, bool accumulate,
          int64_t last_cols = kTileCols<T>) {
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
      if (t == tiles - 1 && last_cols <= at::vec::Vectorized<T>::size()) {
        gemm_tile<T, kTransA, true>(K, a, lda, B + t * b_tile_stride, ldb, c, accumulate);
      } else {
        gemm_tile<T, kTransA>(K, a, lda, B + t * b_tile_stride, ldb, c, accumulate);
      }
    }
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
