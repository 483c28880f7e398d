// The flash dot-product attention's forward pass on the CPU: blocks of
// queries against blocks of keys with an online softmax, and the attention
// weights where they are asked for; blocks of a few queries row by row
// (flash_rows-inl.h). Note [Flash attention] in
// dot_product_attention_kernel.cpp. Compiled once per instruction set (Note
// [CPU kernels per instruction set]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/dot_product_attention_kernel_parts.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/flash_rows-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// One thread's state for a block of W = kTileCols query rows, held
// transposed: a query is a column, so the softmax's bookkeeping (maxima,
// sums, corrections) runs on whole vectors of queries.
template <typename T>
struct ForwardScratch {
  static constexpr int64_t W = kTileCols<T>;
  std::unique_ptr<T[]> qt;  // Qᵀ of the block (d × W), zero past its rows
  std::unique_ptr<T[]> st;  // Sᵀ, then Pᵀ, of one key block (kb × W)
  std::unique_ptr<T[]> ot;  // Oᵀ accumulated (dv × W)
  // Per query, its valid keys in the key block: [lower, limit), lower only
  // with bands (Note [Bands of keys]).
  alignas(64) T lower[W], limit[W];
  alignas(64) T row_max[W], row_sum[W];
  std::vector<int64_t> first, len;  // per query: its band (first 0 without bands)
  // The block's keys: from its first visited key, in the key blocks of
  // key_block_end; every row sees [latest, shortest), some up to longest.
  int64_t start = 0, latest = 0, shortest = 0, longest = 0;
  // With weights: each key block's maximum, per query (`blocks` a query).
  int64_t blocks;
  std::vector<T> block_max;
  // A bfloat16 call's: the thread's batch entry `entry`, its keys and values
  // up to its longest length widened to float (once for all its blocks of
  // queries that the thread runs), and a block's queries and output rows.
  int64_t entry = -1;
  std::vector<T> keys, values, rows;

  ForwardScratch(const Dims& s, int64_t kb, int64_t key_blocks)
      : qt(uninitialized_buffer<T>(s.d * W)),
        st(uninitialized_buffer<T>(kb * W)),
        ot(uninitialized_buffer<T>(s.dv * W)),
        first(W),
        len(W),
        blocks(key_blocks),
        block_max(W * key_blocks) {}
};

// Batch entry b's keys and values as the products read them: in place, or
// for bfloat16 the thread's float copies of the rows below the entry's
// longest length.
template <typename T, typename In, typename Out>
std::pair<const T*, const T*> entry_keys_values(const ForwardArgs<T, In, Out>& a,
                                                ForwardScratch<T>& w, int64_t b) {
  const Dims& s = a.s;
  if constexpr (std::is_same_v<In, T>) {
    return {a.k + b * s.m * s.d, a.v + b * s.m * s.dv};
  } else {
    if (w.entry != b) {
      const int64_t rows = longest_length(a.lens, s, b, 0, s.n);
      w.keys.resize(rows * s.d);
      w.values.resize(rows * s.dv);
      widen(a.k + b * s.m * s.d, rows * s.d, w.keys.data());
      widen(a.v + b * s.m * s.dv, rows * s.dv, w.values.data());
      w.entry = b;
    }
    return {w.keys.data(), w.values.data()};
  }
}

// Sᵀ = K Qᵀ for keys [j0, j0 + kc) (Qᵀ already multiplied by scale ·
// kLogBase, Note [Base-2 exponentials in the flash kernel]), their
// exponentials Pᵀ relative to the running maximum of each query, the sums
// and Oᵀ += Vᵀ Pᵀ, with Oᵀ rescaled where a maximum grew (`first`: the
// block's first visited key block, which writes Oᵀ). Entries of keys past a
// query's length, or before its first key, are -inf before the maximum and
// exactly 0 after the exponential, whatever the padding held.
template <typename T, typename In, typename Out>
void attend_key_block(const ForwardArgs<T, In, Out>& a, ForwardScratch<T>& w, const T* k,
                      const T* v, int64_t j0, int64_t kc, bool all_valid, bool first) {
  using V = Vectorized<T>;
  constexpr int64_t S = V::size(), W = ForwardScratch<T>::W;
  static_assert(W == 2 * S, "a block of queries is two vectors");
  const Dims& s = a.s;
  T* st = w.st.get();
  gemm<T>(kc, 1, s.d, k + j0 * s.d, s.d, w.qt.get(), W, 0, st, W, false);
  const V minus_inf(-std::numeric_limits<T>::infinity());
  V max0 = minus_inf, max1 = minus_inf;
  if (all_valid) {
    // Two maxima a half, so that each maximum waits on the one two rows up.
    V max2 = minus_inf, max3 = minus_inf;
    int64_t j = 0;
    for (; j + 2 <= kc; j += 2) {
      max0 = at::vec::maximum(max0, V::loadu(st + j * W));
      max1 = at::vec::maximum(max1, V::loadu(st + j * W + S));
      max2 = at::vec::maximum(max2, V::loadu(st + (j + 1) * W));
      max3 = at::vec::maximum(max3, V::loadu(st + (j + 1) * W + S));
    }
    if (j < kc) {
      max0 = at::vec::maximum(max0, V::loadu(st + j * W));
      max1 = at::vec::maximum(max1, V::loadu(st + j * W + S));
    }
    max0 = at::vec::maximum(max0, max2);
    max1 = at::vec::maximum(max1, max3);
  } else if (a.lens.banded()) {
    // Each query's keys [lower, limit) of the block, exact in T.
    const V low0 = V::loadu(w.lower), low1 = V::loadu(w.lower + S);
    const V lim0 = V::loadu(w.limit), lim1 = V::loadu(w.limit + S);
    for (int64_t j = 0; j < kc; ++j) {
      const V key(static_cast<T>(j));
      const V x0 = V::blendv(minus_inf, V::loadu(st + j * W), (key < lim0) & (key >= low0));
      const V x1 = V::blendv(minus_inf, V::loadu(st + j * W + S), (key < lim1) & (key >= low1));
      x0.store(st + j * W);
      x1.store(st + j * W + S);
      max0 = at::vec::maximum(max0, x0);
      max1 = at::vec::maximum(max1, x1);
    }
  } else {
    // Keys valid for each query in this block: clamp(len - j0, 0, kc), exact in T.
    const V lim0 = V::loadu(w.limit), lim1 = V::loadu(w.limit + S);
    for (int64_t j = 0; j < kc; ++j) {
      const V key(static_cast<T>(j));
      const V x0 = V::blendv(minus_inf, V::loadu(st + j * W), key < lim0);
      const V x1 = V::blendv(minus_inf, V::loadu(st + j * W + S), key < lim1);
      x0.store(st + j * W);
      x1.store(st + j * W + S);
      max0 = at::vec::maximum(max0, x0);
      max1 = at::vec::maximum(max1, x1);
    }
  }
  const V old0 = V::loadu(w.row_max), old1 = V::loadu(w.row_max + S);
  const V new0 = at::vec::maximum(old0, max0);
  const V new1 = at::vec::maximum(old1, max1);
  // A query with no valid key so far keeps -inf and shifts by 0 (its
  // entries are -inf, so their exponentials are 0); an unchanged maximum
  // (-inf included) corrects by exactly 1.
  const V zero(T(0)), one(T(1));
  const V shift0 = V::blendv(new0, zero, new0 == minus_inf);
  const V shift1 = V::blendv(new1, zero, new1 == minus_inf);
  const V corr0 = V::blendv(FlashExp<T>::exp(old0 - shift0), one, old0 == new0);
  const V corr1 = V::blendv(FlashExp<T>::exp(old1 - shift1), one, old1 == new1);
  V sum0 = zero, sum1 = zero;
  for (int64_t j = 0; j < kc; ++j) {
    const V p0 = FlashExp<T>::exp(V::loadu(st + j * W) - shift0);
    const V p1 = FlashExp<T>::exp(V::loadu(st + j * W + S) - shift1);
    p0.store(st + j * W);
    p1.store(st + j * W + S);
    sum0 = sum0 + p0;
    sum1 = sum1 + p1;
  }
  at::vec::fmadd(V::loadu(w.row_sum), corr0, sum0).store(w.row_sum);
  at::vec::fmadd(V::loadu(w.row_sum + S), corr1, sum1).store(w.row_sum + S);
  new0.store(w.row_max);
  new1.store(w.row_max + S);
  // Oᵀ += Vᵀ Pᵀ: V's rows read transposed, Pᵀ one tile of queries wide. The
  // first key block writes Oᵀ, which holds nothing yet to rescale.
  T* ot = w.ot.get();
  if (!first) {
    for (int64_t c = 0; c < s.dv; ++c) {
      (V::loadu(ot + c * W) * corr0).store(ot + c * W);
      (V::loadu(ot + c * W + S) * corr1).store(ot + c * W + S);
    }
  }
  gemm<T, true>(s.dv, 1, kc, v + j0 * s.dv, s.dv, st, W, 0, ot, W, !first);
}

// With weights, a key block's exponentials go out as they are made, relative
// to the query's maximum at the time; once its final maximum and sum are
// known, each block is rescaled by exp(block max - max) / sum, and the keys
// outside its band (before its first key, past its length) are zeroed. The
// weights are the only (B, n, m) memory.
template <typename T, typename In, typename Out>
void write_weights(const ForwardArgs<T, In, Out>& a, const ForwardScratch<T>& w, int64_t b,
                   int64_t i0, int64_t rows, int64_t j0, int64_t kc) {
  constexpr int64_t W = ForwardScratch<T>::W;
  const Dims& s = a.s;
  const T* st = w.st.get();
  for (int64_t c = 0; c < rows; ++c) {
    T* weights = a.weights + (b * s.n + i0 + c) * s.m + j0;
    for (int64_t j = 0; j < kc; ++j) weights[j] = st[j * W + c];
  }
}

template <typename T, typename In, typename Out>
void finish_weights(const ForwardArgs<T, In, Out>& a, const ForwardScratch<T>& w, int64_t b,
                    int64_t i0, int64_t rows) {
  const Dims& s = a.s;
  for (int64_t c = 0; c < rows; ++c) {
    T* weights = a.weights + (b * s.n + i0 + c) * s.m;
    const int64_t first = w.first[c], len = w.len[c];
    // The visited key blocks begin at w.start, at or before the row's first key.
    int64_t block = 0;
    for (int64_t j0 = w.start, j1; j0 < len; j0 = j1, ++block) {
      j1 = key_block_end(a.lens.banded(), j0, a.kb, w.latest, w.shortest, w.longest, 1);
      const int64_t from = std::max(j0, first), to = std::min(j1, len);
      if (from >= to) continue;
      const T factor =
          FlashExp<T>::exp(w.block_max[c * w.blocks + block] - w.row_max[c]) / w.row_sum[c];
      scale_row(weights + from, to - from, factor);
    }
    std::fill(weights, weights + first, T(0));
    std::fill(weights + len, weights + s.m, T(0));
  }
}

// Query rows [i0, i0 + rows) of batch entry b, rows <= W.
template <typename T, typename In, typename Out>
void forward_block(const ForwardArgs<T, In, Out>& a, ForwardScratch<T>& w, int64_t b, int64_t i0,
                   int64_t rows) {
  constexpr int64_t W = ForwardScratch<T>::W;
  const Dims& s = a.s;
  // The block's keys run from its earliest first key to its longest length
  // (key_span); every row sees keys [latest, shortest) of them.
  int64_t longest = 0, shortest = s.m, earliest = s.m, latest = 0;
  for (int64_t c = 0; c < W; ++c) {
    w.len[c] = c < rows ? a.lens.at(b * s.n + i0 + c, s.m) : 0;
    w.first[c] = c < rows ? a.lens.first(b * s.n + i0 + c) : 0;
    longest = std::max(longest, w.len[c]);
    if (c < rows) shortest = std::min(shortest, w.len[c]);
    if (w.len[c] > 0) earliest = std::min(earliest, w.first[c]);
    latest = std::max(latest, w.first[c]);
  }
  w.start = longest == 0 ? 0 : earliest;
  w.latest = latest;
  w.shortest = shortest;
  w.longest = longest;
  if constexpr (std::is_same_v<In, T>) {
    pack_transposed(a.q + (b * s.n + i0) * s.d, rows, s.d, w.qt.get());
  } else {
    w.rows.resize(W * std::max(s.d, s.dv));
    widen(a.q + (b * s.n + i0) * s.d, rows * s.d, w.rows.data());
    pack_transposed(w.rows.data(), rows, s.d, w.qt.get());
  }
  scale_row(w.qt.get(), s.d * W, a.scale * FlashExp<T>::kLogBase);
  const auto [k, v] = entry_keys_values(a, w, b);
  // The first key block writes Oᵀ (attend_key_block); with no valid key at
  // all there is none.
  if (longest == 0) std::fill_n(w.ot.get(), s.dv * W, T(0));
  std::fill_n(w.row_max, W, -std::numeric_limits<T>::infinity());
  std::fill_n(w.row_sum, W, T(0));
  int64_t block = 0;
  for (int64_t j0 = w.start, j1; j0 < longest; j0 = j1, ++block) {
    j1 = key_block_end(a.lens.banded(), j0, a.kb, latest, shortest, longest, 1);
    const int64_t kc = j1 - j0;
    // Every query of the block sees every key of this one (rows past the
    // block's end have length 0, so a partial block always masks).
    const bool all_valid = rows == W && shortest >= j1 && latest <= j0;
    for (int64_t c = 0; c < W; ++c) {
      w.limit[c] = static_cast<T>(std::clamp<int64_t>(w.len[c] - j0, 0, kc));
    }
    if (a.lens.banded()) {
      for (int64_t c = 0; c < W; ++c) {
        w.lower[c] = static_cast<T>(std::clamp<int64_t>(w.first[c] - j0, 0, kc));
      }
    }
    attend_key_block(a, w, k, v, j0, kc, all_valid, j0 == w.start);
    if (a.weights != nullptr) {
      write_weights(a, w, b, i0, rows, j0, kc);
      for (int64_t c = 0; c < rows; ++c) {
        w.block_max[c * w.blocks + block] = w.row_max[c];
      }
    }
  }
  // Oᵀ's columns divided by their sums (a query with no valid key gives 0),
  // then transposed into the output; the log-sum-exps a vector at a time.
  using V = Vectorized<T>;
  constexpr int64_t S = V::size();
  alignas(64) T inv[W];
  for (int64_t c = 0; c < W; ++c) inv[c] = w.len[c] == 0 ? T(0) : T(1) / w.row_sum[c];
  T* ot = w.ot.get();
  const V inv0 = V::loadu(inv), inv1 = V::loadu(inv + S);
  for (int64_t f = 0; f < s.dv; ++f) {
    (V::loadu(ot + f * W) * inv0).store(ot + f * W);
    (V::loadu(ot + f * W + S) * inv1).store(ot + f * W + S);
  }
  if constexpr (std::is_same_v<Out, T>) {
    transpose_into(ot, W, s.dv, s.dv, rows, a.out + (b * s.n + i0) * s.dv, s.dv);
  } else {
    w.rows.resize(W * std::max(s.d, s.dv));
    transpose_into(ot, W, s.dv, s.dv, rows, w.rows.data(), s.dv);
    store_row(w.rows.data(), a.out + (b * s.n + i0) * s.dv, rows * s.dv);
  }
  alignas(64) T lse[W];
  const V to_natural(FlashExp<T>::kInvLogBase);
  at::vec::fmadd(V::loadu(w.row_max), to_natural, V::loadu(w.row_sum).log()).store(lse);
  at::vec::fmadd(V::loadu(w.row_max + S), to_natural, V::loadu(w.row_sum + S).log()).store(lse + S);
  for (int64_t c = 0; c < rows; ++c) {
    a.lse[b * s.n + i0 + c] = w.len[c] == 0 ? -std::numeric_limits<T>::infinity() : lse[c];
  }
  if (a.weights != nullptr) finish_weights(a, w, b, i0, rows);
}

// The forward of a call whose operands are of type In (T, or bfloat16 read
// in place: no weights then) and whose output is of type Out.
template <typename T, typename In, typename Out>
void forward_typed(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                   const at::TensorBase& lens, double scale, const at::TensorBase& out,
                   const at::TensorBase& lse, const at::TensorBase& weights) {
  constexpr int64_t W = ForwardScratch<T>::W;
  const Dims s = dims_of(q, v);
  const RowLengths row_lens = row_lengths(lens, s.n);
  const int64_t blocks = div_up(s.n, W);
  std::vector<int64_t> costs(s.B * blocks);
  // The widest span of keys a block visits: the longest length without bands.
  int64_t widest = 0;
  for (int64_t t = 0; t < s.B * blocks; ++t) {
    const int64_t b = t / blocks, i0 = t % blocks * W;
    const int64_t rows = std::min(W, s.n - i0);
    const KeySpan span = key_span(row_lens, s, b, i0, rows);
    widest = std::max(widest, span.end - span.first);
    // Each visited key costs a row d + dv multiply-adds, and the block's
    // packing and output W rows (macs_to_grain).
    costs[t] = (rows * (span.end - span.first) + (by_rows<T>(rows) ? rows : W)) * macs_to_grain(s);
  }
  const ForwardArgs<T, In, Out> args{s,
                                     q.data_ptr<In>(),
                                     k.data_ptr<In>(),
                                     v.data_ptr<In>(),
                                     row_lens,
                                     T(scale),
                                     out.data_ptr<Out>(),
                                     lse.data_ptr<T>(),
                                     weights.defined() ? weights.data_ptr<T>() : nullptr,
                                     key_block_size<T>(widest, 2)};
  const int64_t splits = key_splits<T>(s, s.B * blocks, widest, args.weights != nullptr);
  if (splits > 1) return forward_split(args, splits);
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    std::optional<ForwardScratch<T>> scratch;
    std::optional<RowScratch<T>> row_scratch;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, i0 = t % blocks * W;
      const int64_t rows = std::min(W, s.n - i0);
      if (by_rows<T>(rows)) {
        if (!row_scratch) row_scratch.emplace(s, args.weights != nullptr);
        for (int64_t i = i0; i < i0 + rows; ++i) forward_row(args, *row_scratch, b, i);
      } else {
        if (!scratch) {
          // key_block_end's cuts add at most two blocks to a span's.
          scratch.emplace(s, args.kb, args.weights != nullptr ? div_up(s.m, args.kb) + 2 : 0);
        }
        forward_block(args, *scratch, b, i0, rows);
      }
    }
  });
}

}  // namespace

void dot_product_attention_forward_bf16(const at::TensorBase& q, const at::TensorBase& k,
                                        const at::TensorBase& v, const at::TensorBase& lens,
                                        double scale, const at::TensorBase& out,
                                        const at::TensorBase& lse) {
  if (out.scalar_type() == at::kFloat) {
    forward_typed<float, c10::BFloat16, float>(q, k, v, lens, scale, out, lse, at::TensorBase());
  } else {
    forward_typed<float, c10::BFloat16, c10::BFloat16>(q, k, v, lens, scale, out, lse,
                                                       at::TensorBase());
  }
}

void dot_product_attention_forward(const at::TensorBase& q, const at::TensorBase& k,
                                   const at::TensorBase& v, const at::TensorBase& lens,
                                   double scale, const at::TensorBase& out,
                                   const at::TensorBase& lse, const at::TensorBase& weights) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::flash_attention_forward", [&] {
    forward_typed<scalar_t, scalar_t, scalar_t>(q, k, v, lens, scale, out, lse, weights);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
