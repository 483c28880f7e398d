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
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

/// Two bfloat16 values adjacent along a product's reduction dimension, the
/// first in the low half: one 32-bit lane of VDPBF16PS.
using Pair = uint32_t;

/// Columns of one register tile: two vectors of 16 lanes.
constexpr int64_t kPairTile = 32;

/// Rows of one register tile: 6 × 2 accumulators, as gemm_tile's.
constexpr int64_t kPairTileRows = 6;

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

/// The key block of a pass whose longest valid length is `longest`: a
/// `parts`-th of it in whole tiles, from one tile up to kMaxKeyBlock (even,
/// so that pairs of keys never straddle two blocks).
constexpr int64_t kMaxKeyBlock = 128;
inline int64_t bf16_key_block(int64_t longest, int64_t parts) {
  return std::clamp<int64_t>(round_up_to_pair_tile((longest + parts - 1) / parts), kPairTile,
                             kMaxKeyBlock);
}

// C[0:6, 0:32] (= or +=) A[0:6, 0:K] · B[0:K, 0:32] in pairs: row r of A is
// a[r][k · step] (step 1 unless A is read transposed), row k of B is 32
// pairs at B + k · ldb. Named accumulators and not inlined, as gemm_tile.
template <bool kTransA>
C10_NOINLINE void gemm_bf16_tile(int64_t K, const Pair* const* a, int64_t a_step, const Pair* B,
                                 int64_t ldb, float* const* c, bool accumulate) {
  const int64_t step = kTransA ? a_step : 1;
  auto init = [&](int r, int half) {
    return accumulate ? _mm512_loadu_ps(c[r] + half * 16) : _mm512_setzero_ps();
  };
  __m512 c00 = init(0, 0), c01 = init(0, 1), c10 = init(1, 0), c11 = init(1, 1);
  __m512 c20 = init(2, 0), c21 = init(2, 1), c30 = init(3, 0), c31 = init(3, 1);
  __m512 c40 = init(4, 0), c41 = init(4, 1), c50 = init(5, 0), c51 = init(5, 1);
  const Pair *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
  for (int64_t k = 0; k < K; ++k) {
    const auto b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(B + k * ldb));
    const auto b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(B + k * ldb + 16));
    const int64_t ak = k * step;
    auto x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a0 + ak))));
    c00 = _mm512_dpbf16_ps(c00, x, b0);
    c01 = _mm512_dpbf16_ps(c01, x, b1);
    x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a1 + ak))));
    c10 = _mm512_dpbf16_ps(c10, x, b0);
    c11 = _mm512_dpbf16_ps(c11, x, b1);
    x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a2 + ak))));
    c20 = _mm512_dpbf16_ps(c20, x, b0);
    c21 = _mm512_dpbf16_ps(c21, x, b1);
    x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a3 + ak))));
    c30 = _mm512_dpbf16_ps(c30, x, b0);
    c31 = _mm512_dpbf16_ps(c31, x, b1);
    x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a4 + ak))));
    c40 = _mm512_dpbf16_ps(c40, x, b0);
    c41 = _mm512_dpbf16_ps(c41, x, b1);
    x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(load_pair(a5 + ak))));
    c50 = _mm512_dpbf16_ps(c50, x, b0);
    c51 = _mm512_dpbf16_ps(c51, x, b1);
  }
  _mm512_storeu_ps(c[0], c00);
  _mm512_storeu_ps(c[0] + 16, c01);
  _mm512_storeu_ps(c[1], c10);
  _mm512_storeu_ps(c[1] + 16, c11);
  _mm512_storeu_ps(c[2], c20);
  _mm512_storeu_ps(c[2] + 16, c21);
  _mm512_storeu_ps(c[3], c30);
  _mm512_storeu_ps(c[3] + 16, c31);
  _mm512_storeu_ps(c[4], c40);
  _mm512_storeu_ps(c[4] + 16, c41);
  _mm512_storeu_ps(c[5], c50);
  _mm512_storeu_ps(c[5] + 16, c51);
}

/// C[0:rows, 0:tiles·32] (= or +=) A[0:rows, 0:K] · B in pairs, laid out as
/// gemm's (gemm-inl.h) with pairs for elements: A row-major (row stride lda
/// pairs), or with kTransA its element (i, k) at A[k · lda + i]; tile t of B
/// at B + t · b_tile_stride, its rows ldb pairs apart; C's rows hold whole
/// tiles.
template <bool kTransA = false>
void gemm_bf16(int64_t rows, int64_t tiles, int64_t K, const Pair* A, int64_t lda, const Pair* B,
               int64_t ldb, int64_t b_tile_stride, float* C, int64_t ldc, bool accumulate) {
  constexpr int64_t R = kPairTileRows, W = kPairTile;
  const int64_t row_stride = kTransA ? 1 : lda;
  alignas(64) float spare[R][W];
  const Pair* a[R];
  float* c[R];
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
      for (int64_t r = 0; r < R; ++r) {
        const bool real = r0 + r < rows;
        a[r] = A + (real ? r0 + r : r0) * row_stride;
        c[r] = real ? C + (r0 + r) * ldc + t * W : spare[r];
        if (!real && accumulate) std::fill(spare[r], spare[r] + W, 0.0f);
      }
      gemm_bf16_tile<kTransA>(K, a, lda, B + t * b_tile_stride, ldb, c, accumulate);
    }
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
