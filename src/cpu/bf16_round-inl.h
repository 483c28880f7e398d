#pragma once

// narrow(): float rows rounded into bfloat16, the way back of
// vec_helpers-inl.h's load_widened; included at that header's end, in each
// instruction set's copy of the kernels (CPU_CAPABILITY).

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// Rounding the other way: n floats into bfloat16, to nearest even, the bits
// c10::BFloat16's constructor gives (a NaN becomes its quiet NaN, 0x7fc0),
// one vector at a time where the instruction set has one. The flash
// kernel's bfloat16 gradients and outputs leave through it, made in float.
#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
inline __m512i round_to_bf16_bits(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7fc0));
}
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
inline __m256i round_to_bf16_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
}
#endif

inline void narrow(const float* x, int64_t n, c10::BFloat16* out) {
  int64_t c = 0;
#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
  for (; c + 16 <= n; c += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                        _mm512_cvtepi32_epi16(round_to_bf16_bits(_mm512_loadu_ps(x + c))));
  }
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
  for (; c + 16 <= n; c += 16) {
    // packus interleaves the two halves' 128-bit lanes; 0xd8 puts them back.
    const __m256i packed = _mm256_packus_epi32(round_to_bf16_bits(_mm256_loadu_ps(x + c)),
                                               round_to_bf16_bits(_mm256_loadu_ps(x + c + 8)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + c),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
#endif
  for (; c < n; ++c) out[c] = static_cast<c10::BFloat16>(x[c]);
}

// n values of x into `out`, rounded where Out is narrower than T.
template <typename T, typename Out>
void narrow(const T* x, int64_t n, Out* out) {
  if constexpr (std::is_same_v<T, Out>) {
    std::copy_n(x, n, out);
  } else {
    for (int64_t c = 0; c < n; ++c) out[c] = static_cast<Out>(x[c]);
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
