// Multi-head attention for small heads on the CPU, forward and backward:
// each task is one head of one batch entry, read in place from the
// projections, whose heads sit side by side in each row (Note [Small heads],
// below). Compiled once per instruction set (Note [CPU kernels per
// instruction set]).

#include <ATen/Dispatch.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/multi_head_attention_kernel.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/small_heads-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

// Note [Small heads]
// At the book's Transformer shapes (batch 64, 10 steps, 32 hidden units, 4
// heads) a head is a 10 × 10 problem of 8 features. The flash kernel works in
// register tiles of 32 queries and packs its operands per block, so most of
// its time there is set-up (about 1.4 µs a head forward), and the head split
// and join around it are two copies of every projection each way. These
// kernels take the projections as they come out of the matrix products,
// (B, n, heads · d): head i of a row is the d features from i·d, so a head
// is read in place with a row stride of h = heads · d, and the output is
// written straight into the joined (B, n, h) that the output projection
// reads (the tasks: small_heads-inl.h). A run of tasks packs each entry's
// keys transposed once for all its heads (h × m, m rounded up to whole
// vectors), so that a query row's scores are d multiply-adds of whole
// vectors of keys rather than a dot product per key; then the masked softmax
// (softmax_row-inl.h; in registers where the keys fit one vector, as the
// book's 10 do with AVX-512 floats), which is also the attention weights the
// book records and what the backward reads; and the output as the weighted
// sum of the value rows, accumulated in registers one vector of features at
// a time. The dropout's multipliers, drawn by the caller as ATen's dropout
// draws them, scale the weights on their way into the output. The backward
// packs the values the same way for each query's dP, keeps one head's dS
// (n × m) per thread, dS = scale · P ∘ (dP - <dP, P>), takes dQ from dS's
// row, then dK and dV key by key from dS's and P's columns, so that every
// output row is written once. Lanes of keys past a row's length are blended
// away before any maximum or sum, and the weighted sums stop at the length,
// so nothing stored in padding (inf, NaN) reaches an output; keys that no
// row sees get zero gradients. A head's weights are held whole for the
// backward, so the caller keeps these kernels to small heads (small_heads in
// select.h, with the measurements that chose it); larger
// heads go to the flash kernel. In bfloat16 the node
// (autograd/multi_head_attention.cpp) projects in bfloat16 and hands these
// kernels float: the projections widened once, the heads' output rounded
// once on its way to the output projection (docs/kernels.md).

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

template <typename T>
Vectorized<T> load_some(const T* p, int64_t r) {
  return r == Vectorized<T>::size() ? Vectorized<T>::loadu(p) : partial_load(p, r);
}

template <typename T>
void store_some(const Vectorized<T>& v, T* p, int64_t r) {
  if (r == Vectorized<T>::size()) {
    v.store(p);
  } else {
    partial_store(v, p, r);
  }
}

// out[0:d] = Σ_t coef[t · coef_stride] · rows[t · row_stride + 0:d], t < count,
// one vector of features at a time in a register.
template <typename T>
void weighted_rows(const T* coef, int64_t coef_stride, const T* rows, int64_t row_stride,
                   int64_t count, int64_t d, T* out) {
  using V = Vectorized<T>;
  for (int64_t f = 0; f < d; f += V::size()) {
    const int64_t r = std::min<int64_t>(V::size(), d - f);
    V acc(T(0));
    for (int64_t t = 0; t < count; ++t) {
      acc = at::vec::fmadd(V(coef[t * coef_stride]), load_some(rows + t * row_stride + f, r), acc);
    }
    store_some(acc, out + f, r);
  }
}

// A head's keys (or values) transposed, t[f · width + j] = x[j][f] with
// zeros from m to width (m rounded up to whole vectors), give a row's scores
// (or dP) as d multiply-adds of whole vectors per vector of keys, with no
// dot product per key. A row of at most one vector of keys (the book's 10
// with AVX-512 floats) keeps them in a register.
template <typename T>
int64_t transposed_width(int64_t m) {
  constexpr int64_t S = Vectorized<T>::size();
  return (m + S - 1) / S * S;
}

// Through registers a square at a time where transpose_into can (float):
// element by element, packing one query's keys cost more than its scores.
template <typename T>
void pack_transposed_rows(const T* x, int64_t h, int64_t m, int64_t d, T* t) {
  const int64_t width = transposed_width<T>(m);
  transpose_into(x, h, m, width, d, t, width);
}

// Lanes [j0, j0 + S) of row · t.
template <typename T>
Vectorized<T> row_times_transposed(const T* row, const T* t, int64_t d, int64_t width,
                                   int64_t j0 = 0) {
  using V = Vectorized<T>;
  V acc(T(0));
  for (int64_t f = 0; f < d; ++f)
    acc = at::vec::fmadd(V(row[f]), V::loadu(t + f * width + j0), acc);
  return acc;
}

// out[0:len] (and up to the end of its last vector) = row · t.
template <typename T>
void row_times_transposed(const T* row, const T* t, int64_t d, int64_t width, int64_t len, T* out) {
  for (int64_t j0 = 0; j0 < len; j0 += Vectorized<T>::size()) {
    row_times_transposed(row, t, d, width, j0).store(out + j0);
  }
}

// softmax_row for one vector of scores (m <= S, 0 < len <= m), in registers,
// with the same operations in the same order: the same bits. (GCC 12 warns
// that the AVX-512 min and max inside softmax_exp read an uninitialised
// register, their _mm512_undefined_ps() pass-through operand, wherever it
// inlines them here; the operand is never read: the mask is all ones.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// Returns the weights, 0 past len.
template <typename T>
Vectorized<T> softmax_vector(const Vectorized<T>& scores, int64_t len, T scale) {
  using V = Vectorized<T>;
  const V x = set_first(V(-std::numeric_limits<T>::infinity()), scores, len);
  const V vmax(horizontal_max(x)), vscale(scale);
  // Lanes past len may hold anything (padding keys' scores): blended away.
  const V e = set_first(V(0), softmax_exp((scores - vmax) * vscale), len);
  const V inv(T(1) / horizontal_sum(e));
  return set_first(V(0), e * inv, len);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// softmax_backward_row for one vector: dx = scale · y ∘ (dy - <dy, y>) over
// the first len lanes, 0 after them; dy's other lanes never count.
template <typename T>
Vectorized<T> softmax_backward_vector(const Vectorized<T>& y, const Vectorized<T>& dy, int64_t len,
                                      T scale) {
  using V = Vectorized<T>;
  const V dot(horizontal_sum(set_first(V(0), y * dy, len)));
  return set_first(V(0), V(scale) * y * (dy - dot), len);
}

template <typename T>
void forward_typed(const HeadInputs<T>& in, double scale, T* wp, T* op) {
  const HeadDims& s = in.s;
  const HeadLengths& L = in.L;
  const T *qp = in.q, *kp = in.k, *vp = in.v, *np = in.noise;
  const T sc = static_cast<T>(scale);
  constexpr int64_t S = Vectorized<T>::size();
  // Claimed an entry's heads at a time (its keys packed once a claim).
  claimed_runs(head_costs(s, L), s.heads, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<T> scores, kept, keys_t;
    kept.resize(s.m);
    alignas(64) T weights_row[S];
    // An entry's keys are packed once for all its heads (whose features sit
    // side by side in each key row: one transposition of the h features
    // rather than one of d per head), and only the keys some row reads: a
    // cache's buffer holds more rows than it has filled (and decoding reads
    // one query a head, so packing would otherwise cost more than the
    // scores).
    int64_t packed = -1, width = 0;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / s.heads, head = t % s.heads;
      if (b != packed) {
        const int64_t entry_longest = longest_of_entry(s, L, b);
        width = transposed_width<T>(entry_longest);
        scores.resize(width);
        keys_t.resize(s.h * width);
        pack_transposed_rows(kp + b * s.m * s.h, s.h, entry_longest, s.h, keys_t.data());
        packed = b;
      }
      int64_t longest = 0;
      for (int64_t i = 0; i < s.n; ++i) longest = std::max(longest, L.at(s, b, head, i));
      const T* head_keys_t = keys_t.data() + head * s.d * width;
      const int64_t e = b * s.heads + head;
      const T* vh = vp + b * s.m * s.h + head * s.d;
      const bool one_vector = longest <= S;
      for (int64_t i = 0; i < s.n; ++i) {
        const int64_t len = L.at(s, b, head, i);
        const T* qi = qp + (b * s.n + i) * s.h + head * s.d;
        T* wi = wp + (e * s.n + i) * s.m;
        const T* p = wi;
        if (one_vector && len > 0) {
          // The weights are read back from a whole vector's store: a store of
          // fewer lanes (into wi) forwards nothing to the loads of the
          // weighted sum, which then wait for it to reach the cache (a fifth
          // of this loop's time when decoding at the book's size).
          const auto w = softmax_vector(row_times_transposed(qi, head_keys_t, s.d, width), len, sc);
          w.store(weights_row);
          store_some(w, wi, std::min(s.m, S));
          if (s.m > S) std::fill(wi + S, wi + s.m, T(0));
          p = weights_row;
        } else {
          row_times_transposed(qi, head_keys_t, s.d, width, len, scores.data());
          softmax_row(scores.data(), wi, len, s.m, sc);
        }
        if (np != nullptr) {
          const T* ni = np + (e * s.n + i) * s.m;
          for (int64_t j = 0; j < len; ++j) kept[j] = p[j] * ni[j];
          p = kept.data();
        }
        weighted_rows(p, 1, vh, s.h, len, s.d, op + (b * s.n + i) * s.h + head * s.d);
      }
    }
  });
}

template <typename T>
void backward_typed(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                    const at::TensorBase& lens, const at::TensorBase& noise, int64_t heads,
                    double scale, const at::TensorBase& weights, const at::TensorBase& dout,
                    const at::TensorBase& dweights, const at::TensorBase& dq,
                    const at::TensorBase& dk, const at::TensorBase& dv) {
  const HeadInputs<T> in(q, k, v, lens, noise, heads);
  const HeadDims& s = in.s;
  const HeadLengths& L = in.L;
  const T *qp = in.q, *kp = in.k, *vp = in.v, *np = in.noise;
  const T* wp = weights.data_ptr<T>();
  const T* gp = dout.data_ptr<T>();
  const T* dwp = dweights.defined() && dweights.numel() > 0 ? dweights.data_ptr<T>() : nullptr;
  T* dqp = dq.data_ptr<T>();
  T* dkp = dk.data_ptr<T>();
  T* dvp = dv.data_ptr<T>();
  const T sc = static_cast<T>(scale);
  parallel_heads(s, L, [&](int64_t b, int64_t head) {
    // One head's dS, and P ∘ noise when there is dropout, (n × m); one row's dP.
    thread_local std::vector<T> ds, kept, dp, values_t;
    const int64_t width = transposed_width<T>(s.m);
    ds.resize(s.n * s.m);
    dp.resize(width);
    values_t.resize(s.d * width);
    if (np != nullptr) kept.resize(s.n * s.m);
    const int64_t e = b * s.heads + head;
    const int64_t column = head * s.d;
    const T* qh = qp + b * s.n * s.h + column;
    const T* kh = kp + b * s.m * s.h + column;
    const T* vh = vp + b * s.m * s.h + column;
    const T* gh = gp + b * s.n * s.h + column;
    const T* we = wp + e * s.n * s.m;
    pack_transposed_rows(vh, s.h, s.m, s.d, values_t.data());
    const bool one_vector = s.m <= Vectorized<T>::size();
    int64_t longest = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t len = L.at(s, b, head, i);
      longest = std::max(longest, len);
      const T* wi = we + i * s.m;
      const T* gi = gh + i * s.h;
      T* dsi = ds.data() + i * s.m;
      if (one_vector) {
        using V = Vectorized<T>;
        V dpv = row_times_transposed(gi, values_t.data(), s.d, width);
        const V p = load_some(wi, s.m);
        if (np != nullptr) {
          const V noise_i = load_some(np + (e * s.n + i) * s.m, s.m);
          dpv = dpv * noise_i;
          store_some(p * noise_i, kept.data() + i * s.m, s.m);
        }
        if (dwp != nullptr) dpv = dpv + load_some(dwp + (e * s.n + i) * s.m, s.m);
        store_some(softmax_backward_vector(p, dpv, len, sc), dsi, s.m);
        weighted_rows(dsi, 1, kh, s.h, len, s.d, dqp + (b * s.n + i) * s.h + column);
        continue;
      }
      row_times_transposed(gi, values_t.data(), s.d, width, len, dp.data());
      if (np != nullptr) {
        const T* ni = np + (e * s.n + i) * s.m;
        T* ki = kept.data() + i * s.m;
        for (int64_t j = 0; j < len; ++j) {
          dp[j] *= ni[j];
          ki[j] = wi[j] * ni[j];
        }
        std::fill(ki + len, ki + s.m, T(0));
      }
      if (dwp != nullptr) {
        const T* dwi = dwp + (e * s.n + i) * s.m;
        for (int64_t j = 0; j < len; ++j) dp[j] += dwi[j];
      }
      softmax_backward_row(wi, dp.data(), dsi, len, s.m, sc);
      weighted_rows(dsi, 1, kh, s.h, len, s.d, dqp + (b * s.n + i) * s.h + column);
    }
    // dS and P are 0 past each row's length, so a key's column sums over
    // every row.
    const T* p = np != nullptr ? kept.data() : we;
    for (int64_t j = 0; j < s.m; ++j) {
      T* dkj = dkp + (b * s.m + j) * s.h + column;
      T* dvj = dvp + (b * s.m + j) * s.h + column;
      if (j >= longest) {
        std::fill(dkj, dkj + s.d, T(0));
        std::fill(dvj, dvj + s.d, T(0));
        continue;
      }
      weighted_rows(ds.data() + j, s.m, qh, s.h, s.n, s.d, dkj);
      weighted_rows(p + j, s.m, gh, s.h, s.n, s.d, dvj);
    }
  });
}

void forward(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
             const at::TensorBase& lens, const at::TensorBase& noise, int64_t heads, double scale,
             const at::TensorBase& weights, const at::TensorBase& out) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::multi_head_attention", [&] {
    forward_typed<scalar_t>(HeadInputs<scalar_t>(q, k, v, lens, noise, heads), scale,
                            weights.data_ptr<scalar_t>(), out.data_ptr<scalar_t>());
  });
}

template <typename T>
void forward_raw(const T* q, const T* k, const T* v, const int64_t* lens, int64_t B, int64_t n,
                 int64_t m, int64_t h, int64_t heads, double scale, T* weights, T* out) {
  forward_typed<T>(HeadInputs<T>(HeadDims{B, n, m, h, heads, h / heads}, lens, q, k, v), scale,
                   weights, out);
}

void backward(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
              const at::TensorBase& lens, const at::TensorBase& noise, int64_t heads, double scale,
              const at::TensorBase& weights, const at::TensorBase& dout,
              const at::TensorBase& dweights, const at::TensorBase& dq, const at::TensorBase& dk,
              const at::TensorBase& dv) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::multi_head_attention_backward", [&] {
    backward_typed<scalar_t>(q, k, v, lens, noise, heads, scale, weights, dout, dweights, dq, dk,
                             dv);
  });
}

}  // namespace

const MultiHeadAttentionKernels& multi_head_attention_kernels() {
  static const MultiHeadAttentionKernels table{&forward, &backward, &forward_raw<float>,
                                               &forward_raw<double>};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
