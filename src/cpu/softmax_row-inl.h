#pragma once

// One row of the masked softmax, forward and backward, and the exponential
// they use (included inside each instruction set's CPU_CAPABILITY
// namespace): the masked softmax kernel runs it row by row, the additive
// kernel folds it into its own loop, and the flash kernel uses the
// exponential and the row maximum.

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

template <typename T>
T row_max(const T* x, int64_t L, int64_t m) {
  using V = Vectorized<T>;
  const V lowest(-std::numeric_limits<T>::infinity());
  V vmax = lowest;
  int64_t j = 0;
  for (; j + V::size() <= L; j += V::size()) vmax = at::vec::maximum(vmax, V::loadu(x + j));
  if (j < L) {
    vmax = at::vec::maximum(vmax, set_first(lowest, load_tail(x + j, L - j, m - j), L - j));
  }
  return horizontal_max(vmax);
}

// e^x for the softmax's exponents (the masked softmax and the flash
// kernel). Float on AVX2 and AVX-512: Cody–Waite reduction to
// r = x - n·ln 2 with |r| <= ln 2 / 2, Taylor to degree 6 (truncation below
// 2e-7 relative), scaled by 2^n: no call and fewer instructions than SLEEF's
// 1-ulp exp, which took 11% of the flash forward pass on AVX2 and 28% of the
// masked softmax forward on AVX-512 in profiles. NaN stays NaN; below -87.3
// (where e^x leaves the normal floats) it is 0, as -inf is; above 88 it stays
// at e^88 (never met: the exponents here are at most 0). Other types and
// instruction sets: Vectorized<T>::exp (SLEEF).
template <typename T>
inline Vectorized<T> softmax_exp(const Vectorized<T>& x) {
  return x.exp();
}

// The reduction's constants: ln 2 split in a high part exact in float and
// the rest, and the Taylor coefficients 1/k! from k = 6 down to k = 0.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693145751953125f, kLn2Low = 1.428606765330187e-06f;
constexpr float kExpLowest = -87.3f, kExpHighest = 88.0f;
constexpr float kExpTaylor[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

#if defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
template <>
inline Vectorized<float> softmax_exp(const Vectorized<float>& x) {
  const __m256 v = x;
  const __m256 lowest = _mm256_set1_ps(kExpLowest);
  // max/min return their second operand when either is NaN: NaN goes through.
  const __m256 c = _mm256_min_ps(_mm256_set1_ps(kExpHighest), _mm256_max_ps(lowest, v));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[k]));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  // Zero below the range: the compare is false for NaN, which stays.
  return _mm256_andnot_ps(_mm256_cmp_ps(v, lowest, _CMP_LT_OQ), e);
}
#elif defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
// The same on 16 lanes; 2^n through scalef (n is a whole number here).
template <>
inline Vectorized<float> softmax_exp(const Vectorized<float>& x) {
  const __m512 v = x;
  const __m512 lowest = _mm512_set1_ps(kExpLowest);
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(kExpHighest), _mm512_max_ps(lowest, v));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[k]));
  const __m512 e = _mm512_scalef_ps(p, n);
  const __mmask16 below = _mm512_cmp_ps_mask(v, lowest, _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~below), e);
}
#endif

// Note [Base-2 exponentials in the flash kernel]
// The flash kernel's softmax is exp(scale·s - m) over scores s = q·k. On
// AVX2 float it is taken as 2^(s' - m') with s' = (scale·log2 e)·s: the
// factor is folded into the block of queries (or keys) the kernel packs
// anyway, so a score costs no multiply, and 2^x needs no Cody-Waite
// reduction and no final multiply. That is 2^x = 2^n · p(x - n), n the
// nearest whole number (the 1.5·2^23 trick: its low bits are n, shifted
// into the exponent by an integer add), p a degree-5 fit of 2^f on
// [-1/2, 1/2] (relative error 2.1e-7 with its float coefficients, as
// softmax_exp's 2.2e-7): 11 instructions where softmax_exp takes 17 and 5
// multiply-adds where it takes 11, which on AVX2's two FMA ports took a
// third of the forward's time beside its products (Zen 3, perf). The maxima
// and sums are those of s', the log-sum-exps go out in natural units
// (m'·ln 2 + ln sum) and the backward takes them back (lse·log2 e). Other
// types and instruction sets keep base e (kLogBase 1, softmax_exp).
template <typename T>
struct FlashExp {
#if defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
  static constexpr bool kBase2 = std::is_same_v<T, float>;
#else
  static constexpr bool kBase2 = false;
#endif
  /// What the scale is multiplied by: log2 e in base 2, else 1.
  static constexpr T kLogBase = kBase2 ? T(kLog2e) : T(1);
  /// 1 / kLogBase: ln 2 in base 2.
  static constexpr T kInvLogBase = kBase2 ? T(0.693147180559945309) : T(1);

  static Vectorized<T> exp(const Vectorized<T>& x);
  static T exp(T x) { return kBase2 ? std::exp2(x) : std::exp(x); }
  /// The natural log-sum-exp of exponentials shifted by `shift` (in the
  /// kernel's base) that sum to `sum`.
  static T lse(T shift, T sum) { return shift * kInvLogBase + std::log(sum); }
};

template <typename T>
inline Vectorized<T> FlashExp<T>::exp(const Vectorized<T>& x) {
  return softmax_exp(x);
}

#if defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
// 2^x for x <= 0 (up to a rounding above it); 0 below -125 and at -inf,
// NaN stays NaN.
template <>
inline Vectorized<float> FlashExp<float>::exp(const Vectorized<float>& x) {
  const __m256 lowest = _mm256_set1_ps(-125.0f);
  // max_ps returns its second operand when either is NaN: NaN goes through.
  const __m256 c = _mm256_max_ps(lowest, x);
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 · 2^23
  const __m256 t = _mm256_add_ps(c, magic);
  const __m256 f = _mm256_sub_ps(c, _mm256_sub_ps(t, magic));
  __m256 p = _mm256_set1_ps(1.327647129e-03f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.675540961e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550713092e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402212024e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931469440e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.000000119e+00f));
  // n from t's low bits into p's exponent (p is in [0.7, 1.5]; n >= -125).
  const __m256i e =
      _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23));
  // Zero below the range: the compare is false for NaN, which stays.
  return _mm256_andnot_ps(_mm256_cmp_ps(x, lowest, _CMP_LT_OQ), _mm256_castsi256_ps(e));
}
#endif

// Where a row's zeros past its L valid entries start being written by a
// fill, the rest of the row: the last, partial vector of the valid entries
// is stored blended with zeros as far as the row lets it (its lanes up to m),
// so that a row of at most one vector (the book's 10 keys) needs no fill. A
// fill per row was a memset call of a random length, whose branches
// mispredicted on every few rows.
template <typename T>
int64_t zeros_from(int64_t L, int64_t m) {
  const int64_t j = L - L % Vectorized<T>::size();
  return j == L ? L : std::min(m, j + Vectorized<T>::size());
}

// The partial vector of a row's valid entries, lanes r.. already zero, at
// y + j: stored up to m (the row's room), so that it writes the first zeros.
template <typename T>
void store_tail_zeros(const Vectorized<T>& v, T* p, int64_t room) {
  store_tail(v, p, std::min<int64_t>(room, Vectorized<T>::size()), room);
}

// One row of y = softmax(scale * x[0:L]) followed by zeros up to m. Masked
// entries never reach a sum or an output lane, so whatever they hold (inf,
// NaN) cannot leak.
template <typename T>
void softmax_row(const T* x, T* y, int64_t L, int64_t m, T scale) {
  using V = Vectorized<T>;
  if (L == 0) return std::fill(y, y + m, T(0));
  const T mx = row_max(x, L, m);
  const V vmax(mx), vscale(scale);
  V vsum(0);
  int64_t j = 0;
  for (; j + V::size() <= L; j += V::size()) {
    const V e = softmax_exp((V::loadu(x + j) - vmax) * vscale);
    e.store(y + j);
    vsum = vsum + e;
  }
  const int64_t r = L - j;
  V tail(0);
  if (r > 0) {
    tail = set_first(V(0), softmax_exp((load_tail(x + j, r, m - j) - vmax) * vscale), r);
    vsum = vsum + tail;
  }
  const V inv(T(1) / horizontal_sum(vsum));
  for (j = 0; j + V::size() <= L; j += V::size()) (V::loadu(y + j) * inv).store(y + j);
  // Lanes past L hold zeros, but 0 * inv is NaN when the valid scores are all
  // -inf (or hold +inf or NaN): blend them back to exact zeros.
  if (r > 0) store_tail_zeros(set_first(V(0), tail * inv, r), y + j, m - j);
  std::fill(y + zeros_from<T>(L, m), y + m, T(0));
}

// dx = scale * y * (dy - <dy, y>) on the valid entries, zeros after them.
// dy's masked entries (possibly inf or NaN) are blended away before use.
template <typename T>
void softmax_backward_row(const T* y, const T* dy, T* dx, int64_t L, int64_t m, T scale) {
  using V = Vectorized<T>;
  V vdot(0);
  int64_t j = 0;
  for (; j + V::size() <= L; j += V::size()) {
    vdot = at::vec::fmadd(V::loadu(y + j), V::loadu(dy + j), vdot);
  }
  const int64_t r = L - j;
  if (r > 0) {
    const V prod = load_tail(y + j, r, m - j) * load_tail(dy + j, r, m - j);
    vdot = vdot + set_first(V(0), prod, r);
  }
  const V dot(horizontal_sum(vdot));
  const V vscale(scale);
  for (j = 0; j + V::size() <= L; j += V::size()) {
    (vscale * V::loadu(y + j) * (V::loadu(dy + j) - dot)).store(dx + j);
  }
  if (r > 0) {
    const V g = vscale * load_tail(y + j, r, m - j) * (load_tail(dy + j, r, m - j) - dot);
    store_tail_zeros(set_first(V(0), g, r), dx + j, m - j);
  }
  std::fill(dx + zeros_from<T>(L, m), dx + m, T(0));
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
