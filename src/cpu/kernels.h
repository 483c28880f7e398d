#pragma once

// Raw-pointer CPU kernels behind the fused paths. kernels.cpp is compiled once
// per instruction set (namespaces d2l::cpu::DEFAULT, AVX2 and AVX512); the
// op layer asks kernels<T>() for the table of the one chosen for this process.

#include <algorithm>
#include <cstdint>

namespace d2l::cpu {

/// Valid length of each row of a (rows, m) problem: min(data[row / rows_per_len], m),
/// or m when there are no lengths. Lengths were checked non-negative upstream.
struct RowLengths {
  const int64_t* data = nullptr;
  int64_t rows_per_len = 1;

  int64_t at(int64_t row, int64_t m) const {
    return data == nullptr ? m : std::min(data[row / rows_per_len], m);
  }
};

/// Shapes of an additive-attention problem. Keys come transposed and padded:
/// kT is (B, h, m_pad) with m_pad a multiple of the vector width and zeros in
/// the padding, so every vector load is a full one.
struct AdditiveShape {
  int64_t B, n, m, h, m_pad;
};

template <typename T>
struct KernelTable {
  /// y = softmax(scale * x) over each row's first L entries, 0 after them.
  void (*softmax_forward)(const T* x, T* y, int64_t rows, int64_t m, RowLengths lens, T scale);
  /// dx = scale * y * (dy - <dy, y>) over the valid entries, 0 after them.
  void (*softmax_backward)(const T* y, const T* dy, T* dx, int64_t rows, int64_t m,
                           RowLengths lens, T scale);
  /// out[b, i, j] = sum_h w[h] tanh(q[b, i, h] + kT[b, h, j]); with `softmax`,
  /// out holds the masked softmax of those scores instead.
  void (*additive_forward)(const T* q, const T* kT, const T* w, T* out, AdditiveShape s,
                           RowLengths lens, bool softmax);
  /// Gradients of additive_forward with respect to q, kT and w, recomputing
  /// tanh. `y` is additive_forward's output (used when `softmax`). dq, dkT and
  /// dw are overwritten.
  void (*additive_backward)(const T* q, const T* kT, const T* w, const T* y, const T* dout,
                            T* dq, T* dkT, T* dw, AdditiveShape s, RowLengths lens, bool softmax);
  /// y = tanh(x), elementwise: the function additive attention spends its time
  /// in (a rational approximation for float, see kernels.cpp).
  void (*tanh)(const T* x, T* y, int64_t n);
  /// Vector width in elements of T (m_pad is a multiple of it).
  int64_t vector_size;
};

#define D2L_DECLARE_KERNEL_TABLES(isa)          \
  namespace isa {                               \
  const KernelTable<float>& float_kernels();    \
  const KernelTable<double>& double_kernels();  \
  }

D2L_DECLARE_KERNEL_TABLES(DEFAULT)
D2L_DECLARE_KERNEL_TABLES(AVX2)
D2L_DECLARE_KERNEL_TABLES(AVX512)
#undef D2L_DECLARE_KERNEL_TABLES

/// The table of the instruction set chosen for this process (see d2l::cpu_isa()).
template <typename T>
const KernelTable<T>& kernels();

}  // namespace d2l::cpu
