// The bfloat16 flash kernel's forward pass on the CPU: blocks of queries
// against blocks of keys with an online softmax, the products in VDPBF16PS
// on bfloat16 pairs and everything else in float. Note [bfloat16 flash
// attention] in dot_product_attention_bf16_kernel.cpp. Compiled once, for
// AVX-512 with AVX512-BF16 (src/CMakeLists.txt).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "cpu/dot_product_attention_bf16_kernel_parts.h"
#include "cpu/dot_product_attention_kernel.h"
#include "cpu/flash_bf16_rows-inl.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/flash_bf16-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using BF16 = c10::BFloat16;
using V = Vectorized<float>;


struct Bf16ForwardArgs {
  Dims s;
  const BF16* q;
  // K's rows in pairs of features, ldk = pairs_of(d) a row: the tensor
  // itself where d is even, else a copy with a zero after each row.
  const Pair* k;
  int64_t ldk;
  // V, packed by each thread for the entries it runs (pack_values): entry
  // b's rows below longest[b]; m2 = pairs_of(m), a row of its Vᵀ.
  const BF16* v;
  const int64_t* longest;
  int64_t m2;
  RowLengths lens;
  float scale;
  BF16* out;
  float* lse;
  int64_t kb;  // the key block: even
};

// Pairs of keys that pack_values makes into rows before transposing them:
// 32 KiB a thread at dv = 128. Rows of every pair of an entry (2 MiB at m =
// 8192), beside a Vᵀ of every entry made before the threads start, were
// freed with the call's other buffers, past the point where glibc gives its
// heap back to Linux, and page-faulted in again at the next call.
constexpr int64_t kPackedPairs = 64;

// Batch entry b's values below `longest` as Vᵀ in pairs of consecutive keys
// (the last one paired with a zero where `longest` is odd: no key past it
// is read) into vt (dv rows of m2 pairs), made kPackedPairs at a time as
// rows of pairs in `rows` (kPackedPairs × dv) and transposed.
void pack_values(const BF16* v, const Dims& s, int64_t b, int64_t longest, int64_t m2, Pair* rows,
                 Pair* vt) {
  const int64_t pairs = pairs_of(longest);
  for (int64_t t0 = 0; t0 < pairs; t0 += kPackedPairs) {
    const int64_t count = std::min(kPackedPairs, pairs - t0);
    for (int64_t t = t0; t < t0 + count; ++t) {
      const BF16* first = v + (b * s.m + 2 * t) * s.dv;
      pair_rows(first, 2 * t + 1 < longest ? first + s.dv : nullptr, s.dv, rows + (t - t0) * s.dv,
                s.dv);
    }
    transpose_pair_matrix(rows, s.dv, count, s.dv, vt + t0, m2);
  }
}

// Batch entry b's keys below `longest` in rows of pairs of features (ldk
// pairs), where d is odd.
void pack_odd_keys(const BF16* k, const Dims& s, int64_t b, int64_t longest, int64_t ldk,
                   Pair* kp) {
  for (int64_t j = 0; j < longest; ++j) {
    const BF16* row = k + (b * s.m + j) * s.d;
    Pair* out = kp + (b * s.m + j) * ldk;
    for (int64_t c = 0; c < ldk; ++c) {
      out[c] = make_pair(row[2 * c], 2 * c + 1 < s.d ? row[2 * c + 1] : BF16(0.0f));
    }
  }
}

// One thread's state for a block of W query rows, held transposed (a query
// is a column), as the float kernel's Bf16ForwardScratch.
struct Bf16ForwardScratch {
  std::unique_ptr<Pair[]> qt;   // Qᵀ of the block in pairs of features (ldk × W)
  std::unique_ptr<float[]> st;  // Sᵀ of one key block (kb × W)
  std::unique_ptr<Pair[]> pt;   // Pᵀ in pairs of keys (kb / 2 × W)
  std::unique_ptr<float[]> ot;  // Oᵀ accumulated (dv × W)
  std::unique_ptr<Pair[]> ob;   // Oᵀ normalised, rounded, in pairs of features (dv / 2 × W)
  // Vᵀ of batch entry `entry` in pairs of consecutive keys, a row of m2
  // pairs per feature (pack_values), and the rows it is made from.
  int64_t entry = -1;
  std::unique_ptr<Pair[]> vt, rows;
  // Per query, its valid keys in the key block: [lower, limit), lower only
  // with bands (Note [Bands of keys]).
  alignas(64) float lower[W], limit[W];
  alignas(64) float row_max[W], row_sum[W];
  int64_t first[W], len[W];  // per query: its band (first only with bands)

  explicit Bf16ForwardScratch(const Bf16ForwardArgs& a)
      : qt(uninitialized_buffer<Pair>(a.ldk * W)),
        st(uninitialized_buffer<float>(a.kb * W)),
        pt(uninitialized_buffer<Pair>(a.kb / 2 * W)),
        ot(uninitialized_buffer<float>(a.s.dv * W)),
        ob(uninitialized_buffer<Pair>(pairs_of(a.s.dv) * W)),
        vt(uninitialized_buffer<Pair>(a.s.dv * a.m2)),
        rows(uninitialized_buffer<Pair>(kPackedPairs * a.s.dv)) {}
};

// Sᵀ = K Qᵀ for keys [j0, j0 + kc), the exponentials relative to each
// query's running maximum, their sums, and Oᵀ += Vᵀ Pᵀ with Pᵀ rounded to
// bfloat16 pairs of keys, Oᵀ rescaled where a maximum grew. The masking is
// the float kernel's (attend_key_block): entries past a query's length, or
// before its first key, are -inf before the maximum and exactly 0 after the
// exponential.
void attend_key_block(const Bf16ForwardArgs& a, Bf16ForwardScratch& w, int64_t b, int64_t j0, int64_t kc,
                      bool all_valid) {
  constexpr int64_t S = V::size();
  const Dims& s = a.s;
  float* st = w.st.get();
  gemm_bf16(kc, 1, a.ldk, a.k + (b * s.m + j0) * a.ldk, a.ldk, w.qt.get(), W, 0, st, W, false);
  // Maxima with max_ps, not at::vec::maximum: a NaN score makes its
  // exponential NaN and so its row's sum, whether the maximum keeps it or not.
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 max0 = minus_inf, max1 = minus_inf;
  if (all_valid) {
    for (int64_t j = 0; j < kc; ++j) {
      max0 = _mm512_max_ps(max0, _mm512_loadu_ps(st + j * W));
      max1 = _mm512_max_ps(max1, _mm512_loadu_ps(st + j * W + S));
    }
  } else if (a.lens.banded()) {
    const __m512 low0 = _mm512_loadu_ps(w.lower), low1 = _mm512_loadu_ps(w.lower + S);
    const __m512 lim0 = _mm512_loadu_ps(w.limit), lim1 = _mm512_loadu_ps(w.limit + S);
    for (int64_t j = 0; j < kc; ++j) {
      const __m512 key = _mm512_set1_ps(static_cast<float>(j));
      const __mmask16 in0 =
          _mm512_cmp_ps_mask(key, lim0, _CMP_LT_OQ) & _mm512_cmp_ps_mask(key, low0, _CMP_GE_OQ);
      const __mmask16 in1 =
          _mm512_cmp_ps_mask(key, lim1, _CMP_LT_OQ) & _mm512_cmp_ps_mask(key, low1, _CMP_GE_OQ);
      const __m512 x0 = _mm512_mask_loadu_ps(minus_inf, in0, st + j * W);
      const __m512 x1 = _mm512_mask_loadu_ps(minus_inf, in1, st + j * W + S);
      _mm512_storeu_ps(st + j * W, x0);
      _mm512_storeu_ps(st + j * W + S, x1);
      max0 = _mm512_max_ps(max0, x0);
      max1 = _mm512_max_ps(max1, x1);
    }
  } else {
    const __m512 lim0 = _mm512_loadu_ps(w.limit), lim1 = _mm512_loadu_ps(w.limit + S);
    for (int64_t j = 0; j < kc; ++j) {
      const __m512 key = _mm512_set1_ps(static_cast<float>(j));
      const __m512 x0 = _mm512_mask_loadu_ps(minus_inf, _mm512_cmp_ps_mask(key, lim0, _CMP_LT_OQ),
                                             st + j * W);
      const __m512 x1 = _mm512_mask_loadu_ps(minus_inf, _mm512_cmp_ps_mask(key, lim1, _CMP_LT_OQ),
                                             st + j * W + S);
      _mm512_storeu_ps(st + j * W, x0);
      _mm512_storeu_ps(st + j * W + S, x1);
      max0 = _mm512_max_ps(max0, x0);
      max1 = _mm512_max_ps(max1, x1);
    }
  }
  const V vscale(a.scale);
  const V old0 = V::loadu(w.row_max), old1 = V::loadu(w.row_max + S);
  const V new0 = _mm512_max_ps(old0, _mm512_mul_ps(max0, vscale));
  const V new1 = _mm512_max_ps(old1, _mm512_mul_ps(max1, vscale));
  const V zero(0.0f), one(1.0f), vminus_inf(minus_inf);
  const V shift0 = V::blendv(new0, zero, new0 == vminus_inf);
  const V shift1 = V::blendv(new1, zero, new1 == vminus_inf);
  const V corr0 = V::blendv(exp_bf16(old0 - shift0), one, old0 == new0);
  const V corr1 = V::blendv(exp_bf16(old1 - shift1), one, old1 == new1);
  const V neg0 = zero - shift0, neg1 = zero - shift1;
  // Two keys at a time: their exponentials, for 2 × 16 queries, make the
  // pairs of Pᵀ. A last, odd key is paired with a zero.
  V sum0 = zero, sum1 = zero;
  Pair* pt = w.pt.get();
  for (int64_t j = 0; j < kc; j += 2) {
    const bool second = j + 1 < kc;
    const V p00 = exp_bf16(at::vec::fmadd(V::loadu(st + j * W), vscale, neg0));
    const V p01 = exp_bf16(at::vec::fmadd(V::loadu(st + j * W + S), vscale, neg1));
    const V p10 =
        second ? V(exp_bf16(at::vec::fmadd(V::loadu(st + (j + 1) * W), vscale, neg0))) : zero;
    const V p11 =
        second ? V(exp_bf16(at::vec::fmadd(V::loadu(st + (j + 1) * W + S), vscale, neg1))) : zero;
    sum0 = sum0 + p00 + p10;
    sum1 = sum1 + p01 + p11;
    _mm512_storeu_si512(pt + j / 2 * W, interleave_bf16(p00, p10));
    _mm512_storeu_si512(pt + j / 2 * W + S, interleave_bf16(p01, p11));
  }
  at::vec::fmadd(V::loadu(w.row_sum), corr0, sum0).store(w.row_sum);
  at::vec::fmadd(V::loadu(w.row_sum + S), corr1, sum1).store(w.row_sum + S);
  new0.store(w.row_max);
  new1.store(w.row_max + S);
  float* ot = w.ot.get();
  for (int64_t c = 0; c < s.dv; ++c) {
    (V::loadu(ot + c * W) * corr0).store(ot + c * W);
    (V::loadu(ot + c * W + S) * corr1).store(ot + c * W + S);
  }
  // Oᵀ += Vᵀ Pᵀ: a row of Vᵀ per feature, Pᵀ one tile of queries wide.
  gemm_bf16(s.dv, 1, pairs_of(kc), w.vt.get() + j0 / 2, a.m2, pt, W, 0, ot, W, true);
}

// Query rows [i0, i0 + rows) of batch entry b, rows <= W.
void forward_block(const Bf16ForwardArgs& a, Bf16ForwardScratch& w, int64_t b, int64_t i0, int64_t rows) {
  const Dims& s = a.s;
  const int64_t longest = block_lengths(a.lens, s.n, s.m, b, i0, rows, w.len, w.first);
  std::fill(w.len + rows, w.len + W, 0);
  const int64_t shortest = *std::min_element(w.len, w.len + rows);
  // With bands the keys start at the block's earliest first key, made even
  // (Vᵀ's pairs of keys start at even keys); every row sees [latest, shortest).
  int64_t start = 0, latest = 0;
  if (a.lens.banded()) {
    std::fill(w.first + rows, w.first + W, 0);
    start = key_span(a.lens, s, b, i0, rows).first / 2 * 2;
    latest = *std::max_element(w.first, w.first + rows);
  }
  if (w.entry != b) {
    pack_values(a.v, s, b, a.longest[b], a.m2, w.rows.get(), w.vt.get());
    w.entry = b;
  }
  transpose_pairs(a.q + (b * s.n + i0) * s.d, rows, s.d, W, w.qt.get());
  std::fill_n(w.ot.get(), s.dv * W, 0.0f);
  std::fill_n(w.row_max, W, -std::numeric_limits<float>::infinity());
  std::fill_n(w.row_sum, W, 0.0f);
  for (int64_t j0 = start, j1; j0 < longest; j0 = j1) {
    j1 = key_block_end(a.lens.banded(), j0, a.kb, latest, shortest, longest, 2);
    const int64_t kc = j1 - j0;
    const bool all_valid = rows == W && shortest >= j1 && latest <= j0;
    for (int64_t c = 0; c < W; ++c) {
      w.limit[c] = static_cast<float>(std::clamp<int64_t>(w.len[c] - j0, 0, kc));
    }
    if (a.lens.banded()) {
      for (int64_t c = 0; c < W; ++c) {
        w.lower[c] = static_cast<float>(std::clamp<int64_t>(w.first[c] - j0, 0, kc));
      }
    }
    attend_key_block(a, w, b, j0, kc, all_valid);
  }
  // Oᵀ divided by the sums and rounded a vector of queries at a time, two
  // features interleaved into pairs (ob: dv / 2 × W pairs), then each query's
  // row copied out of it a pair at a time.
  alignas(64) float inv[W];
  for (int64_t c = 0; c < W; ++c) inv[c] = w.len[c] == 0 ? 0.0f : 1.0f / w.row_sum[c];
  const __m512 inv0 = _mm512_load_ps(inv), inv1 = _mm512_load_ps(inv + V::size());
  const float* ot = w.ot.get();
  Pair* ob = w.ob.get();
  const auto normalised = [&](int64_t f, int64_t half) {
    if (f >= s.dv) return _mm512_setzero_ps();
    return _mm512_mul_ps(_mm512_loadu_ps(ot + f * W + half * V::size()), half ? inv1 : inv0);
  };
  for (int64_t f = 0; f < s.dv; f += 2) {
    for (int64_t half = 0; half < 2; ++half) {
      _mm512_storeu_si512(ob + f / 2 * W + half * V::size(),
                          interleave_bf16(normalised(f, half), normalised(f + 1, half)));
    }
  }
  const int64_t whole = s.dv / 2;
  for (int64_t c = 0; c < rows; ++c) {
    BF16* out = a.out + (b * s.n + i0 + c) * s.dv;
    for (int64_t f2 = 0; f2 < whole; ++f2) std::memcpy(out + 2 * f2, ob + f2 * W + c, sizeof(Pair));
    if (whole * 2 < s.dv) std::memcpy(out + s.dv - 1, ob + whole * W + c, sizeof(BF16));
    a.lse[b * s.n + i0 + c] = w.len[c] == 0 ? -std::numeric_limits<float>::infinity()
                                            : w.row_max[c] + std::log(w.row_sum[c]);
  }
}

}  // namespace

void dot_product_attention_bf16_forward(const at::TensorBase& q, const at::TensorBase& k,
                                        const at::TensorBase& v, const at::TensorBase& lens,
                                        double scale, const at::TensorBase& out,
                                        const at::TensorBase& lse) {
  const Dims s = dims_of(q, v);
  const RowLengths row_lens = row_lengths(lens, s.n);
  if (s.n < kMinBf16Queries) {
    bf16_forward_rows(static_cast<const BF16*>(q.data_ptr()), static_cast<const BF16*>(k.data_ptr()),
                      static_cast<const BF16*>(v.data_ptr()), s, row_lens, static_cast<float>(scale),
                      static_cast<BF16*>(out.data_ptr()), lse.data_ptr<float>());
    return;
  }
  const int64_t blocks = div_up(s.n, W);
  std::vector<int64_t> costs(s.B * blocks), batch_longest(s.B, 0);
  // The widest span of keys a block visits: the longest length without bands.
  int64_t widest = 0;
  for (int64_t t = 0; t < s.B * blocks; ++t) {
    const int64_t b = t / blocks, i0 = t % blocks * W;
    const int64_t rows = std::min(W, s.n - i0);
    const KeySpan span = key_span(row_lens, s, b, i0, rows);
    batch_longest[b] = std::max(batch_longest[b], span.end);
    widest = std::max(widest, span.end - span.first);
    costs[t] = (rows * (span.end - span.first) + W) * macs_to_grain(s);
  }
  const int64_t ldk = pairs_of(s.d), m2 = pairs_of(s.m);
  const auto* kd = static_cast<const BF16*>(k.data_ptr());
  const auto* vd = static_cast<const BF16*>(v.data_ptr());
  const auto kp = s.d % 2 == 1 ? uninitialized_buffer<Pair>(s.B * s.m * ldk) : nullptr;
  if (kp) {
    at::parallel_for(0, s.B, grain_for(s.m * s.d), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) pack_odd_keys(kd, s, b, batch_longest[b], ldk, kp.get());
    });
  }
  const Bf16ForwardArgs args{s,
                             static_cast<const BF16*>(q.data_ptr()),
                             kp ? kp.get() : reinterpret_cast<const Pair*>(kd),
                             ldk,
                             vd,
                             batch_longest.data(),
                             m2,
                             row_lens,
                             static_cast<float>(scale),
                             static_cast<BF16*>(out.data_ptr()),
                             lse.data_ptr<float>(),
                             bf16_key_block(widest, 2)};
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    const TileScope tiles;
    std::optional<Bf16ForwardScratch> scratch;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / blocks, i0 = t % blocks * W;
      if (!scratch) scratch.emplace(args);
      forward_block(args, *scratch, b, i0, std::min(W, s.n - i0));
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
