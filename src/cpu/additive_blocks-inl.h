#pragma once

// What the fused additive attention kernel's forward and backward share
// (additive_attention_{forward,backward}_kernel.cpp): the problem's shape and
// the choice of loop order, loads over hidden units, the per-thread
// transposed keys, tanh, the values' arguments and the costs of the work
// split. Included inside each instruction set's CPU_CAPABILITY namespace.

#include <ATen/core/TensorBase.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>

#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

/// Shapes of one additive-attention problem (AdditiveAttentionKernels), and
/// which of the two loop orders a call takes (by_hidden_units).
struct AdditiveShape {
  int64_t B, n, m, h, m_pad, h_pad;
  bool by_hidden = false;
};

// L rounded up to whole vectors of T.
template <typename T>
int64_t whole_vectors(int64_t L) {
  constexpr int64_t S = Vectorized<T>::size();
  return (L + S - 1) / S * S;
}

// m_pad: m in whole vectors, the row length of the transposed keys and
// values each thread keeps (transpose_padded); h_pad: h in whole vectors, the
// row length of the keys when the loops run over hidden units.
template <typename T>
AdditiveShape shape_of(const at::TensorBase& q, const at::TensorBase& out) {
  const int64_t m = out.size(2), h = q.size(2);
  return {q.size(0), q.size(1), m, h, whole_vectors<T>(m), whole_vectors<T>(h)};
}

// The two loop orders. Over keys, each lane holds one key and no horizontal
// sums are needed, but a row of L keys computes tanh for whole_vectors(L) of
// them: at the book's 10 keys, 16 float lanes of AVX-512 where lengths drawn
// from 1..10 use 5.5 on average. Over hidden units, each (query, key) pair
// computes whole_vectors(h) lanes (zeros past h) and, in the forward, one
// horizontal sum. A call takes the second where its lanes, a pair's overhead
// counted as kSumLanes of them, come to fewer than the first's (decided once
// per call from the lengths, so that every row uses one layout of the keys).
// Measured (AVX-512 float, 1 thread, forward+backward of the weights, keys
// against hidden units): (64, 10, 10) at h = 32 320 against 136 us, at h = 8
// 117 against 100; (32, 128, 128) at h = 64 13.4 against 11.9 ms, at h = 24
// 4.1 against 5.4 ms (keys kept); (64, 20, 20) at h = 8 245 against 277 us
// (keys kept). On AVX2 (8 float lanes) the rule takes (64, 10, 10) at h = 32
// over hidden units (the module's forward+backward 451 against 339 us) and
// keeps (32, 128, 128, h 64) and (8, 512, 512, h 128) over keys, where hidden
// units measured 0.98-1.06x the time (kSumLanes = 0 would flip them).
constexpr int64_t kSumLanes = 4;

template <typename T>
int64_t lanes_by_keys(int64_t L, const AdditiveShape& s) {
  return whole_vectors<T>(L) * s.h;
}
inline int64_t lanes_by_hidden(int64_t L, const AdditiveShape& s) {
  return L * (s.h_pad + kSumLanes);
}

template <typename T>
bool by_hidden_units(const AdditiveShape& s, const RowLengths& lens, bool softmax) {
  int64_t keys = 0, hidden = 0;
  for (int64_t r = 0; r < s.B * s.n; ++r) {
    const int64_t L = softmax ? lens.at(r, s.m) : s.m;
    keys += lanes_by_keys<T>(L, s);
    hidden += lanes_by_hidden(L, s);
  }
  return hidden < keys;
}

// x[c, c + S) over hidden units: a whole vector, or the last, partial one
// with zeros past h (zero queries, keys and w_v there add w tanh(q + k) = 0).
template <typename T>
Vectorized<T> load_hidden(const T* x, int64_t c, int64_t h) {
  return c + Vectorized<T>::size() <= h ? Vectorized<T>::loadu(x + c) : partial_load(x + c, h - c);
}

// xT[c * m_pad + j] = x[j * cols + c] for keys j < m, zero for j in [m, m_pad):
// one batch entry's keys (or values) transposed, so that the loops over keys
// load whole vectors. Each thread transposes the entries its rows belong to
// into its own buffer, as it reaches them: in parallel, and with no (B, h,
// m_pad) tensors. Made before the kernel (a zero-fill and a copy, for the
// keys and again for the values the backward reads), they took 28% of
// AdditiveAttention's forward samples at the book's (64, 10, 10) at 2
// threads, all on the calling thread.
template <typename T>
void transpose_padded(const T* x, T* xT, int64_t m, int64_t cols, int64_t m_pad) {
  for (int64_t c = 0; c < cols; ++c) {
    T* row = xT + c * m_pad;
    for (int64_t j = 0; j < m; ++j) row[j] = x[j * cols + c];
    std::fill(row + m, row + m_pad, T(0));
  }
}

// tanh(x) = x P(x²) / Q(x²) on |x| <= 7.905 (beyond it tanh rounds to ±1 in
// float): the minimax rational approximation Eigen uses. Only FMAs and one
// division, about a tenth of SLEEF's cost; max error a few ulp (4e-7
// absolute), swept over the float range in the tests.
inline Vectorized<float> vec_tanh(Vectorized<float> x) {
  using V = Vectorized<float>;
  // clamp keeps NaN (its max/min return the NaN operand) in two instructions;
  // minimum/maximum add NaN fix-ups that cost 15% of the whole function.
  x = at::vec::clamp(x, V(-7.90531110763549805f), V(7.90531110763549805f));
  const V x2 = x * x;
  V p = V(-2.76076847742355e-16f);
  p = at::vec::fmadd(p, x2, V(2.00018790482477e-13f));
  p = at::vec::fmadd(p, x2, V(-8.60467152213735e-11f));
  p = at::vec::fmadd(p, x2, V(5.12229709037114e-08f));
  p = at::vec::fmadd(p, x2, V(1.48572235717979e-05f));
  p = at::vec::fmadd(p, x2, V(6.37261928875436e-04f));
  p = at::vec::fmadd(p, x2, V(4.89352455891786e-03f));
  V q = V(1.19825839466702e-06f);
  q = at::vec::fmadd(q, x2, V(1.18534705686654e-04f));
  q = at::vec::fmadd(q, x2, V(2.26843463243900e-03f));
  q = at::vec::fmadd(q, x2, V(4.89352518554385e-03f));
  // x * (p / q), not (x * p) / q: x * p underflows to a subnormal with few
  // significant bits for tiny x, while p / q is within 2 ulp of 1 there.
  return x * (p / q);
}

// Double keeps full accuracy: the golden tests compare to 1e-10.
inline Vectorized<double> vec_tanh(Vectorized<double> x) { return x.tanh(); }

// The values of forward_values and backward_values: v (B, m, d), do (B, n, d)
// and dv (B, m, d).
// `on` false: the kernels without values. (Not a null pointer: an empty
// tensor's data pointer may be null.)
template <typename T>
struct ValuesArgs {
  bool on = false;
  const T* v = nullptr;
  T* o = nullptr;
  const T* dout = nullptr;
  T* dv = nullptr;
  int64_t d = 0;
};

// Costs for the work split (parallel_runs), in tanh lanes. The tanh are
// computed a whole vector of keys at a time, so a row of L keys costs
// round_up(L, S) of them per hidden unit: at the book's 10 keys every row
// costs one vector of 16, whatever its length (counting L gave one of two
// threads 356 rows and the other 284 in the backward at (64, 10, 10) with the
// bench's lengths). A product with the values costs an FMA lane per key and
// feature, about an eighth of a tanh lane; each row adds its softmax and
// call, about kRowCost (as in the masked softmax), and a store per key.
constexpr int64_t kRowCost = 128, kFmaPerTanh = 8;

}  // namespace

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
