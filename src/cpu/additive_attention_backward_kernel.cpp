// The fused additive attention's backward kernels: the gradients of the
// scores (recomputing tanh), through the masked softmax and the product with
// the values where the forward had them. Compiled once per instruction set
// (Note [CPU kernels per instruction set]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu/additive_attention_kernel_parts.h"
#include "cpu/additive_blocks-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// y[0:d] += a * x[0:d], vectorised over d.
template <typename T>
void axpy_row(T a, const T* x, T* y, int64_t d) {
  using V = Vectorized<T>;
  const V va(a);
  int64_t c = 0;
  for (; c + V::size() <= d; c += V::size()) {
    at::vec::fmadd(va, V::loadu(x + c), V::loadu(y + c)).store(y + c);
  }
  if (c < d)
    partial_store(at::vec::fmadd(va, partial_load(x + c, d - c), partial_load(y + c, d - c)), y + c,
                  d - c);
}

// g[j] = sum_c go[c] vT[c, j] for keys [0, L) (whole vectors: g and vT rows
// have room up to m_pad): the gradient reaching one query's weights through
// its output. Vectorised over keys, as the scores are.
template <typename T>
void weights_grad_row(const T* go, const T* vT, T* g, int64_t L, int64_t d, int64_t m_pad) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  int64_t j = 0;
  for (; j + S < L; j += 2 * S) {
    V acc0(0), acc1(0);
    for (int64_t c = 0; c < d; ++c) {
      const V gc(go[c]);
      const T* vc = vT + c * m_pad + j;
      acc0 = at::vec::fmadd(gc, V::loadu(vc), acc0);
      acc1 = at::vec::fmadd(gc, V::loadu(vc + S), acc1);
    }
    acc0.store(g + j);
    acc1.store(g + j + S);
  }
  if (j < L) {
    V acc(0);
    for (int64_t c = 0; c < d; ++c)
      acc = at::vec::fmadd(V(go[c]), V::loadu(vT + c * m_pad + j), acc);
    acc.store(g + j);
  }
}

// Queries handled together in backward: they share each key vector's load
// and one read-modify-write of dk per key and hidden unit.
constexpr int64_t kAdditiveQueryBlock = 4;

// One block of Rows queries (rows i0.., their ds in ds[r * m_pad + j], zero
// past each row's length) against keys [0, L) of one batch entry. Hidden
// unit c is the outer loop, so each query's dq and the block's dw stay in
// registers across the keys; the Rows tanh of one key vector are independent,
// which keeps both FMA pipes busy. Rows is a compile-time count so that the
// inner loop unrolls.
template <int Rows, typename T>
void additive_backward_block(const T* qb, const T* kTb, const T* w, const T* ds, T* dqb, T* dkTb,
                             Vectorized<T>* dw_thread, int64_t L, const AdditiveShape& s) {
  using V = Vectorized<T>;
  for (int64_t c = 0; c < s.h; ++c) {
    V qv[Rows], dqv[Rows];
    for (int r = 0; r < Rows; ++r) {
      qv[r] = V(qb[r * s.h + c]);
      dqv[r] = V(0);
    }
    V dwc(0);
    const T* kc = kTb + c * s.m_pad;
    T* dkc = dkTb + c * s.m_pad;
    const V wc(w[c]);
    for (int64_t j = 0; j < L; j += V::size()) {
      const V k = V::loadu(kc + j);
      V dk(0);
      for (int r = 0; r < Rows; ++r) {
        const V dsv = V::loadu(ds + r * s.m_pad + j);
        const V t = vec_tanh(qv[r] + k);
        const V g = dsv - dsv * t * t;
        dqv[r] = dqv[r] + g;
        dk = dk + g;
        dwc = at::vec::fmadd(dsv, t, dwc);
      }
      at::vec::fmadd(dk, wc, V::loadu(dkc + j)).store(dkc + j);
    }
    for (int r = 0; r < Rows; ++r) dqb[r * s.h + c] = w[c] * horizontal_sum(dqv[r]);
    dw_thread[c] = dw_thread[c] + dwc;
  }
}

// additive_backward_block over hidden units: qb the block's queries and kb
// the batch entry's keys, read in place; dkP the run's dk for the batch entry
// in rows of h_pad, without the factor w (applied when it is flushed); dw_run
// the run's dw in lanes of hidden units. A vector of hidden units is the
// outer loop, so each query's dq and the block's dw stay in registers across
// the keys, and no sum is horizontal.
template <int Rows, typename T>
void additive_backward_block_by_hidden(const T* qb, const T* kb, const T* w, const T* ds, T* dqb,
                                       T* dkP, T* dw_run, int64_t L, const AdditiveShape& s) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  for (int64_t c = 0; c < s.h_pad; c += S) {
    const int64_t width = std::min(S, s.h - c);
    V qv[Rows], dqv[Rows];
    for (int r = 0; r < Rows; ++r) {
      qv[r] = load_hidden(qb + r * s.h, c, s.h);
      dqv[r] = V(0);
    }
    V dwc(0);
    for (int64_t j = 0; j < L; ++j) {
      const V k = load_hidden(kb + j * s.h, c, s.h);
      V dk(0);
      for (int r = 0; r < Rows; ++r) {
        const V dsv(ds[r * s.m_pad + j]);
        const V t = vec_tanh(qv[r] + k);
        const V g = dsv - dsv * t * t;
        dqv[r] = dqv[r] + g;
        dk = dk + g;
        dwc = at::vec::fmadd(dsv, t, dwc);
      }
      T* dkc = dkP + j * s.h_pad + c;
      (V::loadu(dkc) + dk).store(dkc);
    }
    const V wc = load_hidden(w, c, s.h);
    for (int r = 0; r < Rows; ++r) {
      if (width == S) {
        (dqv[r] * wc).store(dqb + r * s.h + c);
      } else {
        partial_store(dqv[r] * wc, dqb + r * s.h + c, width);
      }
    }
    (V::loadu(dw_run + c) + dwc).store(dw_run + c);
  }
}

// Per batch entry b, for every query i and valid key j, with t = tanh(q_i + k_j)
// and g = ds_ij (1 - t²):  dq_i += w g,  dk_j += w g,  dw += ds_ij t.
// w is factored out of the sums over j and i. Tasks are blocks of R queries,
// split over threads by cost (rows times valid keys); each task owns its dq
// rows, adds dk into a per-thread buffer for its batch entry that is added to
// dk when the thread moves on, and dw gets one accumulator per run. A run
// that starts inside a batch entry keeps that entry's buffers as its share,
// added after the others in run order (Continuations), so that the sums come
// out the same from call to call.
//
// With values (softmax only), the weights' gradient of a row is first made
// from the output's, go_i · v_j (plus dout, a gradient reaching the weights
// themselves, when given), and dv_j += y_ij go_i goes into a per-thread
// buffer flushed with dk's.
template <typename T>
void additive_backward(const T* q, const T* k, const T* w, const T* y, const T* dout, T* dq, T* dk,
                       T* dw, AdditiveShape s, RowLengths lens, bool softmax,
                       ValuesArgs<T> values = {}) {
  using V = Vectorized<T>;
  constexpr int64_t R = kAdditiveQueryBlock;
  const int64_t d = values.d;
  s.by_hidden = by_hidden_units<T>(s, lens, softmax);
  std::fill(dk, dk + s.B * s.m * s.h, T(0));
  if (values.on) std::fill(values.dv, values.dv + s.B * s.m * d, T(0));
  const int64_t blocks = (s.n + R - 1) / R;
  auto longest = [&](int64_t b, int64_t i0, int64_t rows) {
    int64_t L = 0;
    for (int64_t r = 0; r < rows; ++r) {
      L = std::max(L, softmax ? lens.at(b * s.n + i0 + r, s.m) : s.m);
    }
    return L;
  };
  std::vector<int64_t> costs(s.B * blocks);
  for (int64_t t = 0; t < s.B * blocks; ++t) {
    const int64_t b = t / blocks, i0 = t % blocks * R, rows = std::min(R, s.n - i0);
    // Per row: tanh and their gradient (about two tanh's worth) for each key
    // vector and hidden unit; with values the weights' gradient (d FMAs per
    // key vector lane) and dv (d per valid key).
    const int64_t L = longest(b, i0, rows), Lv = whole_vectors<T>(L);
    const int64_t tanh_lanes = s.by_hidden ? L * s.h_pad : Lv * s.h;
    costs[t] = rows * (2 * tanh_lanes + (Lv + L) * d / kFmaPerTanh + s.m + kRowCost);
  }
  const std::vector<int64_t> bounds = run_bounds(costs);
  const int64_t runs = static_cast<int64_t>(bounds.size()) - 1;
  // dw per run: over keys a vector per hidden unit, summed across at the
  // end; over hidden units, lanes of hidden units.
  std::vector<V> dw_acc(s.by_hidden ? 0 : runs * s.h, V(0));
  std::vector<T> dw_hidden(s.by_hidden ? runs * s.h_pad : 0, T(0));
  const Continuations shared = continuations(bounds, [&](int64_t t) { return t / blocks; });
  // Each continuation's share of dk and of dv, in their layouts.
  const int64_t dk_size = s.m * s.h, dv_size = s.m * d;
  std::vector<T> dk_shares(shared.size() * dk_size), dv_shares(shared.size() * dv_size);
  for_each_run(bounds, [&](int64_t run, int64_t t0, int64_t t1) {
    V* dw_thread = s.by_hidden ? nullptr : dw_acc.data() + run * s.h;
    const int64_t slot = shared.slot_of(run);
    // Over keys, kT and dk_local are the batch entry's keys and dk
    // transposed, rows of m_pad; over hidden units the keys are read as
    // they are, and dk_local is rows of h_pad without the factor w.
    std::vector<T> ds(R * s.m_pad), kT(s.by_hidden ? 0 : s.h * s.m_pad);
    std::vector<T> dk_local(s.by_hidden ? s.m * s.h_pad : s.h * s.m_pad);
    std::vector<T> dy_row(values.on ? s.m_pad : 0), vT(values.on ? d * s.m_pad : 0);
    std::vector<T> dv_local(values.on ? s.m * d : 0);
    // The batch entry kT, vT, dk_local and dv_local belong to; dk_local is
    // dk's transpose, added back transposed.
    int64_t batch = -1;
    // Only this run adds into its batch entries' rows of dk and dv, or
    // into its share (which starts at zero, as they do).
    auto flush = [&] {
      if (batch < 0) return;
      const bool share = slot >= 0 && batch == shared.entry[slot];
      T* dkb = share ? dk_shares.data() + slot * dk_size : dk + batch * dk_size;
      for (int64_t j = 0; j < s.m; ++j) {
        if (s.by_hidden) {
          for (int64_t c = 0; c < s.h; ++c) dkb[j * s.h + c] += w[c] * dk_local[j * s.h_pad + c];
        } else {
          for (int64_t c = 0; c < s.h; ++c) dkb[j * s.h + c] += dk_local[c * s.m_pad + j];
        }
      }
      T* dvb = share ? dv_shares.data() + slot * dv_size : values.dv + batch * dv_size;
      for (size_t e = 0; e < dv_local.size(); ++e) dvb[e] += dv_local[e];
    };
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, i0 = t % blocks * R, rows = std::min(R, s.n - i0);
      if (b != batch) {
        flush();
        std::fill(dk_local.begin(), dk_local.end(), T(0));
        std::fill(dv_local.begin(), dv_local.end(), T(0));
        batch = b;
        if (!s.by_hidden) transpose_padded(k + b * s.m * s.h, kT.data(), s.m, s.h, s.m_pad);
        if (values.on) transpose_padded(values.v + b * s.m * d, vT.data(), s.m, d, s.m_pad);
      }
      const int64_t L = longest(b, i0, rows);
      std::fill(ds.begin(), ds.end(), T(0));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = b * s.n + i0 + r, Lr = softmax ? lens.at(row, s.m) : s.m;
        T* dsr = ds.data() + r * s.m_pad;
        if (values.on) {
          const T* go = values.dout + row * d;
          weights_grad_row(go, vT.data(), dy_row.data(), Lr, d, s.m_pad);
          if (dout != nullptr) {
            for (int64_t j = 0; j < Lr; ++j) dy_row[j] += dout[row * s.m + j];
          }
          softmax_backward_row(y + row * s.m, dy_row.data(), dsr, Lr, s.m, T(1));
          for (int64_t j = 0; j < Lr; ++j)
            axpy_row(y[row * s.m + j], go, dv_local.data() + j * d, d);
        } else if (softmax) {
          softmax_backward_row(y + row * s.m, dout + row * s.m, dsr, Lr, s.m, T(1));
        } else {
          std::copy(dout + row * s.m, dout + (row + 1) * s.m, dsr);
        }
      }
      const int64_t first = (b * s.n + i0) * s.h;
      const auto block = [&](auto rows_constant) {
        constexpr int kRows = decltype(rows_constant)::value;
        if (s.by_hidden) {
          additive_backward_block_by_hidden<kRows>(q + first, k + b * s.m * s.h, w, ds.data(),
                                                   dq + first, dk_local.data(),
                                                   dw_hidden.data() + run * s.h_pad, L, s);
        } else {
          additive_backward_block<kRows>(q + first, kT.data(), w, ds.data(), dq + first,
                                         dk_local.data(), dw_thread, L, s);
        }
      };
      switch (rows) {
        case 1: block(std::integral_constant<int, 1>{}); break;
        case 2: block(std::integral_constant<int, 2>{}); break;
        case 3: block(std::integral_constant<int, 3>{}); break;
        default: block(std::integral_constant<int, R>{}); break;
      }
    }
    flush();
  });
  add_shares(shared, dk_shares.data(), dk_size, [&](int64_t b) { return dk + b * dk_size; });
  if (values.on) {
    add_shares(shared, dv_shares.data(), dv_size,
               [&](int64_t b) { return values.dv + b * dv_size; });
  }
  for (int64_t c = 0; c < s.h; ++c) {
    if (s.by_hidden) {
      T total(0);
      for (int64_t r = 0; r < runs; ++r) total += dw_hidden[r * s.h_pad + c];
      dw[c] = total;
    } else {
      V total(0);
      for (int64_t r = 0; r < runs; ++r) total = total + dw_acc[r * s.h + c];
      dw[c] = horizontal_sum(total);
    }
  }
}

}  // namespace

void additive_attention_backward(const at::TensorBase& q, const at::TensorBase& k,
                                 const at::TensorBase& w, const at::TensorBase& y,
                                 const at::TensorBase& dout, const at::TensorBase& dq,
                                 const at::TensorBase& dk, const at::TensorBase& dw,
                                 const at::TensorBase& lens, bool softmax) {
  const RowLengths L = row_lengths(lens, q.size(1));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::additive_attention_backward", [&] {
    additive_backward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                      y.data_ptr<scalar_t>(), dout.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(),
                      dk.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(), shape_of<scalar_t>(q, y), L,
                      softmax);
  });
}

void additive_attention_backward_values(const at::TensorBase& q, const at::TensorBase& k,
                                        const at::TensorBase& w, const at::TensorBase& v,
                                        const at::TensorBase& y, const at::TensorBase& dout,
                                        const at::TensorBase& dy, const at::TensorBase& dq,
                                        const at::TensorBase& dk, const at::TensorBase& dw,
                                        const at::TensorBase& dv, const at::TensorBase& lens) {
  const RowLengths L = row_lengths(lens, q.size(1));
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::additive_attention_backward", [&] {
    ValuesArgs<scalar_t> values;
    values.on = true;
    values.v = v.data_ptr<scalar_t>();
    values.dout = dout.data_ptr<scalar_t>();
    values.dv = dv.data_ptr<scalar_t>();
    values.d = v.size(2);
    additive_backward(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                      y.data_ptr<scalar_t>(), dy.defined() ? dy.data_ptr<scalar_t>() : nullptr,
                      dq.data_ptr<scalar_t>(), dk.data_ptr<scalar_t>(), dw.data_ptr<scalar_t>(),
                      shape_of<scalar_t>(q, y), L, /*softmax=*/true, values);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
