#pragma once

// Vector helpers shared by the per-instruction-set kernel files (included
// inside each one's CPU_CAPABILITY namespace): row lengths, partial vector
// loads and stores, horizontal reductions, and one row of the masked softmax
// forward and backward, which the additive kernel folds into its own loop.

#include <ATen/Parallel.h>
#include <ATen/core/TensorBase.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#ifdef D2L_RUNS_ON_STD_THREADS
#include <exception>
#include <thread>
#endif

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// Rows of about this many element-operations make one parallel task.
constexpr int64_t kGrain = 32768;

inline int64_t grain_for(int64_t cost_per_row) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cost_per_row));
}

// Work split by cost (the flash and additive kernels): with random valid
// lengths, equal numbers of tasks would leave one thread with most of the
// keys.
//
// Runs [bounds[r], bounds[r + 1]) of consecutive tasks, at most `parts` of
// them, each of about the same total cost: a run ends before or after the
// task that crosses its share, whichever lands nearer the share, but never
// before its own first task, so no run is empty. (With 32 tasks of random
// cost, ending always after left the larger of two runs 3% over half in the
// median and 7% at the 90th percentile; the nearer end, 1.6% and 3.5%.)
std::vector<int64_t> balanced_runs(const std::vector<int64_t>& costs, int64_t parts) {
  double total = 0;
  for (const int64_t c : costs) total += static_cast<double>(c);
  std::vector<int64_t> bounds{0};
  // Where run `bounds.size()` should end, computed once per run rather than
  // once per task: this loop is serial, before the threads start.
  auto share_of = [&](size_t run) {
    return total * static_cast<double>(run) / static_cast<double>(parts);
  };
  double done = 0, share = share_of(1);
  for (size_t t = 0; t < costs.size(); ++t) {
    const double before = done;
    done += static_cast<double>(costs[t]);
    if (static_cast<int64_t>(bounds.size()) < parts && done >= share) {
      const auto task = static_cast<int64_t>(t);
      const bool before_is_nearer = task > bounds.back() && share - before < done - share;
      bounds.push_back(before_is_nearer ? task : task + 1);
      share = share_of(bounds.size());
    }
  }
  if (bounds.back() != static_cast<int64_t>(costs.size())) {
    bounds.push_back(static_cast<int64_t>(costs.size()));
  }
  return bounds;
}

// The runs of tasks that parallel_runs makes: one run per thread, and one
// run per kGrain of cost at most, so small work is a single run on the
// calling thread, with no parallel region. Opening one per call cost more
// than the work at the sizes of a seq2seq step, and far more when threads are
// oversubscribed (LibTorch 2.x wheels bring their own OpenMP runtime beside
// ours).
inline std::vector<int64_t> run_bounds(const std::vector<int64_t>& costs) {
  double total = 0;
  for (const int64_t c : costs) total += static_cast<double>(c);
  const auto parts = std::clamp<int64_t>(static_cast<int64_t>(total / kGrain), 1,
                                         std::max(1, at::get_num_threads()));
  if (parts == 1) return {0, static_cast<int64_t>(costs.size())};
  return balanced_runs(costs, parts);
}

// body(r, first, last) for each run r, tasks [bounds[r], bounds[r + 1]).
template <typename F>
void for_each_run(const std::vector<int64_t>& bounds, const F& body) {
  const auto runs = static_cast<int64_t>(bounds.size()) - 1;
  if (runs <= 0) return;
  if (runs == 1) return body(int64_t{0}, bounds[0], bounds[1]);
#ifdef D2L_RUNS_ON_STD_THREADS
  // The sanitizer builds have no OpenMP, and at::parallel_for would run every
  // run on this thread: there each run but the first gets a thread of its
  // own, so that ASan and TSan see the runs at once (thread start and join
  // are the only synchronisation besides the kernels' own).
  std::vector<std::exception_ptr> errors(runs);
  const auto run = [&](int64_t r) {
    try {
      body(r, bounds[r], bounds[r + 1]);
    } catch (...) {
      errors[r] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> threads;
    struct JoinAll {
      std::vector<std::thread>& threads;
      ~JoinAll() {
        for (auto& t : threads) t.join();
      }
    } join_all{threads};
    threads.reserve(runs - 1);
    for (int64_t r = 1; r < runs; ++r) threads.emplace_back(run, r);
    run(0);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
#else
  at::parallel_for(0, runs, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) body(r, bounds[r], bounds[r + 1]);
  });
#endif
}

// body(first, last) for each run of tasks (run_bounds).
template <typename F>
void parallel_runs(const std::vector<int64_t>& costs, const F& body) {
  if (costs.empty()) return;
  for_each_run(run_bounds(costs), [&](int64_t, int64_t t0, int64_t t1) { body(t0, t1); });
}

// Sums that come out the same from call to call. Where the tasks of one batch
// entry add into one output (dQ in the flash backward, dK and dV in the
// additive one) and a run boundary falls inside the entry, two threads would
// add into it in whichever order they get there, so the gradients' last bits
// would change between calls with the same inputs. Instead the run holding
// the entry's first task adds into the output, and each run that starts
// inside an entry (a continuation) adds its tasks of that entry into a share
// of its own, which add_shares adds to the output after the parallel region,
// in run order: at a given thread count every element is summed in one order.
struct Continuations {
  std::vector<int64_t> run;    // runs that start inside an entry, ascending
  std::vector<int64_t> entry;  // the entry each one continues

  int64_t size() const { return static_cast<int64_t>(run.size()); }

  // The index of run r among the continuations, or -1.
  int64_t slot_of(int64_t r) const {
    const auto it = std::lower_bound(run.begin(), run.end(), r);
    return it != run.end() && *it == r ? static_cast<int64_t>(it - run.begin()) : -1;
  }
};

template <typename EntryOf>
Continuations continuations(const std::vector<int64_t>& bounds, const EntryOf& entry_of) {
  Continuations c;
  for (size_t r = 1; r + 1 < bounds.size(); ++r) {
    if (entry_of(bounds[r]) == entry_of(bounds[r] - 1)) {
      c.run.push_back(static_cast<int64_t>(r));
      c.entry.push_back(entry_of(bounds[r]));
    }
  }
  return c;
}

// out(entry)[e] += share i's [e] for e < size, for each continuation i in
// order.
template <typename T, typename OutOf>
void add_shares(const Continuations& c, const T* shares, int64_t size, const OutOf& out_of) {
  for (int64_t i = 0; i < c.size(); ++i) {
    T* out = out_of(c.entry[i]);
    const T* share = shares + i * size;
    at::parallel_for(0, size, kGrain, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) out[e] += share[e];
    });
  }
}

/// Valid length of each row of a (rows, m) problem: min(data[row / rows_per_len], m),
/// or m when there are no lengths. Lengths were checked non-negative upstream.
struct RowLengths {
  const int64_t* data = nullptr;
  int64_t rows_per_len = 1;

  int64_t at(int64_t row, int64_t m) const {
    return data == nullptr ? m : std::min(data[row / rows_per_len], m);
  }
};

/// Per-row view of int64 lengths (empty: no lengths; (B): one per batch entry;
/// (B, n): one per query) for rows of `queries` queries each.
inline RowLengths row_lengths(const at::TensorBase& lens, int64_t queries) {
  if (lens.numel() == 0) return {};
  return {lens.data_ptr<int64_t>(), lens.dim() == 1 ? queries : 1};
}

// The first r <= size() lanes of a vector at p, zero past them, and their
// store. ATen's loadu(p, r) and store(p, r) copy through a stack buffer with
// memcpy; a row of the book's shapes (10 keys) is nothing but such a tail,
// so on AVX2 and AVX-512 these are masked loads and stores, which read and
// write only the first r lanes (no fault past them).
template <typename T>
Vectorized<T> partial_load(const T* p, int64_t r) {
  return Vectorized<T>::loadu(p, r);
}

template <typename T>
void partial_store(const Vectorized<T>& v, T* p, int64_t r) {
  v.store(p, r);
}

#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
inline __mmask16 lanes16(int64_t r) { return static_cast<__mmask16>((1u << r) - 1); }
inline __mmask8 lanes8(int64_t r) { return static_cast<__mmask8>((1u << r) - 1); }
template <>
inline Vectorized<float> partial_load(const float* p, int64_t r) {
  return _mm512_maskz_loadu_ps(lanes16(r), p);
}
template <>
inline void partial_store(const Vectorized<float>& v, float* p, int64_t r) {
  _mm512_mask_storeu_ps(p, lanes16(r), v);
}
template <>
inline Vectorized<double> partial_load(const double* p, int64_t r) {
  return _mm512_maskz_loadu_pd(lanes8(r), p);
}
template <>
inline void partial_store(const Vectorized<double>& v, double* p, int64_t r) {
  _mm512_mask_storeu_pd(p, lanes8(r), v);
}
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
// Lane i is on where i < r: the sign bit of (i - r).
inline __m256i lanes32(int64_t r) {
  return _mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                          _mm256_set1_epi32(static_cast<int>(r)));
}
inline __m256i lanes64(int64_t r) {
  return _mm256_sub_epi64(_mm256_setr_epi64x(0, 1, 2, 3), _mm256_set1_epi64x(r));
}
template <>
inline Vectorized<float> partial_load(const float* p, int64_t r) {
  return _mm256_maskload_ps(p, lanes32(r));
}
template <>
inline void partial_store(const Vectorized<float>& v, float* p, int64_t r) {
  _mm256_maskstore_ps(p, lanes32(r), v);
}
template <>
inline Vectorized<double> partial_load(const double* p, int64_t r) {
  return _mm256_maskload_pd(p, lanes64(r));
}
template <>
inline void partial_store(const Vectorized<double>& v, double* p, int64_t r) {
  _mm256_maskstore_pd(p, lanes64(r), v);
}
#endif

// Lanes [0, r) of `first` and the rest of `rest` (r <= size()): ATen's
// Vectorized::set(rest, first, r), whose switch over r is an indirect jump
// that random row lengths mispredict; on AVX2 and AVX-512 a masked blend.
template <typename T>
Vectorized<T> set_first(const Vectorized<T>& rest, const Vectorized<T>& first, int64_t r) {
  return Vectorized<T>::set(rest, first, r);
}

#if defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
template <>
inline Vectorized<float> set_first(const Vectorized<float>& rest, const Vectorized<float>& first,
                                   int64_t r) {
  return _mm512_mask_blend_ps(lanes16(r), rest, first);
}
template <>
inline Vectorized<double> set_first(const Vectorized<double>& rest,
                                    const Vectorized<double>& first, int64_t r) {
  return _mm512_mask_blend_pd(lanes8(r), rest, first);
}
#elif defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
template <>
inline Vectorized<float> set_first(const Vectorized<float>& rest, const Vectorized<float>& first,
                                   int64_t r) {
  return _mm256_blendv_ps(rest, first, _mm256_castsi256_ps(lanes32(r)));
}
template <>
inline Vectorized<double> set_first(const Vectorized<double>& rest,
                                    const Vectorized<double>& first, int64_t r) {
  return _mm256_blendv_pd(rest, first, _mm256_castsi256_pd(lanes64(r)));
}
#endif

// The last, partial vector of a row's first L entries. When the row has room
// for a whole vector past position j (room >= size), it is loaded whole, which
// is cheaper still; callers blend away lanes r.. with set_first before
// using them, so masked entries never count.
template <typename T>
Vectorized<T> load_tail(const T* p, int64_t r, int64_t room) {
  return room >= Vectorized<T>::size() ? Vectorized<T>::loadu(p) : partial_load(p, r);
}

template <typename T>
void store_tail(const Vectorized<T>& v, T* p, int64_t r, int64_t room) {
  if (room >= Vectorized<T>::size()) {
    v.store(p);
  } else {
    partial_store(v, p, r);
  }
}

// Horizontal sum and max of one vector. ATen's vec_reduce_all does log-free
// shuffles through memory in a loop; per row that costs more than the row.
template <typename T>
T horizontal_max(const Vectorized<T>& v) {
  T lanes[Vectorized<T>::size()];
  v.store(lanes);
  T mx = lanes[0];
  for (int64_t i = 1; i < Vectorized<T>::size(); ++i) {
    mx = (std::isnan(mx) || mx > lanes[i]) && !std::isnan(lanes[i]) ? mx : lanes[i];
  }
  return mx;
}

template <typename T>
T horizontal_sum(const Vectorized<T>& v) {
  T lanes[Vectorized<T>::size()];
  v.store(lanes);
  T sum = lanes[0];
  for (int64_t i = 1; i < Vectorized<T>::size(); ++i) sum += lanes[i];
  return sum;
}

// A tree of shuffles and adds in registers. The loop above is a trip through
// memory and then a chain of dependent scalar adds (15 for AVX-512 float),
// paid once per row by the masked softmax (a row of the book's shapes is 10
// keys) and once per key by the flash kernel's row-by-row forward. The sum's
// order changes: halves added pairwise instead of left to right. Written
// with __builtin_shufflevector (GCC 12, clang), not intrinsics: GCC 12's
// 512-bit shuffle and extract intrinsics pass _mm512_undefined_* through
// and warn (-Wuninitialized) wherever they are inlined.
#if (defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)) && \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
#define D2L_SHUFFLE(x, ...) __builtin_shufflevector(x, x, __VA_ARGS__)
namespace hsum {
// Four floats or two doubles, down to one.
inline float last(__m128 q) {
  q = q + D2L_SHUFFLE(q, 2, 3, 0, 1);
  q = q + D2L_SHUFFLE(q, 1, 0, 3, 2);
  return q[0];
}
inline double last(__m128d q) { return q[0] + q[1]; }
inline float of(__m256 h) { return last(D2L_SHUFFLE(h, 0, 1, 2, 3) + D2L_SHUFFLE(h, 4, 5, 6, 7)); }
inline double of(__m256d h) { return last(D2L_SHUFFLE(h, 0, 1) + D2L_SHUFFLE(h, 2, 3)); }
#if defined(CPU_CAPABILITY_AVX512)
inline float of(__m512 x) {
  return of(D2L_SHUFFLE(x, 0, 1, 2, 3, 4, 5, 6, 7) + D2L_SHUFFLE(x, 8, 9, 10, 11, 12, 13, 14, 15));
}
inline double of(__m512d x) { return of(D2L_SHUFFLE(x, 0, 1, 2, 3) + D2L_SHUFFLE(x, 4, 5, 6, 7)); }
#endif
}  // namespace hsum
// The same tree with max for the row maximum of the masked softmax and the
// flash kernel's rows: horizontal_max's loop compares random scores one at
// a time, and its mispredicted branches took a fifth of the book's
// (64, 10, 10) masked softmax forward. Where a lane is NaN, max_ps may pass
// it or not (it returns its second operand when either is NaN), unlike the
// loop; either way the callers take that lane's exponential into the row's
// sum, so the row comes out NaN as before.
namespace hmax {
inline float last(__m128 q) {
  q = _mm_max_ps(q, D2L_SHUFFLE(q, 2, 3, 0, 1));
  q = _mm_max_ps(q, D2L_SHUFFLE(q, 1, 0, 3, 2));
  return q[0];
}
inline double last(__m128d q) { return _mm_max_pd(q, D2L_SHUFFLE(q, 1, 0))[0]; }
inline float of(__m256 h) {
  return last(_mm_max_ps(D2L_SHUFFLE(h, 0, 1, 2, 3), D2L_SHUFFLE(h, 4, 5, 6, 7)));
}
inline double of(__m256d h) { return last(_mm_max_pd(D2L_SHUFFLE(h, 0, 1), D2L_SHUFFLE(h, 2, 3))); }
#if defined(CPU_CAPABILITY_AVX512)
inline float of(__m512 x) {
  return of(_mm256_max_ps(D2L_SHUFFLE(x, 0, 1, 2, 3, 4, 5, 6, 7),
                          D2L_SHUFFLE(x, 8, 9, 10, 11, 12, 13, 14, 15)));
}
inline double of(__m512d x) {
  return of(_mm256_max_pd(D2L_SHUFFLE(x, 0, 1, 2, 3), D2L_SHUFFLE(x, 4, 5, 6, 7)));
}
#endif
}  // namespace hmax
#undef D2L_SHUFFLE
// Overloads, which calls with float and double vectors prefer to the loops.
inline float horizontal_sum(const Vectorized<float>& v) { return hsum::of(v); }
inline double horizontal_sum(const Vectorized<double>& v) { return hsum::of(v); }
inline float horizontal_max(const Vectorized<float>& v) { return hmax::of(v); }
inline double horizontal_max(const Vectorized<double>& v) { return hmax::of(v); }
#endif


template <typename T>
T row_max(const T* x, int64_t L, int64_t m) {
  using V = Vectorized<T>;
  const V lowest(-std::numeric_limits<T>::infinity());
  V vmax = lowest;
  int64_t j = 0;
  for (; j + V::size() <= L; j += V::size()) vmax = at::vec::maximum(vmax, V::loadu(x + j));
  if (j < L) {
    vmax = at::vec::maximum(vmax, set_first(lowest, load_tail(x + j, L - j, m - j), L - j));
  }
  return horizontal_max(vmax);
}

// e^x for the softmax's exponents (the masked softmax and the flash
// kernel). Float on AVX2 and AVX-512: Cody–Waite reduction to
// r = x - n·ln 2 with |r| <= ln 2 / 2, Taylor to degree 6 (truncation below
// 2e-7 relative), scaled by 2^n: no call and fewer instructions than SLEEF's
// 1-ulp exp, which took 11% of the flash forward pass on AVX2 and 28% of the
// masked softmax forward on AVX-512 in profiles. NaN stays NaN; below -87.3
// (where e^x leaves the normal floats) it is 0, as -inf is; above 88 it stays
// at e^88 (never met: the exponents here are at most 0). Other types and
// instruction sets: Vectorized<T>::exp (SLEEF).
template <typename T>
inline Vectorized<T> softmax_exp(const Vectorized<T>& x) {
  return x.exp();
}

// The reduction's constants: ln 2 split in a high part exact in float and
// the rest, and the Taylor coefficients 1/k! from k = 6 down to k = 0.
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693145751953125f, kLn2Low = 1.428606765330187e-06f;
constexpr float kExpLowest = -87.3f, kExpHighest = 88.0f;
constexpr float kExpTaylor[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

#if defined(CPU_CAPABILITY_AVX2) && !defined(_MSC_VER)
template <>
inline Vectorized<float> softmax_exp(const Vectorized<float>& x) {
  const __m256 v = x;
  const __m256 lowest = _mm256_set1_ps(kExpLowest);
  // max/min return their second operand when either is NaN: NaN goes through.
  const __m256 c = _mm256_min_ps(_mm256_set1_ps(kExpHighest), _mm256_max_ps(lowest, v));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(c, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2High), c);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Low), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[k]));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  // Zero below the range: the compare is false for NaN, which stays.
  return _mm256_andnot_ps(_mm256_cmp_ps(v, lowest, _CMP_LT_OQ), e);
}
#elif defined(CPU_CAPABILITY_AVX512) && !defined(_MSC_VER)
// The same on 16 lanes; 2^n through scalef (n is a whole number here).
template <>
inline Vectorized<float> softmax_exp(const Vectorized<float>& x) {
  const __m512 v = x;
  const __m512 lowest = _mm512_set1_ps(kExpLowest);
  const __m512 c = _mm512_min_ps(_mm512_set1_ps(kExpHighest), _mm512_max_ps(lowest, v));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2High), c);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Low), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int k = 1; k < 7; ++k) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[k]));
  const __m512 e = _mm512_scalef_ps(p, n);
  const __mmask16 below = _mm512_cmp_ps_mask(v, lowest, _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~below), e);
}
#endif

// Where a row's zeros past its L valid entries start being written by a
// fill, the rest of the row: the last, partial vector of the valid entries
// is stored blended with zeros as far as the row lets it (its lanes up to m),
// so that a row of at most one vector (the book's 10 keys) needs no fill. A
// fill per row was a memset call of a random length, whose branches
// mispredicted on every few rows.
template <typename T>
int64_t zeros_from(int64_t L, int64_t m) {
  const int64_t j = L - L % Vectorized<T>::size();
  return j == L ? L : std::min(m, j + Vectorized<T>::size());
}

// The partial vector of a row's valid entries, lanes r.. already zero, at
// y + j: stored up to m (the row's room), so that it writes the first zeros.
template <typename T>
void store_tail_zeros(const Vectorized<T>& v, T* p, int64_t room) {
  store_tail(v, p, std::min<int64_t>(room, Vectorized<T>::size()), room);
}

// One row of y = softmax(scale * x[0:L]) followed by zeros up to m. Masked
// entries never reach a sum or an output lane, so whatever they hold (inf,
// NaN) cannot leak.
template <typename T>
void softmax_row(const T* x, T* y, int64_t L, int64_t m, T scale) {
  using V = Vectorized<T>;
  if (L == 0) return std::fill(y, y + m, T(0));
  const T mx = row_max(x, L, m);
  const V vmax(mx), vscale(scale);
  V vsum(0);
  int64_t j = 0;
  for (; j + V::size() <= L; j += V::size()) {
    const V e = softmax_exp((V::loadu(x + j) - vmax) * vscale);
    e.store(y + j);
    vsum = vsum + e;
  }
  const int64_t r = L - j;
  V tail(0);
  if (r > 0) {
    tail = set_first(V(0), softmax_exp((load_tail(x + j, r, m - j) - vmax) * vscale), r);
    vsum = vsum + tail;
  }
  const V inv(T(1) / horizontal_sum(vsum));
  for (j = 0; j + V::size() <= L; j += V::size()) (V::loadu(y + j) * inv).store(y + j);
  // Lanes past L hold zeros, but 0 * inv is NaN when the valid scores are all
  // -inf (or hold +inf or NaN): blend them back to exact zeros.
  if (r > 0) store_tail_zeros(set_first(V(0), tail * inv, r), y + j, m - j);
  std::fill(y + zeros_from<T>(L, m), y + m, T(0));
}

// dx = scale * y * (dy - <dy, y>) on the valid entries, zeros after them.
// dy's masked entries (possibly inf or NaN) are blended away before use.
template <typename T>
void softmax_backward_row(const T* y, const T* dy, T* dx, int64_t L, int64_t m, T scale) {
  using V = Vectorized<T>;
  V vdot(0);
  int64_t j = 0;
  for (; j + V::size() <= L; j += V::size()) {
    vdot = at::vec::fmadd(V::loadu(y + j), V::loadu(dy + j), vdot);
  }
  const int64_t r = L - j;
  if (r > 0) {
    const V prod = load_tail(y + j, r, m - j) * load_tail(dy + j, r, m - j);
    vdot = vdot + set_first(V(0), prod, r);
  }
  const V dot(horizontal_sum(vdot));
  const V vscale(scale);
  for (j = 0; j + V::size() <= L; j += V::size()) {
    (vscale * V::loadu(y + j) * (V::loadu(dy + j) - dot)).store(dx + j);
  }
  if (r > 0) {
    const V g = vscale * load_tail(y + j, r, m - j) * (load_tail(dy + j, r, m - j) - dot);
    store_tail_zeros(set_first(V(0), g, r), dx + j, m - j);
  }
  std::fill(dx + zeros_from<T>(L, m), dx + m, T(0));
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
