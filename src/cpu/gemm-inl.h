#pragma once

// Small in-cache matrix products for the flash dot-product kernel
// (dot_product_attention_kernel.cpp), included inside each instruction set's
// CPU_CAPABILITY namespace. The kernel multiplies blocks of a few dozen rows
// thousands of times per call: a BLAS call per block would cost more in
// overhead and thread-pool traffic than the block's arithmetic (OpenBLAS
// spawns its own threads from inside ours), so the products are written here
// with Vectorized<T> register tiles.
//
// Layout: A is row-major (rows × K, row stride lda). B is a sequence of
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
/// broadcast of A fill AVX2's 16 vector registers.
constexpr int64_t kTileRows = 6;

template <typename T>
constexpr int64_t round_up_to_tile(int64_t x) {
  return (x + kTileCols<T> - 1) / kTileCols<T> * kTileCols<T>;
}

// C[0:R, 0:tile] (= or +=) A[0:R, 0:K] · B[0:K, 0:tile].
template <typename T, int R>
inline void gemm_tile(int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                      int64_t ldc, bool accumulate) {
  using V = at::vec::Vectorized<T>;
  V c0[R], c1[R];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    c0[r] = accumulate ? V::loadu(C + r * ldc) : V(T(0));
    c1[r] = accumulate ? V::loadu(C + r * ldc + V::size()) : V(T(0));
  }
  for (int64_t k = 0; k < K; ++k) {
    const V b0 = V::loadu(B + k * ldb);
    const V b1 = V::loadu(B + k * ldb + V::size());
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const V a(A[r * lda + k]);
      c0[r] = at::vec::fmadd(a, b0, c0[r]);
      c1[r] = at::vec::fmadd(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    c0[r].store(C + r * ldc);
    c1[r].store(C + r * ldc + V::size());
  }
}

/// C[0:rows, 0:tiles·kTileCols] (= or +=) A[0:rows, 0:K] · B (layout above).
template <typename T>
void gemm(int64_t rows, int64_t tiles, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
          int64_t b_tile_stride, T* C, int64_t ldc, bool accumulate) {
  constexpr int64_t W = kTileCols<T>;
  for (int64_t t = 0; t < tiles; ++t) {
    const T* Bt = B + t * b_tile_stride;
    T* Ct = C + t * W;
    int64_t r = 0;
    for (; r + kTileRows <= rows; r += kTileRows) {
      gemm_tile<T, kTileRows>(K, A + r * lda, lda, Bt, ldb, Ct + r * ldc, ldc, accumulate);
    }
    const T* Ar = A + r * lda;
    T* Cr = Ct + r * ldc;
    switch (rows - r) {
      case 5: gemm_tile<T, 5>(K, Ar, lda, Bt, ldb, Cr, ldc, accumulate); break;
      case 4: gemm_tile<T, 4>(K, Ar, lda, Bt, ldb, Cr, ldc, accumulate); break;
      case 3: gemm_tile<T, 3>(K, Ar, lda, Bt, ldb, Cr, ldc, accumulate); break;
      case 2: gemm_tile<T, 2>(K, Ar, lda, Bt, ldb, Cr, ldc, accumulate); break;
      case 1: gemm_tile<T, 1>(K, Ar, lda, Bt, ldb, Cr, ldc, accumulate); break;
      default: break;
    }
  }
}

/// dst (cols × rows, row stride ldd) = srcᵀ for src (rows × cols, row stride lds).
template <typename T>
void transpose(int64_t rows, int64_t cols, const T* src, int64_t lds, T* dst, int64_t ldd) {
  constexpr int64_t kBlock = 8;
  for (int64_t i0 = 0; i0 < rows; i0 += kBlock) {
    const int64_t i1 = std::min(rows, i0 + kBlock);
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = i0; i < i1; ++i) dst[j * ldd + i] = src[i * lds + j];
    }
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
