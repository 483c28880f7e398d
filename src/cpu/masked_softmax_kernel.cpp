// The fused masked softmax over the last dimension, forward and backward:
// parallel over rows, vectorised within a row (vec_helpers-inl.h). Compiled
// once per instruction set (Note [CPU kernels per instruction set]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include "cpu/masked_softmax_kernel.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

int64_t rows_of(const at::TensorBase& x) {
  const int64_t m = x.size(-1);
  return m == 0 ? 0 : x.numel() / m;
}

int64_t queries_of(const at::TensorBase& x) { return x.dim() == 3 ? x.size(1) : 1; }

void forward(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& lens,
             double scale) {
  const int64_t m = x.size(-1), rows = rows_of(x);
  const RowLengths L = row_lengths(lens, queries_of(x));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "d2l::masked_softmax", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const auto s = static_cast<scalar_t>(scale);
    at::parallel_for(0, rows, grain_for(m), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) softmax_row(xp + r * m, yp + r * m, L.at(r, m), m, s);
    });
  });
}

void backward(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx,
              const at::TensorBase& lens, double scale) {
  const int64_t m = y.size(-1), rows = rows_of(y);
  const RowLengths L = row_lengths(lens, queries_of(y));
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "d2l::masked_softmax_backward", [&] {
    const scalar_t* yp = y.data_ptr<scalar_t>();
    const scalar_t* dyp = dy.data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const auto s = static_cast<scalar_t>(scale);
    at::parallel_for(0, rows, grain_for(2 * m), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        softmax_backward_row(yp + r * m, dyp + r * m, dxp + r * m, L.at(r, m), m, s);
      }
    });
  });
}

}  // namespace

const MaskedSoftmaxKernels& masked_softmax_kernels() {
  static const MaskedSoftmaxKernels table{&forward, &backward};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
