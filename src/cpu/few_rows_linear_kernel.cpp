// A Linear layer's product x · Wᵀ for an x of a few rows (a decoding step:
// one row per hypothesis), one slice of W's rows per call. Compiled once per
// instruction set (Note [CPU kernels per instruction set]).
//
// Such a product reads every weight once and does one multiply-add with it
// per row of x: it runs at the speed memory delivers W (15 to 18 GB/s on one
// Zen 3 core of the VM). BLAS runs it on one thread whatever its pool (MKL's
// matrix-vector products, and its products of a few rows), and MKL's
// products of 2 to 7 rows run well below that speed. Here four rows of W are
// read side by side, a vector at a time, each vector used by every row of x
// (two at a time, in registers: 2 × 4 accumulators, 4 vectors of W and one
// of x fit AVX2's 16 registers); the four rows' sums are reduced once at the
// end. Measured against MKL's products on the same slices of W (the
// base-size Transformer of benchmarks/ct2_table.py decoding one sentence at
// a time, medians of 3 interleaved runs, Zen 3, LibTorch 2.11): beam 4 (4
// rows) 3.50 s against 4.45 s at 1 thread, 2.11 against 2.95 at 2; greedy
// (1 row) 3.88 against 4.36 at 1 thread, 3.04 against 3.38 at 2.

#include <ATen/Dispatch.h>

#include <algorithm>
#include <cstdint>

#include "cpu/few_rows_linear_kernel.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

constexpr int64_t kWeightRows = 4;

// out[r][c .. c + nc) for rows r < R of x (R <= 2), nc <= kWeightRows rows of W
// from w (row stride K).
template <typename T, int R>
void few_rows_block(const T* x, const T* w, int64_t nc, int64_t K, const T* bias, T* out,
                    int64_t ldo) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  V acc[R][kWeightRows];
  for (int r = 0; r < R; ++r) {
    for (int64_t j = 0; j < kWeightRows; ++j) acc[r][j] = V(T(0));
  }
  const int64_t whole = K / S * S;
  if (nc == kWeightRows) {
    for (int64_t k = 0; k < whole; k += S) {
      const V w0 = V::loadu(w + k), w1 = V::loadu(w + K + k), w2 = V::loadu(w + 2 * K + k),
              w3 = V::loadu(w + 3 * K + k);
      for (int r = 0; r < R; ++r) {
        const V xv = V::loadu(x + r * K + k);
        acc[r][0] = at::vec::fmadd(xv, w0, acc[r][0]);
        acc[r][1] = at::vec::fmadd(xv, w1, acc[r][1]);
        acc[r][2] = at::vec::fmadd(xv, w2, acc[r][2]);
        acc[r][3] = at::vec::fmadd(xv, w3, acc[r][3]);
      }
    }
  } else {
    for (int64_t k = 0; k < whole; k += S) {
      for (int r = 0; r < R; ++r) {
        const V xv = V::loadu(x + r * K + k);
        for (int64_t j = 0; j < nc; ++j)
          acc[r][j] = at::vec::fmadd(xv, V::loadu(w + j * K + k), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t j = 0; j < nc; ++j) {
      T sum = horizontal_sum(acc[r][j]);
      for (int64_t k = whole; k < K; ++k) sum += x[r * K + k] * w[j * K + k];
      out[r * ldo + j] = bias != nullptr ? sum + bias[j] : sum;
    }
  }
}

template <typename T>
void few_rows_raw(const T* xp, int64_t rows, int64_t K, const T* wp, int64_t N, const T* bp, T* op,
                  int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; c += kWeightRows) {
    const int64_t nc = std::min(kWeightRows, c1 - c);
    const T* w = wp + c * K;
    const T* b = bp != nullptr ? bp + c : nullptr;
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) few_rows_block<T, 2>(xp + r * K, w, nc, K, b, op + r * N + c, N);
    if (r < rows) few_rows_block<T, 1>(xp + r * K, w, nc, K, b, op + r * N + c, N);
  }
}

template <typename T>
void few_rows_typed(const at::TensorBase& x, const at::TensorBase& W, const at::TensorBase& bias,
                    const at::TensorBase& out, int64_t c0, int64_t c1) {
  few_rows_raw<T>(x.data_ptr<T>(), x.size(0), x.size(1), W.data_ptr<T>(), W.size(0),
                  bias.numel() > 0 ? bias.data_ptr<T>() : nullptr, out.data_ptr<T>(), c0, c1);
}

void few_rows_forward(const at::TensorBase& x, const at::TensorBase& W, const at::TensorBase& bias,
                      const at::TensorBase& out, int64_t c0, int64_t c1) {
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "d2l::few_rows_linear",
                             [&] { few_rows_typed<scalar_t>(x, W, bias, out, c0, c1); });
}

}  // namespace

const FewRowsLinearKernels& few_rows_linear_kernels() {
  static const FewRowsLinearKernels table{&few_rows_forward, &few_rows_raw<float>,
                                          &few_rows_raw<double>};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
