#pragma once

// What the bfloat16 flash kernel's passes share
// (dot_product_attention_bf16_{forward,backward}_kernel.cpp, Note [bfloat16
// flash attention] in dot_product_attention_bf16_kernel.cpp), included inside
// their CPU_CAPABILITY namespace (AVX512_BF16): the key block, the packing of
// operands into pairs, and register tiles of VDPBF16PS, as gemm-inl.h's are
// of FMAs. VDPBF16PS adds to each float lane the
// products of one pair of bfloat16 values from each operand, so both
// operands of a product hold pairs of elements that are adjacent along its
// reduction dimension, one pair per 32-bit lane (a Pair): A's pairs are
// broadcast, B's come as rows of kPairTile pairs (one per column), and C is
// float.

#if !defined(CPU_CAPABILITY_AVX512_BF16)
#error "flash_bf16-inl.h needs AVX512-BF16 (compiled only in the AVX512_BF16 kernel files)"
#endif

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

/// Two bfloat16 values adjacent along a product's reduction dimension, the
/// first in the low half: one 32-bit lane of VDPBF16PS.
using Pair = uint32_t;

/// Columns of one register tile: two vectors of 16 lanes.
constexpr int64_t kPairTile = 32;
/// The kernels' block of queries (forward) or keys (backward): one tile of
/// columns.
constexpr int64_t W = kPairTile;

/// Rows of one register tile: 8 × 2 accumulators. VDPBF16PS takes 6 cycles
/// on Zen 5 and issues two a cycle, so 12 chains (gemm_tile's 6 × 2) reached
/// 0.92 of its peak in a register-only loop and 16 reach it; 8 rows also
/// divide the blocks (key blocks of 32 to 128, 48 queries, 64 features)
/// with no spare rows.
constexpr int64_t kPairTileRows = 8;

constexpr int64_t round_up_to_pair_tile(int64_t x) {
  return (x + kPairTile - 1) / kPairTile * kPairTile;
}

constexpr int64_t pairs_of(int64_t x) { return (x + 1) / 2; }

/// The pair at p, which may point into a bfloat16 tensor (memcpy: no
/// aliasing of its storage through another type).
inline Pair load_pair(const void* p) {
  Pair x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

inline Pair make_pair(c10::BFloat16 first, c10::BFloat16 second) {
  return static_cast<Pair>(first.x) | static_cast<Pair>(second.x) << 16;
}

/// 16 pairs (a[i], b[i]) of two float vectors rounded to bfloat16 (to the
/// nearest even, as the conversion of c10::BFloat16; denormals to zero).
inline __m512i interleave_bf16(__m512 a, __m512 b) {
  // cvtne2ps gives b's 16 values then a's in its 32 halves; the permutation
  // takes them alternately.
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
  const __m512i order =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, both);
}

/// 32 consecutive floats (lo: the first 16) rounded to bfloat16, in order:
/// 16 pairs of neighbours.
inline __m512i consecutive_bf16(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

/// factor · x[0:n] rounded to bfloat16 into out[0:n].
inline void round_to_bf16(const float* x, int64_t n, c10::BFloat16* out, float factor = 1.0f) {
  for (int64_t j = 0; j < n; j += 16) {
    const auto lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - j)) - 1);
    __m512 x_j = _mm512_maskz_loadu_ps(lanes, x + j);
    if (factor != 1.0f) x_j = _mm512_mul_ps(x_j, _mm512_set1_ps(factor));
    const __m256bh y = _mm512_cvtneps_pbh(x_j);
    _mm256_mask_storeu_epi16(out + j, lanes, reinterpret_cast<__m256i>(y));
  }
}

/// The bfloat16 values in `lanes` of p[0:16] widened to float, zeros elsewhere.
inline __m512 widen16(const c10::BFloat16* p, __mmask16 lanes) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, p)), 16));
}

/// x[0:n] widened to float into out[0:n].
inline void widen_bf16(const c10::BFloat16* x, int64_t n, float* out) {
  for (int64_t j = 0; j < n; j += 16) {
    const auto lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - j)) - 1);
    _mm512_mask_storeu_ps(out + j, lanes, widen16(x + j, lanes));
  }
}

/// x · y over n bfloat16 elements, in float.
inline float dot_bf16(const c10::BFloat16* x, const c10::BFloat16* y, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const auto lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - j)) - 1);
    acc = _mm512_fmadd_ps(widen16(x + j, lanes), widen16(y + j, lanes), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

/// The first r <= 16 pairs of (x[0:r], y[0:r]) of two bfloat16 rows: y null
/// gives pairs (x, 0), so that a missing row never reads memory past a
/// tensor or padding it may hold (inf, NaN).
inline __m512i pair_rows16(const c10::BFloat16* x, const c10::BFloat16* y, int64_t r) {
  const __mmask16 lanes = static_cast<__mmask16>((1u << r) - 1);
  const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, x));
  if (y == nullptr) return lo;
  const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, y));
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

/// out[0:cols] = pairs (x[c], y[c]) of two bfloat16 rows (y may be null:
/// zeros), then zeros up to `room`.
inline void pair_rows(const c10::BFloat16* x, const c10::BFloat16* y, int64_t cols, Pair* out,
                      int64_t room) {
  for (int64_t c = 0; c < cols; c += 16) {
    const int64_t r = std::min<int64_t>(16, cols - c);
    _mm512_mask_storeu_epi32(out + c, static_cast<__mmask16>((1u << r) - 1),
                             pair_rows16(x + c, y == nullptr ? nullptr : y + c, r));
  }
  std::fill(out + cols, out + room, Pair{0});
}

/// e^x for the probabilities, which are rounded to bfloat16 (8 bits) before
/// their products: softmax_exp's reduction (softmax_row-inl.h) with one ln 2
/// constant and Taylor to degree 4, whose relative error, under 5e-5, is a
/// hundredth of that rounding: 10 instructions where softmax_exp takes 15.
/// The forward's sums and lse and the backward's P use the same values, so
/// the two passes agree. x <= 0 here (scores less their maximum or lse);
/// below -87.3, and at -inf, it is 0; NaN stays NaN.
inline __m512 exp_bf16(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(kExpLowest);
  // max_ps returns its second operand when either is NaN: NaN goes through.
  const __m512 c = _mm512_max_ps(lowest, x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147180559945f), c);
  __m512 p = _mm512_set1_ps(1.0f / 24);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // Zero below the range; the compare is true for NaN, which stays.
  return _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ), p, n);
}

/// A bfloat16 (rows × cols) matrix in pairs of features: x itself where cols
/// is even, else a copy with a zero after each row.
struct FeaturePairs {
  std::unique_ptr<Pair[]> storage;
  const Pair* data;

  FeaturePairs(const c10::BFloat16* x, int64_t rows, int64_t cols)
      : storage(cols % 2 == 1 ? std::unique_ptr<Pair[]>(new Pair[rows * pairs_of(cols)]) : nullptr),
        data(storage ? storage.get() : reinterpret_cast<const Pair*>(x)) {}

  /// Rows [r0, r1) of the copy, where there is one.
  void fill(const c10::BFloat16* x, int64_t r0, int64_t r1, int64_t cols) {
    if (!storage) return;
    const int64_t pairs = pairs_of(cols);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < pairs; ++c) {
        storage[r * pairs + c] =
            make_pair(x[r * cols + 2 * c], 2 * c + 1 < cols ? x[r * cols + 2 * c + 1] : c10::BFloat16(0.0f));
      }
    }
  }
};

/// Rows [0, rows) of a bfloat16 matrix x (row stride `cols`) in pairs of
/// features, transposed into panels of kPairTile rows: row j's pair c at
/// out[(j / 32) · pairs · 32 + c · 32 + j % 32], with a zero after an odd
/// last feature, and zeros for rows [rows, room).
inline void transpose_pairs(const c10::BFloat16* x, int64_t rows, int64_t cols, int64_t room,
                            Pair* out) {
  const int64_t pairs = pairs_of(cols), whole = cols / 2;
  for (int64_t j = 0; j < room; ++j) {
    Pair* column = out + j / kPairTile * pairs * kPairTile + j % kPairTile;
    if (j >= rows) {
      for (int64_t c = 0; c < pairs; ++c) column[c * kPairTile] = 0;
      continue;
    }
    const c10::BFloat16* row = x + j * cols;
    for (int64_t c = 0; c < whole; ++c) column[c * kPairTile] = load_pair(row + 2 * c);
    if (whole < pairs) column[whole * kPairTile] = make_pair(row[cols - 1], c10::BFloat16(0.0f));
  }
}

/// out[c · ldo + r] = x[r · ldx + c] for rows r < rows and columns c < cols
/// of pairs: transpose_into's squares of floats (vec_helpers-inl.h), which
/// only move 32-bit lanes, so every pair's bits are kept.
inline void transpose_pair_matrix(const Pair* x, int64_t ldx, int64_t rows, int64_t cols,
                                  Pair* out, int64_t ldo) {
  transpose_into(reinterpret_cast<const float*>(x), ldx, rows, rows, cols,
                 reinterpret_cast<float*>(out), ldo);
}

/// The valid lengths of rows [i0, i0 + rows) of batch entry b (blocks never
/// straddle two entries) into len[0:rows], and their maximum: with one
/// length per entry, one look-up rather than a division per row. With bands
/// (Note [Bands of keys]) each row's first key goes into first[0:rows] too.
inline int64_t block_lengths(const RowLengths& lens, int64_t n, int64_t m, int64_t b, int64_t i0,
                             int64_t rows, int64_t* len, int64_t* first) {
  if (lens.banded()) {
    int64_t longest = 0;
    for (int64_t r = 0; r < rows; ++r) {
      len[r] = lens.at(b * n + i0 + r, m);
      first[r] = lens.first(b * n + i0 + r);
      longest = std::max(longest, len[r]);
    }
    return longest;
  }
  if (lens.data == nullptr || lens.rows_per_len > 1) {
    std::fill_n(len, rows, lens.at(b * n + i0, m));
    return rows > 0 ? len[0] : 0;
  }
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) {
    len[r] = std::min(lens.data[b * n + i0 + r], m);
    longest = std::max(longest, len[r]);
  }
  return longest;
}

/// The key block of a pass whose longest valid length is `longest`: a
/// `parts`-th of it in whole tiles, from one tile up to kMaxKeyBlock (even,
/// so that pairs of keys never straddle two blocks).
constexpr int64_t kMaxKeyBlock = 128;
inline int64_t bf16_key_block(int64_t longest, int64_t parts) {
  return std::clamp<int64_t>(round_up_to_pair_tile((longest + parts - 1) / parts), kPairTile,
                             kMaxKeyBlock);
}

// C[0:8, 0:32] (= or +=) A[0:8, 0:K] · B[0:K, 0:32] in pairs: row r of A is
// a[r][0:K], row k of B is 32 pairs at B + k · ldb. Named accumulators and
// not inlined, as gemm_tile.
C10_NOINLINE void gemm_bf16_tile(int64_t K, const Pair* const* a, const Pair* B, int64_t ldb,
                                 float* const* c, bool accumulate) {
  auto init = [&](int r, int half) {
    return accumulate ? _mm512_loadu_ps(c[r] + half * 16) : _mm512_setzero_ps();
  };
#define D2L_TILE_ROW(r) __m512 c##r##0 = init(r, 0), c##r##1 = init(r, 1);
  D2L_TILE_ROW(0) D2L_TILE_ROW(1) D2L_TILE_ROW(2) D2L_TILE_ROW(3)
  D2L_TILE_ROW(4) D2L_TILE_ROW(5) D2L_TILE_ROW(6) D2L_TILE_ROW(7)
#undef D2L_TILE_ROW
  const Pair *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5], *a6 = a[6],
             *a7 = a[7];
  for (int64_t k = 0; k < K; ++k) {
    const auto b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(B + k * ldb));
    const auto b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(B + k * ldb + 16));
#define D2L_TILE_ROW(r)                                                                       \
  {                                                                                           \
    const auto x =                                                                            \
        reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a##r + k)))); \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, x, b0);                                                \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, x, b1);                                                \
  }
    D2L_TILE_ROW(0) D2L_TILE_ROW(1) D2L_TILE_ROW(2) D2L_TILE_ROW(3)
    D2L_TILE_ROW(4) D2L_TILE_ROW(5) D2L_TILE_ROW(6) D2L_TILE_ROW(7)
#undef D2L_TILE_ROW
  }
#define D2L_TILE_ROW(r)                  \
  _mm512_storeu_ps(c[r], c##r##0);       \
  _mm512_storeu_ps(c[r] + 16, c##r##1);
  D2L_TILE_ROW(0) D2L_TILE_ROW(1) D2L_TILE_ROW(2) D2L_TILE_ROW(3)
  D2L_TILE_ROW(4) D2L_TILE_ROW(5) D2L_TILE_ROW(6) D2L_TILE_ROW(7)
#undef D2L_TILE_ROW
}

/// gemm_bf16 in register tiles of VDPBF16PS.
inline void gemm_bf16_registers(int64_t rows, int64_t tiles, int64_t K, const Pair* A,
                                int64_t lda, const Pair* B, int64_t ldb, int64_t b_tile_stride,
                                float* C, int64_t ldc, bool accumulate) {
  constexpr int64_t R = kPairTileRows, W = kPairTile;
  alignas(64) float spare[R][W];
  const Pair* a[R];
  float* c[R];
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
      for (int64_t r = 0; r < R; ++r) {
        const bool real = r0 + r < rows;
        a[r] = A + (real ? r0 + r : r0) * lda;
        c[r] = real ? C + (r0 + r) * ldc + t * W : spare[r];
        if (!real && accumulate) std::fill(spare[r], spare[r] + W, 0.0f);
      }
      gemm_bf16_tile(K, a, B + t * b_tile_stride, ldb, c, accumulate);
    }
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu

#if defined(CPU_CAPABILITY_AMX_BF16)
#include "cpu/amx_tiles-inl.h"
#endif

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

#if !defined(CPU_CAPABILITY_AMX_BF16)
/// Nothing to configure without tiles.
struct TileScope {
  TileScope() {}
};
#endif

/// C[0:rows, 0:tiles·32] (= or +=) A[0:rows, 0:K] · B in pairs, laid out as
/// gemm's (gemm-inl.h) with pairs for elements: A row-major (row stride lda
/// pairs); tile t of B at B + t · b_tile_stride, its rows ldb pairs apart;
/// C's rows hold whole tiles. With AMX, inside a TileScope: whole tiles on
/// the tiles (Note [AMX tiles]), the rest in registers.
inline void gemm_bf16(int64_t rows, int64_t tiles, int64_t K, const Pair* A, int64_t lda,
                      const Pair* B, int64_t ldb, int64_t b_tile_stride, float* C, int64_t ldc,
                      bool accumulate) {
#if defined(CPU_CAPABILITY_AMX_BF16)
  const int64_t rows16 = rows / 16 * 16, k16 = K / 16 * 16;
  if (rows16 > 0 && k16 > 0) {
    memory_barrier();
    for (int64_t t = 0; t < tiles; ++t) {
      const Pair* b = B + t * b_tile_stride;
      float* c = C + t * kPairTile;
      int64_t r0 = 0;
      for (; r0 + 32 <= rows16; r0 += 32) {
        amx_tile_block<2>(k16, A + r0 * lda, lda, b, ldb, c + r0 * ldc, ldc, accumulate);
      }
      if (r0 < rows16) amx_tile_block<1>(k16, A + r0 * lda, lda, b, ldb, c + r0 * ldc, ldc, accumulate);
    }
    memory_barrier();
    if (k16 < K) {
      gemm_bf16_registers(rows16, tiles, K - k16, A + k16, lda, B + k16 * ldb, ldb, b_tile_stride,
                          C, ldc, true);
    }
    if (rows16 < rows) {
      gemm_bf16_registers(rows - rows16, tiles, K, A + rows16 * lda, lda, B, ldb, b_tile_stride,
                          C + rows16 * ldc, ldc, accumulate);
    }
    return;
  }
#endif
  gemm_bf16_registers(rows, tiles, K, A, lda, B, ldb, b_tile_stride, C, ldc, accumulate);
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
