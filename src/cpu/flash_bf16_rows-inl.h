#pragma once

// The bfloat16 flash kernel's row-by-row paths, forward and backward, for
// batch entries of fewer than kMinBf16Queries queries (decoding: one query
// a step). As in the float kernel's rows (flash_rows-inl.h), a block of 32
// query columns would be mostly padding there; unlike the blocks, nothing
// is packed: Q, K, V and dO are read in place, once, in bfloat16 (half the
// bytes of the float kernel on widened inputs, which also made float copies
// of them first). Note [bfloat16 flash attention] in
// dot_product_attention_bf16_kernel.cpp; included inside the AVX512_BF16
// and AMX_BF16 namespaces (the products here are VDPBF16PS in both).

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "cpu/flash_bf16-inl.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/flash_rows-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

/// The first r of 32 bfloat16 lanes (all of them from 32).
inline __mmask32 lanes_bf16(int64_t r) {
  return r >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << r) - 1);
}

inline __m512bh as_bh(__m512i x) { return reinterpret_cast<__m512bh>(x); }

/// x · y over n bfloat16 elements: VDPBF16PS on pairs of features (exact
/// products, float sums), as the blocks' products.
inline float dot_pairs(const c10::BFloat16* x, const c10::BFloat16* y, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    acc0 =
        _mm512_dpbf16_ps(acc0, as_bh(_mm512_loadu_si512(x + c)), as_bh(_mm512_loadu_si512(y + c)));
    acc1 = _mm512_dpbf16_ps(acc1, as_bh(_mm512_loadu_si512(x + c + 32)),
                            as_bh(_mm512_loadu_si512(y + c + 32)));
  }
  for (; c < n; c += 32) {
    const __mmask32 m = lanes_bf16(n - c);
    acc0 = _mm512_dpbf16_ps(acc0, as_bh(_mm512_maskz_loadu_epi16(m, x + c)),
                            as_bh(_mm512_maskz_loadu_epi16(m, y + c)));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/// out[0:32·G] (masked to `cols`) = Σ_{j < L} p_j x[j, :], or with `keep`,
/// keep · out + that: p in pairs of consecutive keys (pp[t] = (p_2t,
/// p_2t+1)), x's rows (stride ldx, 32 features a group) interleaved two at a
/// time into pairs of keys in registers. The interleave works within 128-bit
/// lanes, so each group's two accumulators hold its 32 features in another
/// order, put back once at the end; a last, odd key is paired with zeros,
/// never with the row after it.
template <int G>
void weighted_sum_pairs_group(const Pair* pp, const c10::BFloat16* x, int64_t ldx, int64_t L,
                              int64_t cols, float* out, const float* keep) {
  __m512 lo[G], hi[G];
  __mmask32 mask[G];
  for (int g = 0; g < G; ++g) {
    lo[g] = hi[g] = _mm512_setzero_ps();
    mask[g] = lanes_bf16(cols - 32 * g);
  }
  const auto step = [&](Pair pair, const c10::BFloat16* r0, const c10::BFloat16* r1) {
    const __m512bh w = as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
    for (int g = 0; g < G; ++g) {
      const __m512i a = _mm512_maskz_loadu_epi16(mask[g], r0 + 32 * g);
      const __m512i b =
          r1 == nullptr ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(mask[g], r1 + 32 * g);
      lo[g] = _mm512_dpbf16_ps(lo[g], as_bh(_mm512_unpacklo_epi16(a, b)), w);
      hi[g] = _mm512_dpbf16_ps(hi[g], as_bh(_mm512_unpackhi_epi16(a, b)), w);
    }
  };
  const int64_t whole = L / 2;
  for (int64_t t = 0; t < whole; ++t) step(pp[t], x + 2 * t * ldx, x + (2 * t + 1) * ldx);
  if (L % 2 == 1) step(pp[whole], x + (L - 1) * ldx, nullptr);
  // Lane block l (4 lanes) of lo holds features 8l..8l+3, of hi 8l+4..8l+7.
  alignas(64) static constexpr int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19,
                                                     4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                      12, 13, 14, 15, 28, 29, 30, 31};
  const __m512i first = _mm512_load_si512(kFirst), second = _mm512_load_si512(kSecond);
  for (int g = 0; g < G; ++g) {
    for (int h = 0; h < 2; ++h) {
      const int64_t r = std::clamp<int64_t>(cols - 32 * g - 16 * h, 0, 16);
      if (r == 0) break;
      const auto lanes = static_cast<__mmask16>((1u << r) - 1);
      __m512 y = _mm512_permutex2var_ps(lo[g], h == 0 ? first : second, hi[g]);
      float* o = out + 32 * g + 16 * h;
      if (keep != nullptr)
        y = _mm512_fmadd_ps(_mm512_set1_ps(*keep), _mm512_maskz_loadu_ps(lanes, o), y);
      _mm512_mask_storeu_ps(o, lanes, y);
    }
  }
}

/// out[0:cols] = Σ_{j < L} p_j x[j, 0:cols] (keep · out + that with `keep`),
/// one pass down x per 128 features.
inline void weighted_sum_pairs(const Pair* pp, const c10::BFloat16* x, int64_t ldx, int64_t L,
                               int64_t cols, float* out, const float* keep) {
  for (int64_t f0 = 0; f0 < cols; f0 += 128) {
    const int64_t c = std::min<int64_t>(128, cols - f0);
    switch (div_up(c, 32)) {
      case 1: weighted_sum_pairs_group<1>(pp, x + f0, ldx, L, c, out + f0, keep); break;
      case 2: weighted_sum_pairs_group<2>(pp, x + f0, ldx, L, c, out + f0, keep); break;
      case 3: weighted_sum_pairs_group<3>(pp, x + f0, ldx, L, c, out + f0, keep); break;
      default: weighted_sum_pairs_group<4>(pp, x + f0, ldx, L, c, out + f0, keep); break;
    }
  }
}

/// x[0:L] rounded to bfloat16 in pairs of consecutive entries, pp[0:pairs_of(L)],
/// the pair of an odd last entry completed with a zero; returns nothing past L.
inline void pairs_of_row(const float* x, int64_t L, Pair* pp) {
  for (int64_t j = 0; j < L; j += 32) {
    __m512 h[2];
    for (int i = 0; i < 2; ++i) {
      const int64_t r = std::clamp<int64_t>(L - j - 16 * i, 0, 16);
      h[i] = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << r) - 1), x + j + 16 * i);
    }
    const int64_t pairs = std::min<int64_t>(16, pairs_of(L - j));
    _mm512_mask_storeu_epi32(pp + j / 2, static_cast<__mmask16>((1u << pairs) - 1),
                             consecutive_bf16(h[0], h[1]));
  }
}

/// sc[0:L] = exp_bf16(sc - shift), exactly 0 for -inf; returns their sum.
inline float exp_in_place(float* sc, int64_t L, float shift) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < L; j += 16) {
    const auto lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, L - j)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(lanes, sc + j);
    const __m512 e = _mm512_maskz_mov_ps(lanes, exp_bf16(_mm512_sub_ps(x, _mm512_set1_ps(shift))));
    _mm512_mask_storeu_ps(sc + j, lanes, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

/// A thread's scratch for rows: a chunk's scores and their pairs.
struct Bf16RowScratch {
  std::unique_ptr<float[]> scores = uninitialized_buffer<float>(kRowChunk);
  std::unique_ptr<Pair[]> pairs = uninitialized_buffer<Pair>(kRowChunk / 2);
};

/// One row's softmax over keys [j0, j1) of its batch entry, not normalised:
/// out (float, dv) = Σ e^(s_j - shift) v_j with shift = shift_for(the
/// maximum of the scaled scores s_j), and the sum of those exponentials;
/// chunk by chunk, the output so far rescaled as a chunk raises the maximum
/// (the float kernel's row_partial on bfloat16 operands).
inline RowPartial<float> bf16_row_partial(const c10::BFloat16* q, const c10::BFloat16* k,
                                          const c10::BFloat16* v, const Dims& s, float scale,
                                          int64_t j0, int64_t j1, Bf16RowScratch& w, float* out) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  float* sc = w.scores.get();
  RowPartial<float> r{kNone, 0.0f};
  if (j0 == j1) std::fill_n(out, s.dv, 0.0f);
  for (int64_t c0 = j0; c0 < j1; c0 += kRowChunk) {
    const int64_t c = std::min(kRowChunk, j1 - c0);
    float mx = r.mx;
    for (int64_t j = 0; j < c; ++j) {
      sc[j] = scale * dot_pairs(q, k + (c0 + j) * s.d, s.d);
      mx = std::max(mx, sc[j]);
    }
    // Nothing to keep after the first chunk or chunks of -inf only (their
    // output is 0, and e^(0 - mx) could overflow).
    const float keep = c0 == j0 || r.mx == kNone ? 0.0f : std::exp(r.mx - mx);
    r.sum = r.sum * keep + exp_in_place(sc, c, shift_for(mx));
    pairs_of_row(sc, c, w.pairs.get());
    weighted_sum_pairs(w.pairs.get(), v + c0 * s.dv, s.dv, c, s.dv, out,
                       c0 == j0 ? nullptr : &keep);
    r.mx = mx;
  }
  return r;
}

/// The forward of every row, row by row: out (bfloat16, B·n × dv) and lse;
/// a row's keys are [first, length) (Note [Bands of keys]).
inline void bf16_forward_rows(const c10::BFloat16* q, const c10::BFloat16* k,
                              const c10::BFloat16* v, const Dims& s, const RowLengths& lens,
                              float scale, c10::BFloat16* out, float* lse) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  const int64_t rows = s.B * s.n;
  const auto keys_of = [&](int64_t row) { return lens.at(row, s.m) - lens.first(row); };
  int64_t longest = 0;
  for (int64_t row = 0; row < rows; ++row) longest = std::max(longest, keys_of(row));
  // Fewer rows than threads (one sequence's heads) split each row's keys, as
  // the float kernel's forward_split.
  const int64_t splits = rows == 0 ? 1 : key_splits<float>(s, rows, longest, false);
  const int64_t slot = s.dv + 2;
  // Each part's unnormalised output, maximum and sum (when rows are split).
  std::vector<float> parts(splits > 1 ? rows * splits * slot : 0);
  std::vector<int64_t> costs(rows * splits);
  for (int64_t t = 0; t < rows * splits; ++t) {
    costs[t] = (div_up(keys_of(t / splits), splits) + 1) * macs_to_grain(s);
  }
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    Bf16RowScratch w;
    std::vector<float> acc(splits > 1 ? 0 : s.dv);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row = t / splits, part = t % splits, b = row / s.n;
      const int64_t F = lens.first(row), L = keys_of(row);
      float* o = splits > 1 ? parts.data() + t * slot : acc.data();
      const RowPartial<float> r =
          bf16_row_partial(q + row * s.d, k + b * s.m * s.d, v + b * s.m * s.dv, s, scale,
                           F + L * part / splits, F + L * (part + 1) / splits, w, o);
      if (splits > 1) {
        o[s.dv] = r.mx;
        o[s.dv + 1] = r.sum;
        continue;
      }
      // No valid key: zeros and lse -inf, as the blocks.
      scale_row(o, s.dv, L == 0 ? 0.0f : 1.0f / r.sum);
      round_to_bf16(o, s.dv, out + row * s.dv);
      lse[row] = L == 0 ? kNone : shift_for(r.mx) + std::log(r.sum);
    }
  });
  if (splits == 1) return;
  std::vector<float> row_out(s.dv);
  for (int64_t row = 0; row < rows; ++row) {
    const float* first = parts.data() + row * splits * slot;
    float mx = kNone;
    for (int64_t p = 0; p < splits; ++p) mx = std::max(mx, first[p * slot + s.dv]);
    std::fill(row_out.begin(), row_out.end(), 0.0f);
    float sum = 0;
    for (int64_t p = 0; p < splits; ++p) {
      const float* part = first + p * slot;
      // A part of -inf scores only holds zeros (and e^(0 - mx) may overflow).
      const float factor = part[s.dv] == kNone ? 0.0f : std::exp(part[s.dv] - shift_for(mx));
      sum += factor * part[s.dv + 1];
      axpy<true>(row_out.data(), part, factor, s.dv);
    }
    const bool none = lens.at(row, s.m) == 0;
    scale_row(row_out.data(), s.dv, none ? 0.0f : 1.0f / sum);
    round_to_bf16(row_out.data(), s.dv, out + row * s.dv);
    lse[row] = none ? kNone : shift_for(mx) + std::log(sum);
  }
}

// A key block's buffers on the backward's rows path (Args:
// Bf16BackwardArgs in dot_product_attention_bf16_backward_kernel.cpp): its dK and dV in float, one
// query's P and dS over it (and dS in pairs of keys), the query and its dO
// widened.
template <typename Args>
struct Bf16RowsScratch {
  std::unique_ptr<float[]> dk, dv, p, ds, qf, dof;
  std::unique_ptr<Pair[]> dsp;
  float* dq_entry = nullptr;

  explicit Bf16RowsScratch(const Args& a)
      : dk(uninitialized_buffer<float>(a.kb * a.s.d)),
        dv(uninitialized_buffer<float>(a.kb * a.s.dv)),
        p(uninitialized_buffer<float>(a.kb)),
        ds(uninitialized_buffer<float>(a.kb)),
        qf(uninitialized_buffer<float>(a.s.d)),
        dof(uninitialized_buffer<float>(a.s.dv)),
        dsp(uninitialized_buffer<Pair>(a.kb / 2)) {}
};

// Key block [j0, j0 + kc) of batch entry b when the entry has fewer than
// kMinBf16Queries queries (decoding shapes): query by query, as the float
// kernel's backward_rows, reading Q, K, V and dO in place. A query's dot
// products q·k and dO·v in VDPBF16PS, then P = exp(scale·S - lse) and
// dS = scale·P ∘ (dP - D) a vector of keys at a time (exactly 0 past its
// valid keys); dV += P dO and dK += dS q in float rows of the block (the
// first query that sees a key writes its rows, later ones add: the block
// ends at the entry's longest length, so every key is seen; with bands a
// key may be seen by none, so the rows are zeroed first and every query
// adds), rounded to bfloat16 once at the end; with one query a batch entry
// and no bands, straight into bfloat16 instead (each row is written once).
// dQ's float row += dS K with dS in pairs of keys, as the blocks' dQ.
template <typename Args>
void bf16_backward_rows(const Args& a, Bf16RowsScratch<Args>& w, int64_t b, int64_t j0,
                        int64_t kc) {
  const Dims& s = a.s;
  const c10::BFloat16* k = a.k + (b * s.m + j0) * s.d;
  const c10::BFloat16* v = a.v + (b * s.m + j0) * s.dv;
  float *p = w.p.get(), *ds = w.ds.get();
  const bool direct = s.n == 1 && !a.lens.banded();
  int64_t written = 0;  // keys [0, written) of the block have their rows of dK and dV
  if (a.lens.banded()) {
    std::fill_n(w.dk.get(), kc * s.d, 0.0f);
    std::fill_n(w.dv.get(), kc * s.dv, 0.0f);
    written = kc;
  }
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t row = b * s.n + i;
    // The query's keys of the block: [lo, valid).
    const int64_t valid = std::clamp<int64_t>(a.lens.at(row, s.m) - j0, 0, kc);
    const int64_t lo = std::clamp<int64_t>(a.lens.first(row) - j0, 0, valid);
    if (lo == valid) continue;
    const c10::BFloat16* q = a.q_rows + row * s.d;
    const c10::BFloat16* dout = a.dout_rows + row * s.dv;
    for (int64_t j = lo; j < valid; ++j) {
      p[j] = dot_pairs(q, k + j * s.d, s.d);
      ds[j] = dot_pairs(dout, v + j * s.dv, s.dv);
    }
    const __m512 scale = _mm512_set1_ps(a.scale), lse = _mm512_set1_ps(a.lse[row]);
    const __m512 delta = _mm512_set1_ps(a.delta[row]);
    for (int64_t j = lo; j < valid; j += 16) {
      const auto lanes = static_cast<__mmask16>((1u << std::min<int64_t>(16, valid - j)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(
          lanes, exp_bf16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(lanes, p + j), scale, lse)));
      const __m512 g = _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, ds + j), delta);
      _mm512_mask_storeu_ps(p + j, lanes, e);
      _mm512_mask_storeu_ps(ds + j, lanes, _mm512_maskz_mul_ps(lanes, _mm512_mul_ps(scale, e), g));
    }
    widen_bf16(q, s.d, w.qf.get());
    widen_bf16(dout, s.dv, w.dof.get());
    const auto dk_row = [&](int64_t j) { return a.dk + (b * s.m + j0 + j) * s.d; };
    const auto dv_row = [&](int64_t j) { return a.dv + (b * s.m + j0 + j) * s.dv; };
    for (int64_t j = lo; j < valid; ++j) {
      if (direct) {
        round_to_bf16(w.dof.get(), s.dv, dv_row(j), p[j]);
        round_to_bf16(w.qf.get(), s.d, dk_row(j), ds[j]);
      } else if (j >= written) {
        axpy<false>(w.dv.get() + j * s.dv, w.dof.get(), p[j], s.dv);
        axpy<false>(w.dk.get() + j * s.d, w.qf.get(), ds[j], s.d);
      } else {
        axpy<true>(w.dv.get() + j * s.dv, w.dof.get(), p[j], s.dv);
        axpy<true>(w.dk.get() + j * s.d, w.qf.get(), ds[j], s.d);
      }
    }
    pairs_of_row(ds + lo, valid - lo, w.dsp.get());
    const float add = 1.0f;
    weighted_sum_pairs(w.dsp.get(), k + lo * s.d, s.d, valid - lo, s.d, w.dq_entry + i * a.ldq,
                       &add);
    written = std::max(written, valid);
  }
  if (direct) return;
  for (int64_t j = 0; j < kc; ++j) {
    round_to_bf16(w.dk.get() + j * s.d, s.d, a.dk + (b * s.m + j0 + j) * s.d);
    round_to_bf16(w.dv.get() + j * s.dv, s.dv, a.dv + (b * s.m + j0 + j) * s.dv);
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
