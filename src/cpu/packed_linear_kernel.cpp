// A Linear layer's product x · Wᵀ on weights packed once per model (the
// packed copies are kept by packed_weights.cpp). Compiled once per
// instruction set (Note [CPU kernels per instruction set]).
//
// Note [Packed linear]
// A decoding step of a base-size Transformer (512 features, 8 heads, FFN
// 2048, a vocabulary of 10,000) multiplies a few dozen rows by each weight
// matrix. BLAS packs W into its panels on every call, and the packing costs
// as much as the product when the rows are few: MKL reached 52-58 GFLOP/s
// on (32 × 512) · (512 × 512 or 2048), 31 GFLOP/s on the output layer (32 ×
// 512) · (512 × 10,000), one thread of a Zen 3 core whose FMA peak is
// 99.7 GFLOP/s. Packed once, the products are the register tiles of
// gemm-inl.h (6 rows × 2 vectors with AVX2, 8 × 2 with AVX-512) over
// panels of W's transposed rows, each panel in L1 for every tile of rows;
// the rows that do not fill a tile go one at a time over four panels (eight
// accumulators, so one row is not held back by the latency of one chain).
// A standalone run of these loops on the same shapes: 66-68 GFLOP/s, and
// 61 on the output layer.
//
// Every output is summed in one order whatever the rows beside it, in the
// tile and in the row loop alike: chains of multiply-adds over blocks of
// k from 0 (kDepth), each block's sum added to the output's in k's order.
// A row therefore gets the same bits in any batch of 8 rows or more, at
// any number of threads, with AVX2 and AVX-512.

#include <algorithm>
#include <cstdint>

#include "cpu/gemm-inl.h"
#include "cpu/packed_linear_kernel.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

constexpr int64_t kPanel = kTileCols<float>;
// Panels a lone row goes over at once.
constexpr int64_t kRowPanels = 4;
// Products summed in one chain before the chain's sum is added to the
// output's: blocks of 128 (a sum over K = 2048 is 16 chains of 128 added,
// not one chain of 2048, whose rounding error would be up to 16 times as
// large as a block's).
constexpr int64_t kDepth = 128;

void pack_weights(const float* W, int64_t N, int64_t K, float* packed) {
  const int64_t panels = (N + kPanel - 1) / kPanel;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = packed + p * K * kPanel;
    for (int64_t j = 0; j < kPanel; ++j) {
      const int64_t n = p * kPanel + j;
      if (n < N) {
        const float* w = W + n * K;
        for (int64_t k = 0; k < K; ++k) dst[k * kPanel + j] = w[k];
      } else {
        for (int64_t k = 0; k < K; ++k) dst[k * kPanel + j] = 0.0F;
      }
    }
  }
}

// c[0 .. NP · kPanel) = x[0:K] · the NP panels from P (each K × kPanel,
// `stride` apart).
template <int NP>
C10_NOINLINE void row_panels(int64_t K, const float* x, const float* P, int64_t stride, float* c) {
  using V = Vectorized<float>;
  constexpr int64_t S = V::size();
  static_assert(kPanel == 2 * S && NP >= 1 && NP <= kRowPanels);
  V c00(0.0F), c01(0.0F), c10(0.0F), c11(0.0F), c20(0.0F), c21(0.0F), c30(0.0F), c31(0.0F);
  for (int64_t k = 0; k < K; ++k) {
    const V a(x[k]);
    const float* b = P + k * kPanel;
    c00 = at::vec::fmadd(a, V::loadu(b), c00);
    c01 = at::vec::fmadd(a, V::loadu(b + S), c01);
    if constexpr (NP > 1) {
      c10 = at::vec::fmadd(a, V::loadu(b + stride), c10);
      c11 = at::vec::fmadd(a, V::loadu(b + stride + S), c11);
    }
    if constexpr (NP > 2) {
      c20 = at::vec::fmadd(a, V::loadu(b + 2 * stride), c20);
      c21 = at::vec::fmadd(a, V::loadu(b + 2 * stride + S), c21);
    }
    if constexpr (NP > 3) {
      c30 = at::vec::fmadd(a, V::loadu(b + 3 * stride), c30);
      c31 = at::vec::fmadd(a, V::loadu(b + 3 * stride + S), c31);
    }
  }
  c00.store(c);
  c01.store(c + S);
  if constexpr (NP > 1) {
    c10.store(c + kPanel);
    c11.store(c + kPanel + S);
  }
  if constexpr (NP > 2) {
    c20.store(c + 2 * kPanel);
    c21.store(c + 2 * kPanel + S);
  }
  if constexpr (NP > 3) {
    c30.store(c + 3 * kPanel);
    c31.store(c + 3 * kPanel + S);
  }
}

void row_panels_any(int64_t count, int64_t K, const float* x, const float* P, int64_t stride,
                    float* c) {
  switch (count) {
    case 1: return row_panels<1>(K, x, P, stride, c);
    case 2: return row_panels<2>(K, x, P, stride, c);
    case 3: return row_panels<3>(K, x, P, stride, c);
    default: return row_panels<4>(K, x, P, stride, c);
  }
}

// sums[0 .. panels · kPanel) += part[0 .. panels · kPanel): whole vectors.
void add_panels(float* sums, const float* part, int64_t panels) {
  using V = Vectorized<float>;
  static_assert(kPanel % V::size() == 0);
  for (int64_t j = 0; j < panels * kPanel; j += V::size()) {
    (V::loadu(sums + j) + V::loadu(part + j)).store(sums + j);
  }
}

// out[r][c0 .. c0 + cols) = sums[r][0 .. cols) (+ bias[c0 ..]) for `rows` rows.
void finish(const float* sums, int64_t ld_sums, int64_t rows, int64_t cols, const float* bias,
            float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = sums + r * ld_sums;
    float* o = out + r * ldo;
    if (bias != nullptr) {
      for (int64_t j = 0; j < cols; ++j) o[j] = s[j] + bias[j];
    } else {
      std::copy(s, s + cols, o);
    }
  }
}

void packed_forward(const float* x, int64_t rows, int64_t K, const float* packed, int64_t N,
                    const float* bias, float* out, int64_t p0, int64_t p1) {
  // A group of kRowPanels panels at a time: the tiles of rows over each of
  // its panels, then the remaining rows over the whole group. Sums go to a
  // scratch block first (the last panel may pass N; the bias comes last),
  // a block of kDepth products at a time.
  constexpr int64_t ld = kRowPanels * kPanel;
  alignas(64) float sums[kTileRows * ld];
  alignas(64) float part[kTileRows * ld];
  const float* a[kTileRows];
  float* c[kTileRows];
  const int64_t stride = K * kPanel;
  const int64_t whole_rows = rows / kTileRows * kTileRows;
  for (int64_t g = p0; g < p1; g += kRowPanels) {
    const int64_t count = std::min(kRowPanels, p1 - g);
    const int64_t c0 = g * kPanel;
    const int64_t cols = std::min(count * kPanel, N - c0);
    const float* P = packed + g * stride;
    const float* b = bias != nullptr ? bias + c0 : nullptr;
    for (int64_t r0 = 0; r0 < whole_rows; r0 += kTileRows) {
      for (int64_t q = 0; q < count; ++q) {
        for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
          float* target = k0 == 0 ? sums : part;
          for (int64_t r = 0; r < kTileRows; ++r) {
            a[r] = x + (r0 + r) * K + k0;
            c[r] = target + r * ld + q * kPanel;
          }
          gemm_tile<float, false>(std::min(kDepth, K - k0), a, 1, P + q * stride + k0 * kPanel,
                                  kPanel, c, false);
          if (k0 > 0) {
            for (int64_t r = 0; r < kTileRows; ++r) {
              add_panels(sums + r * ld + q * kPanel, part + r * ld + q * kPanel, 1);
            }
          }
        }
      }
      finish(sums, ld, kTileRows, cols, b, out + r0 * N + c0, N);
    }
    for (int64_t r = whole_rows; r < rows; ++r) {
      for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
        row_panels_any(count, std::min(kDepth, K - k0), x + r * K + k0, P + k0 * kPanel, stride,
                       k0 == 0 ? sums : part);
        if (k0 > 0) add_panels(sums, part, count);
      }
      finish(sums, ld, 1, cols, b, out + r * N + c0, N);
    }
  }
}

}  // namespace

const PackedLinearKernels& packed_linear_kernels() {
  static const PackedLinearKernels table{kPanel, kRowPanels, &pack_weights, &packed_forward};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
