#pragma once

// Vector helpers shared by the per-instruction-set kernel files (included
// inside each one's CPU_CAPABILITY namespace): row lengths, partial vector
// loads and stores, and horizontal reductions. One row of the masked softmax
// is in softmax_row-inl.h, the split of work over threads in
// parallel_runs-inl.h.

#include <ATen/core/TensorBase.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

/// The keys row `row` of a (rows, m) problem attends to: [first(row), at(row, m)).
/// Lengths (period 0): [0, min(data[row / rows_per_len], m)), all m without
/// data. Bands (Note [Bands of keys]): pair p = row % period, [data[2p],
/// min(data[2p + 1], m)), never empty but as [0, 0) (checked upstream).
struct RowLengths {
  const int64_t* data = nullptr;
  int64_t rows_per_len = 1;
  int64_t period = 0;

  int64_t at(int64_t row, int64_t m) const {
    if (data == nullptr) return m;
    if (period == 0) return std::min(data[row / rows_per_len], m);
    return std::min(data[2 * (row % period) + 1], m);
  }
  int64_t first(int64_t row) const { return period == 0 ? 0 : data[2 * (row % period)]; }
  bool banded() const { return period != 0; }
};

/// Per-row view of int64 lengths for rows of `queries` queries each: empty,
/// (B), (B, n), or bands (X, P, 2): row b · n + i takes pair (b · n + i) %
/// (X · P), so (1, P, 2) is shared by entries whose rows repeat every P.
inline RowLengths row_lengths(const at::TensorBase& lens, int64_t queries) {
  if (lens.numel() == 0) return {};
  if (lens.dim() == 3) return {lens.data_ptr<int64_t>(), 1, lens.size(0) * lens.size(1)};
  return {lens.data_ptr<int64_t>(), lens.dim() == 1 ? queries : 1, 0};
}

// The first r <= size() lanes of a vector at p, zero past them, and their
// store. ATen's loadu(p, r) and store(p, r) copy through a stack buffer with
// memcpy; a row of the book's shapes (10 keys) is nothing but such a tail,
// so on AVX2 and AVX-512 these are masked loads and stores, which read and
// write only the first r lanes (no fault past them).
template <typename T>
Vectorized<T> partial_load(const T* p, int64_t r) {
  return Vectorized<T>::loadu(p, r);
}

template <typename T>
void partial_store(const Vectorized<T>& v, T* p, int64_t r) {
  v.store(p, r);
}

#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
inline __mmask16 lanes16(int64_t r) { return static_cast<__mmask16>((1u << r) - 1); }
inline __mmask8 lanes8(int64_t r) { return static_cast<__mmask8>((1u << r) - 1); }
template <>
inline Vectorized<float> partial_load(const float* p, int64_t r) {
  return _mm512_maskz_loadu_ps(lanes16(r), p);
}
template <>
inline void partial_store(const Vectorized<float>& v, float* p, int64_t r) {
  _mm512_mask_storeu_ps(p, lanes16(r), v);
}
template <>
inline Vectorized<double> partial_load(const double* p, int64_t r) {
  return _mm512_maskz_loadu_pd(lanes8(r), p);
}
template <>
inline void partial_store(const Vectorized<double>& v, double* p, int64_t r) {
  _mm512_mask_storeu_pd(p, lanes8(r), v);
}
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
// Lane i is on where i < r: the sign bit of (i - r).
inline __m256i lanes32(int64_t r) {
  return _mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                          _mm256_set1_epi32(static_cast<int>(r)));
}
inline __m256i lanes64(int64_t r) {
  return _mm256_sub_epi64(_mm256_setr_epi64x(0, 1, 2, 3), _mm256_set1_epi64x(r));
}
template <>
inline Vectorized<float> partial_load(const float* p, int64_t r) {
  return _mm256_maskload_ps(p, lanes32(r));
}
template <>
inline void partial_store(const Vectorized<float>& v, float* p, int64_t r) {
  _mm256_maskstore_ps(p, lanes32(r), v);
}
template <>
inline Vectorized<double> partial_load(const double* p, int64_t r) {
  return _mm256_maskload_pd(p, lanes64(r));
}
template <>
inline void partial_store(const Vectorized<double>& v, double* p, int64_t r) {
  _mm256_maskstore_pd(p, lanes64(r), v);
}
#endif

// A vector of T from the size() elements at p, of type T itself or
// bfloat16, widened exactly (its bits into a float's upper half): the flash
// kernel's rows read a bfloat16 cache of keys and values in place this way
// (flash_rows-inl.h) instead of converting all of it first. With r, the
// first r <= size() lanes, zeros past them.
template <typename T>
Vectorized<T> load_widened(const T* p) {
  return Vectorized<T>::loadu(p);
}

template <typename T>
Vectorized<T> load_widened(const T* p, int64_t r) {
  return partial_load(p, r);
}

inline Vectorized<float> load_widened(const c10::BFloat16* p) {
#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
  float lanes[Vectorized<float>::size()];
  for (int64_t i = 0; i < Vectorized<float>::size(); ++i) lanes[i] = static_cast<float>(p[i]);
  return Vectorized<float>::loadu(lanes);
#endif
}

inline Vectorized<float> load_widened(const c10::BFloat16* p, int64_t r) {
  c10::BFloat16 lanes[Vectorized<float>::size()] = {};
  std::copy_n(p, r, lanes);
  return load_widened(lanes);
}

// Lanes [0, r) of `first` and the rest of `rest` (r <= size()): ATen's
// Vectorized::set(rest, first, r), whose switch over r is an indirect jump
// that random row lengths mispredict; on AVX2 and AVX-512 a masked blend.
template <typename T>
Vectorized<T> set_first(const Vectorized<T>& rest, const Vectorized<T>& first, int64_t r) {
  return Vectorized<T>::set(rest, first, r);
}

#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
template <>
inline Vectorized<float> set_first(const Vectorized<float>& rest, const Vectorized<float>& first,
                                   int64_t r) {
  return _mm512_mask_blend_ps(lanes16(r), rest, first);
}
template <>
inline Vectorized<double> set_first(const Vectorized<double>& rest,
                                    const Vectorized<double>& first, int64_t r) {
  return _mm512_mask_blend_pd(lanes8(r), rest, first);
}
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
template <>
inline Vectorized<float> set_first(const Vectorized<float>& rest, const Vectorized<float>& first,
                                   int64_t r) {
  return _mm256_blendv_ps(rest, first, _mm256_castsi256_ps(lanes32(r)));
}
template <>
inline Vectorized<double> set_first(const Vectorized<double>& rest,
                                    const Vectorized<double>& first, int64_t r) {
  return _mm256_blendv_pd(rest, first, _mm256_castsi256_pd(lanes64(r)));
}
#endif

// The last, partial vector of a row's first L entries. When the row has room
// for a whole vector past position j (room >= size), it is loaded whole, which
// is cheaper still; callers blend away lanes r.. with set_first before
// using them, so masked entries never count.
template <typename T>
Vectorized<T> load_tail(const T* p, int64_t r, int64_t room) {
  return room >= Vectorized<T>::size() ? Vectorized<T>::loadu(p) : partial_load(p, r);
}

template <typename T>
void store_tail(const Vectorized<T>& v, T* p, int64_t r, int64_t room) {
  if (room >= Vectorized<T>::size()) {
    v.store(p);
  } else {
    partial_store(v, p, r);
  }
}

// Horizontal sum and max of one vector. ATen's vec_reduce_all does log-free
// shuffles through memory in a loop; per row that costs more than the row.
template <typename T>
T horizontal_max(const Vectorized<T>& v) {
  T lanes[Vectorized<T>::size()];
  v.store(lanes);
  T mx = lanes[0];
  for (int64_t i = 1; i < Vectorized<T>::size(); ++i) {
    mx = (std::isnan(mx) || mx > lanes[i]) && !std::isnan(lanes[i]) ? mx : lanes[i];
  }
  return mx;
}

template <typename T>
T horizontal_sum(const Vectorized<T>& v) {
  T lanes[Vectorized<T>::size()];
  v.store(lanes);
  T sum = lanes[0];
  for (int64_t i = 1; i < Vectorized<T>::size(); ++i) sum += lanes[i];
  return sum;
}

// A tree of shuffles and adds in registers. The loop above is a trip through
// memory and then a chain of dependent scalar adds (15 for AVX-512 float),
// paid once per row by the masked softmax (a row of the book's shapes is 10
// keys) and once per key by the flash kernel's row-by-row forward. The sum's
// order changes: halves added pairwise instead of left to right. Written
// with __builtin_shufflevector (GCC 12, clang), not intrinsics: GCC 12's
// 512-bit shuffle and extract intrinsics pass _mm512_undefined_* through
// and warn (-Wuninitialized) wherever they are inlined.
#if (defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)) && \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
#define D2L_SHUFFLE(x, ...) __builtin_shufflevector(x, x, __VA_ARGS__)
namespace hsum {
// Four floats or two doubles, down to one.
inline float last(__m128 q) {
  q = q + D2L_SHUFFLE(q, 2, 3, 0, 1);
  q = q + D2L_SHUFFLE(q, 1, 0, 3, 2);
  return q[0];
}
inline double last(__m128d q) { return q[0] + q[1]; }
inline float of(__m256 h) { return last(D2L_SHUFFLE(h, 0, 1, 2, 3) + D2L_SHUFFLE(h, 4, 5, 6, 7)); }
inline double of(__m256d h) { return last(D2L_SHUFFLE(h, 0, 1) + D2L_SHUFFLE(h, 2, 3)); }
#if defined(CPU_CAPABILITY_AVX512)
inline float of(__m512 x) {
  return of(D2L_SHUFFLE(x, 0, 1, 2, 3, 4, 5, 6, 7) + D2L_SHUFFLE(x, 8, 9, 10, 11, 12, 13, 14, 15));
}
inline double of(__m512d x) { return of(D2L_SHUFFLE(x, 0, 1, 2, 3) + D2L_SHUFFLE(x, 4, 5, 6, 7)); }
#endif
}  // namespace hsum
// The same tree with max for the row maximum of the masked softmax and the
// flash kernel's rows: horizontal_max's loop compares random scores one at
// a time, and its mispredicted branches took a fifth of the book's
// (64, 10, 10) masked softmax forward. Where a lane is NaN, max_ps may pass
// it or not (it returns its second operand when either is NaN), unlike the
// loop; either way the callers take that lane's exponential into the row's
// sum, so the row comes out NaN as before.
namespace hmax {
inline float last(__m128 q) {
  q = _mm_max_ps(q, D2L_SHUFFLE(q, 2, 3, 0, 1));
  q = _mm_max_ps(q, D2L_SHUFFLE(q, 1, 0, 3, 2));
  return q[0];
}
inline double last(__m128d q) { return _mm_max_pd(q, D2L_SHUFFLE(q, 1, 0))[0]; }
inline float of(__m256 h) {
  return last(_mm_max_ps(D2L_SHUFFLE(h, 0, 1, 2, 3), D2L_SHUFFLE(h, 4, 5, 6, 7)));
}
inline double of(__m256d h) { return last(_mm_max_pd(D2L_SHUFFLE(h, 0, 1), D2L_SHUFFLE(h, 2, 3))); }
#if defined(CPU_CAPABILITY_AVX512)
inline float of(__m512 x) {
  return of(_mm256_max_ps(D2L_SHUFFLE(x, 0, 1, 2, 3, 4, 5, 6, 7),
                          D2L_SHUFFLE(x, 8, 9, 10, 11, 12, 13, 14, 15)));
}
inline double of(__m512d x) {
  return of(_mm256_max_pd(D2L_SHUFFLE(x, 0, 1, 2, 3), D2L_SHUFFLE(x, 4, 5, 6, 7)));
}
#endif
}  // namespace hmax
#undef D2L_SHUFFLE
// Overloads, which calls with float and double vectors prefer to the loops.
inline float horizontal_sum(const Vectorized<float>& v) { return hsum::of(v); }
inline double horizontal_sum(const Vectorized<double>& v) { return hsum::of(v); }
inline float horizontal_max(const Vectorized<float>& v) { return hmax::of(v); }
inline double horizontal_max(const Vectorized<double>& v) { return hmax::of(v); }
#endif

// out[c · ldo + r] = x[r · ldx + c] for r < rows, c < cols, with the rows
// r >= valid_rows of x read as zero: a block transposed, padded on the way.
// The flash kernels transpose a block of queries (or keys) on the way in and
// the output on the way out; element by element those two copies took a
// sixth of the forward at n = 128 (perf, AVX-512). With float vectors the
// block goes through registers a square at a time (transpose_square).
template <typename T>
void transpose_into(const T* x, int64_t ldx, int64_t valid_rows, int64_t rows, int64_t cols,
                    T* out, int64_t ldo) {
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) out[c * ldo + r] = r < valid_rows ? x[r * ldx + c] : T(0);
  }
}

#if (defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)) && \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
#define D2L_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
// v[i] becomes column i of the square whose rows v held: unpacks of floats,
// then of pairs, within each 128-bit lane, then lanes gathered across
// registers. Shuffles, not intrinsics, for the reason of hsum below.
#if defined(CPU_CAPABILITY_AVX512)
inline void transpose_square(__m512 (&v)[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = D2L_SHUFFLE2(v[i], v[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
    t[i + 1] =
        D2L_SHUFFLE2(v[i], v[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
  }
  // u[4g + j]: in lane k, column 4k + j of rows 4g .. 4g + 3.
  __m512 u[16];
  for (int g = 0; g < 16; g += 4) {
    for (int h = 0; h < 2; ++h) {
      const __m512 a = t[g + h], b = t[g + h + 2];
      u[g + 2 * h] =
          D2L_SHUFFLE2(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      u[g + 2 * h + 1] =
          D2L_SHUFFLE2(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 x0 = D2L_SHUFFLE2(u[j], u[4 + j], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20,
                                   21, 22, 23);
    const __m512 x1 = D2L_SHUFFLE2(u[j], u[4 + j], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                   27, 28, 29, 30, 31);
    const __m512 y0 = D2L_SHUFFLE2(u[8 + j], u[12 + j], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                   20, 21, 22, 23);
    const __m512 y1 = D2L_SHUFFLE2(u[8 + j], u[12 + j], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
    v[j] = D2L_SHUFFLE2(x0, y0, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    v[4 + j] = D2L_SHUFFLE2(x0, y0, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    v[8 + j] = D2L_SHUFFLE2(x1, y1, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    v[12 + j] =
        D2L_SHUFFLE2(x1, y1, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
}
using SquareRow = __m512;
#else
inline void transpose_square(__m256 (&v)[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = D2L_SHUFFLE2(v[i], v[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = D2L_SHUFFLE2(v[i], v[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  __m256 u[8];
  for (int g = 0; g < 8; g += 4) {
    for (int h = 0; h < 2; ++h) {
      const __m256 a = t[g + h], b = t[g + h + 2];
      u[g + 2 * h] = D2L_SHUFFLE2(a, b, 0, 1, 8, 9, 4, 5, 12, 13);
      u[g + 2 * h + 1] = D2L_SHUFFLE2(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int j = 0; j < 4; ++j) {
    const __m256 a = u[j], b = u[4 + j];
    v[j] = D2L_SHUFFLE2(a, b, 0, 1, 2, 3, 8, 9, 10, 11);
    v[4 + j] = D2L_SHUFFLE2(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
  }
}
using SquareRow = __m256;
#endif
#undef D2L_SHUFFLE2

template <>
inline void transpose_into(const float* x, int64_t ldx, int64_t valid_rows, int64_t rows,
                           int64_t cols, float* out, int64_t ldo) {
  using V = Vectorized<float>;
  constexpr int64_t S = V::size();
  SquareRow v[S];
  valid_rows = std::min(valid_rows, rows);
  for (int64_t r0 = 0; r0 < rows; r0 += S) {
    const int64_t nr = std::min(S, rows - r0);
    for (int64_t c0 = 0; c0 < cols; c0 += S) {
      const int64_t nc = std::min(S, cols - c0);
      for (int64_t i = 0; i < S; ++i) {
        const float* row = x + (r0 + i) * ldx + c0;
        v[i] = r0 + i >= valid_rows ? V(0.f) : nc == S ? V::loadu(row) : partial_load(row, nc);
      }
      transpose_square(v);
      for (int64_t j = 0; j < nc; ++j) {
        float* col = out + (c0 + j) * ldo + r0;
        if (nr == S) {
          V(v[j]).store(col);
        } else {
          partial_store(V(v[j]), col, nr);
        }
      }
    }
  }
}
#endif

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu

// narrow(): float to bfloat16, the other way.
#include "cpu/bf16_round-inl.h"
