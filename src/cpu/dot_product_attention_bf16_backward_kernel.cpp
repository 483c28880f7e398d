// The bfloat16 flash kernel's backward pass on the CPU: P recomputed block
// by block from lse, parallel over (batch entry, key block), its five
// products in VDPBF16PS on bfloat16 pairs, the rest and every sum in float.
// Note [bfloat16 flash attention] in dot_product_attention_bf16_kernel.cpp.
// Compiled once, for AVX-512 with AVX512-BF16 (src/CMakeLists.txt).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/dot_product_attention_bf16_kernel_parts.h"
#include "cpu/dot_product_attention_kernel.h"
#include "cpu/flash_bf16-inl.h"
#include "cpu/flash_bf16_rows-inl.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using BF16 = c10::BFloat16;
using V = Vectorized<float>;

// The query rows of a block: 12 register tiles, and 48 pairs of queries for
// the products that sum over them (dV and dK).
constexpr int64_t kBf16QueryBlock = 96;
static_assert(kBf16QueryBlock % 2 == 0, "pairs of queries never straddle two query blocks");

struct Bf16BackwardArgs {
  Dims s;
  // Q's and dO's rows in pairs of features, ldk = pairs_of(d) and ldo =
  // pairs_of(dv) a row (the tensors themselves where d and dv are even).
  const Pair *q, *dout;
  int64_t ldk, ldo;
  // Qᵀ and dOᵀ in pairs of consecutive queries, a row per feature: entry
  // b's feature f, pair t at qq[(b · d + f) · n2 + t], doq[(b · dv + f) · n2 + t].
  const Pair *qq, *doq;
  // ldq: d in whole tiles, the row length of dQ's float rows and of kk.
  int64_t n2, ldq;
  const BF16 *k, *v;
  const BF16 *q_rows, *dout_rows;  // Q and dO themselves, for the rows path
  const float *lse, *delta;  // per row: log-normaliser, rowsum(dO ∘ O)
  RowLengths lens;
  float scale;
  float* dq;  // (B, n, ldq): dQ accumulated in float
  BF16 *dk, *dv;
  int64_t kb;  // the key block (bf16_key_block), even
};

// One thread's buffers for a key block of kb keys against query blocks of
// kBf16QueryBlock rows; kbp = kb in whole tiles is the row length of P and dS.
struct Bf16BackwardScratch {
  int64_t kbp;
  std::unique_ptr<Pair[]> kt, vt;  // Kᵀ, Vᵀ in pairs of features, panels of W keys
  std::unique_ptr<Pair[]> kk;      // K in pairs of keys (kb / 2 × ldq)
  std::unique_ptr<float[]> p, dp;  // S and dP (kBf16QueryBlock × kbp)
  std::unique_ptr<Pair[]> pq, dsq;  // P, dS in pairs of queries (kBf16QueryBlock / 2 × kbp)
  std::unique_ptr<Pair[]> dsk;      // dS in pairs of keys (kBf16QueryBlock × kbp / 2)
  std::unique_ptr<float[]> dkt, dvt;  // the key block's dKᵀ (d × kbp) and dVᵀ (dv × kbp)
  std::unique_ptr<float[]> rows;      // dK or dV a row per key (kb × max(d, dv))
  int64_t first[kBf16QueryBlock], len[kBf16QueryBlock];  // first only with bands
  int64_t entry = -1;          // the batch entry whose query blocks' spans are
  std::vector<KeySpan> spans;  // these (key_span)
  float* dq_entry = nullptr;  // where the current task adds to dQ (n × ldq floats)

  explicit Bf16BackwardScratch(const Bf16BackwardArgs& a)
      : kbp(round_up_to_pair_tile(a.kb)),
        kt(uninitialized_buffer<Pair>(a.ldk * kbp)),
        vt(uninitialized_buffer<Pair>(a.ldo * kbp)),
        kk(uninitialized_buffer<Pair>(a.kb / 2 * a.ldq)),
        p(uninitialized_buffer<float>(kBf16QueryBlock * kbp)),
        dp(uninitialized_buffer<float>(kBf16QueryBlock * kbp)),
        pq(uninitialized_buffer<Pair>(kBf16QueryBlock / 2 * kbp)),
        dsq(uninitialized_buffer<Pair>(kBf16QueryBlock / 2 * kbp)),
        dsk(uninitialized_buffer<Pair>(kBf16QueryBlock * kbp / 2)),
        dkt(uninitialized_buffer<float>(a.s.d * kbp)),
        dvt(uninitialized_buffer<float>(a.s.dv * kbp)),
        rows(uninitialized_buffer<float>(a.kb * std::max(a.s.d, a.s.dv))) {}
};

// One row's P = exp(scale · S - lse) and dS = scale · P ∘ (dP - D), for 32
// keys from j: exactly 0 past its `valid` keys and, with kBanded, before its
// first `skip` keys (Note [Bands of keys]), whatever S and dP hold there.
struct RowProbabilities {
  const float *s, *dp;
  int64_t skip, valid;
  float lse, delta;

  template <bool kBanded>
  void at(int64_t j, float scale, __m512 (&p)[2], __m512 (&ds)[2]) const {
    for (int h = 0; h < 2; ++h) {
      const int64_t r = std::clamp<int64_t>(valid - j - 16 * h, 0, 16);
      auto lanes = static_cast<__mmask16>((1u << r) - 1);
      if constexpr (kBanded) {
        const int64_t before = std::clamp<int64_t>(skip - j - 16 * h, 0, 16);
        lanes &= static_cast<__mmask16>(~((1u << before) - 1));
      }
      const __m512 x = _mm512_loadu_ps(s + j + 16 * h);
      p[h] = _mm512_maskz_mov_ps(
          lanes, exp_bf16(_mm512_fmsub_ps(x, _mm512_set1_ps(scale), _mm512_set1_ps(lse))));
      const __m512 g = _mm512_sub_ps(_mm512_loadu_ps(dp + j + 16 * h), _mm512_set1_ps(delta));
      ds[h] = _mm512_maskz_mul_ps(lanes, _mm512_mul_ps(_mm512_set1_ps(scale), p[h]), g);
    }
  }
};

// P and dS of a block's rows, from S (in p) and dP (in dp), for keys [k0,
// width) of the block (k0 and width whole tiles), written as the products
// read them: both in pairs of queries (two rows interleaved, the second 0
// past `rows`) for dV and dK, and dS in pairs of keys (each row's own) for
// dQ. Two rows at a time, nothing written back in float.
template <bool kBanded>
void probabilities(const Bf16BackwardArgs& a, Bf16BackwardScratch& w, int64_t row0, int64_t rows,
                   int64_t j0, int64_t kc, int64_t k0, int64_t width) {
  const int64_t kbp = w.kbp;
  const auto row = [&](int64_t r) {
    const int64_t valid = std::clamp<int64_t>(w.len[r] - j0, 0, kc);
    return RowProbabilities{w.p.get() + r * kbp,
                            w.dp.get() + r * kbp,
                            kBanded ? std::clamp<int64_t>(w.first[r] - j0, 0, valid) : 0,
                            valid,
                            a.lse[row0 + r],
                            a.delta[row0 + r]};
  };
  for (int64_t r = 0; r < rows; r += 2) {
    const RowProbabilities first = row(r);
    // A missing second row: no valid key, so zeros.
    const RowProbabilities second =
        r + 1 < rows ? row(r + 1) : RowProbabilities{first.s, first.dp, 0, 0, 0, 0};
    Pair* pq = w.pq.get() + r / 2 * kbp;
    Pair* dsq = w.dsq.get() + r / 2 * kbp;
    for (int64_t j = k0; j < width; j += 32) {
      __m512 p0[2], ds0[2], p1[2], ds1[2];
      first.at<kBanded>(j, a.scale, p0, ds0);
      second.at<kBanded>(j, a.scale, p1, ds1);
      for (int h = 0; h < 2; ++h) {
        _mm512_storeu_si512(pq + j + 16 * h, interleave_bf16(p0[h], p1[h]));
        _mm512_storeu_si512(dsq + j + 16 * h, interleave_bf16(ds0[h], ds1[h]));
      }
      _mm512_storeu_si512(w.dsk.get() + r * kbp / 2 + j / 2, consecutive_bf16(ds0[0], ds0[1]));
      if (r + 1 < rows) {
        _mm512_storeu_si512(w.dsk.get() + (r + 1) * kbp / 2 + j / 2,
                            consecutive_bf16(ds1[0], ds1[1]));
      }
    }
  }
}

// One query block's contribution to keys [j0 + k0, j0 + kc) of key block
// [j0, j0 + kc) of batch entry b: k0, a whole number of tiles, skips the
// tiles before the query block's earliest first key (0 without bands).
void backward_pair(const Bf16BackwardArgs& a, Bf16BackwardScratch& w, int64_t b, int64_t i0,
                   int64_t rows, int64_t j0, int64_t k0, int64_t kc) {
  const Dims& s = a.s;
  const int64_t kbp = w.kbp, tiles = div_up(kc, W), row0 = b * s.n + i0;
  const int64_t t0 = k0 / W;
  float *p = w.p.get() + k0, *dp = w.dp.get() + k0;
  gemm_bf16(rows, tiles - t0, a.ldk, a.q + row0 * a.ldk, a.ldk, w.kt.get() + t0 * a.ldk * W, W,
            a.ldk * W, p, kbp, false);
  gemm_bf16(rows, tiles - t0, a.ldo, a.dout + row0 * a.ldo, a.ldo, w.vt.get() + t0 * a.ldo * W, W,
            a.ldo * W, dp, kbp, false);
  if (a.lens.banded()) {
    probabilities<true>(a, w, row0, rows, j0, kc, k0, tiles * W);
  } else {
    probabilities<false>(a, w, row0, rows, j0, kc, k0, tiles * W);
  }
  const int64_t rows2 = pairs_of(rows);
  // dVᵀ += dOᵀ P and dKᵀ += Qᵀ dS, over the block's pairs of queries.
  gemm_bf16(s.dv, tiles - t0, rows2, a.doq + b * s.dv * a.n2 + i0 / 2, a.n2, w.pq.get() + k0, kbp,
            W, w.dvt.get() + k0, kbp, true);
  gemm_bf16(s.d, tiles - t0, rows2, a.qq + b * s.d * a.n2 + i0 / 2, a.n2, w.dsq.get() + k0, kbp, W,
            w.dkt.get() + k0, kbp, true);
  // dQ += dS K, in float, in the rows this run adds to.
  gemm_bf16(rows, a.ldq / W, pairs_of(kc - k0), w.dsk.get() + k0 / 2, kbp / 2,
            w.kk.get() + k0 / 2 * a.ldq, a.ldq, W, w.dq_entry + i0 * a.ldq, a.ldq, true);
}

// dK and dV of key block [j0, j0 + kc) of batch entry b, and its share of dQ.
void backward_block(const Bf16BackwardArgs& a, Bf16BackwardScratch& w, int64_t b, int64_t j0, int64_t kc) {
  const Dims& s = a.s;
  const BF16* k = a.k + (b * s.m + j0) * s.d;
  const BF16* v = a.v + (b * s.m + j0) * s.dv;
  transpose_pairs(k, kc, s.d, w.kbp, w.kt.get());
  transpose_pairs(v, kc, s.dv, w.kbp, w.vt.get());
  for (int64_t t = 0; t < pairs_of(kc); ++t) {
    pair_rows(k + 2 * t * s.d, 2 * t + 1 < kc ? k + (2 * t + 1) * s.d : nullptr, s.d,
              w.kk.get() + t * a.ldq, a.ldq);
  }
  std::fill_n(w.dkt.get(), s.d * w.kbp, 0.0f);
  std::fill_n(w.dvt.get(), s.dv * w.kbp, 0.0f);
  const int64_t blocks = div_up(s.n, kBf16QueryBlock);
  if (w.entry != b) {
    w.spans.resize(blocks);
    for (int64_t qb = 0; qb < blocks; ++qb) {
      const int64_t i0 = qb * kBf16QueryBlock;
      w.spans[qb] = key_span(a.lens, s, b, i0, std::min(kBf16QueryBlock, s.n - i0));
    }
    w.entry = b;
  }
  // Only the query blocks whose keys reach the key block, from the tile of
  // their earliest first key (Note [Bands of keys]).
  for (int64_t qb = 0; qb < blocks; ++qb) {
    const KeySpan span = w.spans[qb];
    if (span.end <= j0 || span.first >= j0 + kc) continue;
    const int64_t i0 = qb * kBf16QueryBlock;
    const int64_t rows = std::min(kBf16QueryBlock, s.n - i0);
    block_lengths(a.lens, s.n, s.m, b, i0, rows, w.len, w.first);
    const int64_t k0 = std::max<int64_t>(span.first - j0, 0) / W * W;
    backward_pair(a, w, b, i0, rows, j0, k0, std::min(kc, span.end - j0));
  }
  // dKᵀ and dVᵀ back to a row per key, each rounded to bfloat16 once.
  const auto round_rows = [&](const float* xt, int64_t cols, BF16* out) {
    float* x = w.rows.get();
    transpose_into(xt, w.kbp, cols, cols, kc, x, cols);
    for (int64_t j = 0; j < kc; ++j) round_to_bf16(x + j * cols, cols, out + (b * s.m + j0 + j) * cols);
  };
  round_rows(w.dkt.get(), s.d, a.dk);
  round_rows(w.dvt.get(), s.dv, a.dv);
}

}  // namespace

void dot_product_attention_bf16_backward(const at::TensorBase& q, const at::TensorBase& k,
                                         const at::TensorBase& v, const at::TensorBase& lens,
                                         double scale, const at::TensorBase& out,
                                         const at::TensorBase& dout, const at::TensorBase& lse,
                                         const at::TensorBase& dq, const at::TensorBase& dk,
                                         const at::TensorBase& dv) {
  const Dims s = dims_of(q, v);
  const auto* qd = static_cast<const BF16*>(q.data_ptr());
  const auto* od = static_cast<const BF16*>(out.data_ptr());
  const auto* dod = static_cast<const BF16*>(dout.data_ptr());
  auto* dqd = static_cast<BF16*>(dq.data_ptr());
  auto* dkd = static_cast<BF16*>(dk.data_ptr());
  auto* dvd = static_cast<BF16*>(dv.data_ptr());
  const RowLengths row_lens = row_lengths(lens, s.n);
  std::vector<int64_t> batch_longest(s.B);
  for (int64_t b = 0; b < s.B; ++b) batch_longest[b] = longest_length(row_lens, s, b, 0, s.n);
  const int64_t longest =
      s.B == 0 ? 0 : *std::max_element(batch_longest.begin(), batch_longest.end());
  // Batch entries of a few queries run row by row (bf16_backward_rows), on
  // the tensors themselves: no packed copies.
  const bool by_rows = s.n < kMinBf16Queries;
  const int64_t n2 = pairs_of(s.n), ldq = round_up_to_pair_tile(s.d);
  FeaturePairs qrows(qd, s.B * s.n, s.d), dorows(dod, s.B * s.n, s.dv);
  const auto qq = uninitialized_buffer<Pair>(s.B * s.d * n2);
  const auto doq = uninitialized_buffer<Pair>(s.B * s.dv * n2);
  const auto delta = uninitialized_buffer<float>(s.B * s.n);
  const auto dq_acc = uninitialized_buffer<float>(s.B * s.n * ldq);
  // Per batch entry, in parallel: the packed copies of Q and dO, D, dQ's
  // float rows zeroed, and the rows of dK and dV past the entry's longest
  // length (no task writes them) zeroed.
  const int64_t per_entry = s.n * (2 * s.d + 2 * s.dv) + s.m * (s.d + s.dv);
  at::parallel_for(0, s.B, grain_for(per_entry), [&](int64_t b0, int64_t b1) {
    // Each entry's pairs of queries made as rows of pairs, then transposed.
    const auto pairs = uninitialized_buffer<Pair>(n2 * std::max(s.d, s.dv));
    const auto pack = [&](const BF16* x, int64_t r0, int64_t cols, Pair* out) {
      for (int64_t t = 0; t < n2; ++t) {
        const BF16* first = x + (r0 + 2 * t) * cols;
        pair_rows(first, 2 * t + 1 < s.n ? first + cols : nullptr, cols, pairs.get() + t * cols,
                  cols);
      }
      transpose_pair_matrix(pairs.get(), cols, n2, cols, out, n2);
    };
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * s.n;
      if (!by_rows) {
        qrows.fill(qd, r0, r0 + s.n, s.d);
        dorows.fill(dod, r0, r0 + s.n, s.dv);
        pack(qd, r0, s.d, qq.get() + b * s.d * n2);
        pack(dod, r0, s.dv, doq.get() + b * s.dv * n2);
      }
      for (int64_t i = r0; i < r0 + s.n; ++i) delta[i] = dot_bf16(dod + i * s.dv, od + i * s.dv, s.dv);
      std::fill_n(dq_acc.get() + r0 * ldq, s.n * ldq, 0.0f);
      const int64_t from = b * s.m + batch_longest[b], to = (b + 1) * s.m;
      std::fill(dkd + from * s.d, dkd + to * s.d, BF16(0.0f));
      std::fill(dvd + from * s.dv, dvd + to * s.dv, BF16(0.0f));
    }
  });
  const int64_t kb = bf16_key_block(longest, 4);
  std::vector<int64_t> task_b, task_j0, costs;
  for (int64_t b = 0; b < s.B; ++b) {
    std::vector<KeySpan> spans;
    for (int64_t i0 = 0; i0 < s.n; i0 += kBf16QueryBlock) {
      spans.push_back(key_span(row_lens, s, b, i0, std::min(kBf16QueryBlock, s.n - i0)));
    }
    for (int64_t j0 = 0; j0 < batch_longest[b]; j0 += kb) {
      int64_t cost = std::min(kb, batch_longest[b] - j0);
      for (const KeySpan& span : spans) {
        const int64_t keys = std::min(span.end, j0 + kb) - std::max(span.first, j0);
        cost += std::min(kBf16QueryBlock, s.n) * std::max<int64_t>(keys, 0);
      }
      task_b.push_back(b);
      task_j0.push_back(j0);
      costs.push_back(cost * macs_to_grain(s) * 5 / 2);
    }
  }
  const Bf16BackwardArgs args{s,
                          qrows.data,
                          dorows.data,
                          pairs_of(s.d),
                          pairs_of(s.dv),
                          qq.get(),
                          doq.get(),
                          n2,
                          ldq,
                          static_cast<const BF16*>(k.data_ptr()),
                          static_cast<const BF16*>(v.data_ptr()),
                          qd,
                          dod,
                          lse.data_ptr<float>(),
                          delta.get(),
                          row_lens,
                          static_cast<float>(scale),
                          dq_acc.get(),
                          dkd,
                          dvd,
                          kb};
  // dQ's sums in an order fixed by the work split, as the float kernel's
  // rows path does (Continuations): a run that starts inside a batch entry
  // adds that entry's share into n × ldq floats of its own, added in run
  // order after the parallel region.
  if (!costs.empty()) {
    const std::vector<int64_t> bounds = run_bounds(costs);
    const Continuations shared = continuations(bounds, [&](int64_t t) { return task_b[t]; });
    const int64_t share_size = s.n * ldq;
    const auto shares = shared.size() > 0 ? uninitialized_buffer<float>(shared.size() * share_size)
                                          : std::unique_ptr<float[]>();
    for_each_run(bounds, [&](int64_t r, int64_t t0, int64_t t1) {
      const TileScope tiles;
      std::optional<Bf16BackwardScratch> blocks;
      std::optional<Bf16RowsScratch<Bf16BackwardArgs>> rows;
      if (by_rows) {
        rows.emplace(args);
      } else {
        blocks.emplace(args);
      }
      const int64_t slot = shared.slot_of(r);
      if (slot >= 0) std::fill_n(shares.get() + slot * share_size, share_size, 0.0f);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = task_b[t], j0 = task_j0[t], kc = std::min(kb, batch_longest[b] - j0);
        float* dq_entry = slot >= 0 && b == task_b[t0] ? shares.get() + slot * share_size
                                                       : dq_acc.get() + b * share_size;
        if (by_rows) {
          rows->dq_entry = dq_entry;
          bf16_backward_rows(args, *rows, b, j0, kc);
        } else {
          blocks->dq_entry = dq_entry;
          backward_block(args, *blocks, b, j0, kc);
        }
      }
    });
    add_shares(shared, shares.get(), share_size,
               [&](int64_t b) { return dq_acc.get() + b * share_size; });
  }
  at::parallel_for(0, s.B * s.n, grain_for(s.d), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) round_to_bf16(dq_acc.get() + i * ldq, s.d, dqd + i * s.d);
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
