// One core's multiply-add limits, which the attention kernels are quoted against
// (docs/performance.md): the float32 FMA peak (as shared/tools/fma_peak.c) and the bfloat16
// VDPBF16PS peak, each from 16 independent register-only chains, and the CPU's bfloat16 and
// matrix-engine features as CPUID reports them (leaf 7: AVX512-BF16, AVX512-FP16, AMX).
//
//   gcc -O2 benchmarks/compute_peak.c -o compute_peak && ./compute_peak
//
// The loops are compiled for AVX-512 (and AVX512-BF16) by target attributes and run only where
// CPUID says the CPU has them. They are timed in this process's CPU time: register-only loops run
// at the core's rate whenever they run, so other programs on the cores do not change the figure.
#include <cpuid.h>
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

enum { kChains = 16 };
static const long kSteps = 100000000;

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f"))) static double fma_gflops(void) {
  __m512 acc[kChains];
  const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps((float)i);
  const double t0 = seconds();
  for (long k = 0; k < kSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  const double s = seconds() - t0;
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  if (sum == 42) puts("");  // keeps the chains alive
  return kSteps * (double)kChains * 16 * 2 / s / 1e9;
}

// Each VDPBF16PS: 16 lanes × 2 bfloat16 products added = 64 flops.
__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_gflops(void) {
  __m512 acc[kChains];
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x33d633d6);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps((float)i);
  const double t0 = seconds();
  for (long k = 0; k < kSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  }
  const double s = seconds() - t0;
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  if (sum == 42) puts("");
  return kSteps * (double)kChains * 32 * 2 / s / 1e9;
}

int main(void) {
  unsigned a, b, c, d, a1 = 0, b1, c1, d1;
  __cpuid_count(7, 0, a, b, c, d);
  __cpuid_count(7, 1, a1, b1, c1, d1);
  const int avx512f = (b >> 16) & 1, avx512_bf16 = (a1 >> 5) & 1, avx512_fp16 = (d >> 23) & 1;
  const int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1, amx_int8 = (d >> 25) & 1;
  const int amx_fp16 = (a1 >> 21) & 1;
  printf("CPUID leaf 7: avx512f %d, avx512_bf16 %d, avx512_fp16 %d, amx_tile %d, amx_bf16 %d, "
         "amx_int8 %d, amx_fp16 %d\n",
         avx512f, avx512_bf16, avx512_fp16, amx_tile, amx_bf16, amx_int8, amx_fp16);
  if (avx512f) printf("float32 FMA peak, 1 thread: %.1f GFLOP/s\n", fma_gflops());
  if (avx512_bf16) printf("bfloat16 VDPBF16PS peak, 1 thread: %.1f GFLOP/s\n", dpbf16_gflops());
  return 0;
}
