// The fused additive attention's forward kernels: the scores
// w_vᵀ tanh(q_i + k_j), optionally with the masked softmax folded in and the
// product with the values in the same pass over each row, and tanh
// elementwise. Compiled once per instruction set (Note [CPU kernels per
// instruction set]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "cpu/additive_attention_kernel_parts.h"
#include "cpu/additive_blocks-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

template <typename T>
void tanh_kernel(const T* x, T* y, int64_t n) {
  using V = Vectorized<T>;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + V::size() <= end; i += V::size()) vec_tanh(V::loadu(x + i)).store(y + i);
    if (i < end) partial_store(vec_tanh(partial_load(x + i, end - i)), y + i, end - i);
  });
}

// Scores of one query against keys [0, L): vectorised over keys, so each lane
// accumulates its own key's sum over h and no horizontal reduction is needed.
template <typename T>
void additive_scores_row(const T* q, const T* kT, const T* w, T* scores, int64_t L,
                         const AdditiveShape& s) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  int64_t j = 0;
  // Two key vectors at a time: two independent tanh chains per hidden unit.
  for (; j + S < L; j += 2 * S) {
    V acc0(0), acc1(0);
    for (int64_t c = 0; c < s.h; ++c) {
      const V qc(q[c]), wc(w[c]);
      const T* kc = kT + c * s.m_pad + j;
      acc0 = at::vec::fmadd(wc, vec_tanh(qc + V::loadu(kc)), acc0);
      acc1 = at::vec::fmadd(wc, vec_tanh(qc + V::loadu(kc + S)), acc1);
    }
    acc0.store(scores + j);
    acc1.store(scores + j + S);
  }
  if (j < L) {
    V acc(0);
    for (int64_t c = 0; c < s.h; ++c) {
      acc = at::vec::fmadd(V(w[c]), vec_tanh(V(q[c]) + V::loadu(kT + c * s.m_pad + j)), acc);
    }
    acc.store(scores + j);
  }
}

// additive_scores_row over hidden units, for q, keys and w_v read in place
// (kb: the batch entry's keys, rows of h). Two keys at a time, for
// independent tanh chains when h is one vector.
template <typename T>
void additive_scores_row_by_hidden(const T* q, const T* kb, const T* w, T* scores, int64_t L,
                                   int64_t h) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  int64_t j = 0;
  for (; j + 1 < L; j += 2) {
    const T* k0 = kb + j * h;
    const T* k1 = k0 + h;
    V acc0(0), acc1(0);
    for (int64_t c = 0; c < h; c += S) {
      const V qc = load_hidden(q, c, h), wc = load_hidden(w, c, h);
      acc0 = at::vec::fmadd(wc, vec_tanh(qc + load_hidden(k0, c, h)), acc0);
      acc1 = at::vec::fmadd(wc, vec_tanh(qc + load_hidden(k1, c, h)), acc1);
    }
    scores[j] = horizontal_sum(acc0);
    scores[j + 1] = horizontal_sum(acc1);
  }
  if (j < L) {
    const T* k0 = kb + j * h;
    V acc(0);
    for (int64_t c = 0; c < h; c += S) {
      acc = at::vec::fmadd(load_hidden(w, c, h),
                           vec_tanh(load_hidden(q, c, h) + load_hidden(k0, c, h)), acc);
    }
    scores[j] = horizontal_sum(acc);
  }
}

// o[0:d] = sum_{j < L} p[j] v[j, 0:d]: one query's output. Up to four
// vectors of o stay in registers across the keys.
template <typename T>
void weighted_values_row(const T* p, const T* v, T* o, int64_t L, int64_t d) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  int64_t c = 0;
  for (; c + 4 * S <= d; c += 4 * S) {
    V a0(0), a1(0), a2(0), a3(0);
    for (int64_t j = 0; j < L; ++j) {
      const V pj(p[j]);
      const T* vj = v + j * d + c;
      a0 = at::vec::fmadd(pj, V::loadu(vj), a0);
      a1 = at::vec::fmadd(pj, V::loadu(vj + S), a1);
      a2 = at::vec::fmadd(pj, V::loadu(vj + 2 * S), a2);
      a3 = at::vec::fmadd(pj, V::loadu(vj + 3 * S), a3);
    }
    a0.store(o + c);
    a1.store(o + c + S);
    a2.store(o + c + 2 * S);
    a3.store(o + c + 3 * S);
  }
  for (; c < d; c += S) {
    const int64_t width = std::min(S, d - c);
    V a(0);
    for (int64_t j = 0; j < L; ++j) {
      const T* vj = v + j * d + c;
      a = at::vec::fmadd(V(p[j]), width == S ? V::loadu(vj) : partial_load(vj, width), a);
    }
    if (width == S) {
      a.store(o + c);
    } else {
      partial_store(a, o + c, width);
    }
  }
}

template <typename T>
void additive_forward(const T* q, const T* k, const T* w, T* out, AdditiveShape s, RowLengths lens,
                      bool softmax, ValuesArgs<T> values = {}) {
  s.by_hidden = by_hidden_units<T>(s, lens, softmax);
  std::vector<int64_t> costs(s.B * s.n);
  for (int64_t r = 0; r < s.B * s.n; ++r) {
    const int64_t L = softmax ? lens.at(r, s.m) : s.m;
    costs[r] = (s.by_hidden ? lanes_by_hidden(L, s) : lanes_by_keys<T>(L, s)) +
               L * values.d / kFmaPerTanh + s.m + kRowCost;
  }
  parallel_runs(costs, [&](int64_t begin, int64_t end) {
    // Over keys, the batch entry's keys transposed (kT); over hidden units,
    // the keys as they are.
    std::vector<T> scores(s.m_pad), kT(s.by_hidden ? 0 : s.h * s.m_pad);
    int64_t batch = -1;  // the batch entry kT holds
    for (int64_t r = begin; r < end; ++r) {
      const int64_t L = softmax ? lens.at(r, s.m) : s.m;
      if (s.by_hidden) {
        additive_scores_row_by_hidden(q + r * s.h, k + r / s.n * s.m * s.h, w, scores.data(), L,
                                      s.h);
      } else {
        if (r / s.n != batch) {
          batch = r / s.n;
          transpose_padded(k + batch * s.m * s.h, kT.data(), s.m, s.h, s.m_pad);
        }
        additive_scores_row(q + r * s.h, kT.data(), w, scores.data(), L, s);
      }
      T* row = out + r * s.m;
      if (softmax) {
        softmax_row(scores.data(), row, L, s.m, T(1));
      } else {
        std::copy(scores.begin(), scores.begin() + s.m, row);
      }
      if (values.on) {
        weighted_values_row(row, values.v + (r / s.n) * s.m * values.d, values.o + r * values.d, L,
                            values.d);
      }
    }
  });
}

}  // namespace

void additive_attention_forward(const at::TensorBase& q, const at::TensorBase& k,
                                const at::TensorBase& w, const at::TensorBase& out,
                                const at::TensorBase& lens, bool softmax) {
  const RowLengths L = row_lengths(lens, q.size(1));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::additive_attention", [&] {
    additive_forward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                     out.data_ptr<scalar_t>(), shape_of<scalar_t>(q, out), L, softmax);
  });
}

void additive_attention_forward_values(const at::TensorBase& q, const at::TensorBase& k,
                                       const at::TensorBase& w, const at::TensorBase& v,
                                       const at::TensorBase& y, const at::TensorBase& o,
                                       const at::TensorBase& lens) {
  const RowLengths L = row_lengths(lens, q.size(1));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::additive_attention", [&] {
    ValuesArgs<scalar_t> values;
    values.on = true;
    values.v = v.data_ptr<scalar_t>();
    values.o = o.data_ptr<scalar_t>();
    values.d = v.size(2);
    additive_forward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                     y.data_ptr<scalar_t>(), shape_of<scalar_t>(q, y), L, /*softmax=*/true, values);
  });
}

void additive_attention_tanh(const at::TensorBase& x, const at::TensorBase& y) {
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "d2l::tanh", [&] {
    tanh_kernel(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), x.numel());
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
