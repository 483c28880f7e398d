// The flash dot-product kernel (Path::kFused or kAuto without training-time
// dropout, Note [Flash attention]), with and without weights, against the composite (book) path:
// forward and backward in every dtype, odd sizes around the register tiles and the query and key
// blocks, non-contiguous inputs, zero-length rows, lengths above the key
// count, non-finite padding, double backward, threads, and the modules that
// choose it, under every instruction set this machine runs.

#include <d2l/dot_product_attention.h>
#include <d2l/multi_head_attention.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "checks.h"
#include "fused_helpers.h"
#include "test_utils.h"

namespace {

using d2l::Path;
using d2l::testing::DtypeTolerance;
using d2l::testing::expect_close;
using d2l::testing::kFastPathDtypes;
using d2l::testing::max_rel_error;
using d2l::testing::value_and_grads;

class Flash : public d2l::testing::Fused {};

torch::Tensor attend(const std::vector<torch::Tensor>& qkv, const torch::Tensor& lens, Path path) {
  return std::get<0>(d2l::functional::dot_product_attention(qkv[0], qkv[1], qkv[2], lens, 0.0,
                                                            false, path, /*need_weights=*/false));
}

// Output, weights and the q, k, v gradients of sum(out ∘ G) + sum(weights ∘
// H) (H only when `weights_grad`), on `path` with weights asked for.
std::vector<torch::Tensor> with_weights(const std::vector<torch::Tensor>& qkv,
                                        const torch::Tensor& lens, Path path, bool weights_grad,
                                        const torch::Tensor& G, const torch::Tensor& H) {
  std::vector<torch::Tensor> in;
  for (const auto& t : qkv) in.push_back(t.detach().clone().requires_grad_());
  auto [out, weights] = d2l::functional::dot_product_attention(in[0], in[1], in[2], lens, 0.0,
                                                               false, path, /*need_weights=*/true);
  auto loss = (out * G.to(out.scalar_type())).sum();
  if (weights_grad) loss = loss + (weights * H.to(weights.scalar_type())).sum();
  loss.backward();
  return {out.detach(), weights.detach(), in[0].grad(), in[1].grad(), in[2].grad()};
}

// f() on one intra-op thread. The composite oracle runs so: its ATen loops are
// then inline, and under ThreadSanitizer (the tsan preset runs the tests that
// set two threads) only the fused kernels' own threads run at once, not
// libgomp's, whose barriers TSan cannot see.
template <typename F>
auto on_one_thread(const F& f) {
  struct Restore {
    int threads;
    ~Restore() { at::set_num_threads(threads); }
  } restore{at::get_num_threads()};
  at::set_num_threads(1);
  return f();
}

// Value and q, k, v gradients of the flash path against the composite path.
// In float and double both are compared in that dtype. In float16 and
// bfloat16 the composite path rounds its scores and weights to the dtype
// while the kernel accumulates in float, so both are compared with the
// composite path in double: the kernel must be within the dtype's tolerance
// of it, and no further from it than the composite path in that dtype is.
// With `weights` (0: none asked, 1: asked, 2: asked and given a gradient),
// the weights are compared too, as output 1.
void check_against_composite(const std::vector<torch::Tensor>& qkv, const torch::Tensor& lens,
                             const DtypeTolerance& tol, const std::string& what, int weights = 0) {
  const auto upstream =
      torch::randn({qkv[0].size(0), qkv[0].size(1), qkv[2].size(2)}, torch::kDouble);
  const auto upstream_weights =
      torch::randn({qkv[0].size(0), qkv[0].size(1), qkv[1].size(1)}, torch::kDouble);
  auto run = [&](Path path, const std::vector<torch::Tensor>& in) {
    if (weights > 0) return with_weights(in, lens, path, weights == 2, upstream, upstream_weights);
    return value_and_grads([&](const auto& x) { return attend(x, lens, path); }, in, upstream);
  };
  const auto flash = run(Path::kFused, qkv);
  const auto composite = on_one_thread([&] { return run(Path::kComposite, qkv); });
  const bool reduced = tol.dtype == torch::kHalf || tol.dtype == torch::kBFloat16;
  if (!reduced) {
    // Sums over hundreds of keys, in another order than bmm's: in float the
    // two paths differ by a few times the softmax's 2e-6.
    const DtypeTolerance sums{tol.dtype,
                              std::max(tol.forward, tol.dtype == torch::kFloat ? 1e-5 : 0.0),
                              std::max(tol.backward, tol.dtype == torch::kFloat ? 2e-5 : 0.0)};
    return expect_close(flash, composite, sums, what);
  }
  std::vector<torch::Tensor> qkv64;
  for (const auto& t : qkv) qkv64.push_back(t.to(torch::kDouble));
  const auto exact = on_one_thread([&] { return run(Path::kComposite, qkv64); });
  for (size_t i = 0; i < flash.size(); ++i) {
    EXPECT_EQ(flash[i].scalar_type(), tol.dtype) << what << " output " << i;
    const double error = max_rel_error(flash[i], exact[i]);
    const bool forward = i == 0 || (weights > 0 && i == 1);
    EXPECT_LT(error, forward ? tol.forward : tol.backward) << what << " output " << i;
    // Two roundings of the dtype (2⁻⁸ for bfloat16, 2⁻¹¹ for float16) of slack.
    const double rounding = tol.dtype == torch::kBFloat16 ? 0x1p-7 : 0x1p-10;
    EXPECT_LE(error, max_rel_error(composite[i], exact[i]) * 1.25 + rounding)
        << what << " output " << i;
  }
}

std::vector<DtypeTolerance> runnable_dtypes() {
  std::vector<DtypeTolerance> dtypes;
  for (const auto& tol : kFastPathDtypes) {
    if (tol.dtype != torch::kHalf || d2l::detail::cpu_float16_matmul_available()) {
      dtypes.push_back(tol);
    }
  }
  return dtypes;
}

struct Sizes {
  int64_t B, n, m, d, dv;
};

// Queries (doubled, for sharper rows), keys and values in double.
std::vector<torch::Tensor> random_qkv(const Sizes& c) {
  return {torch::randn({c.B, c.n, c.d}, torch::kDouble) * 2,
          torch::randn({c.B, c.m, c.d}, torch::kDouble),
          torch::randn({c.B, c.m, c.dv}, torch::kDouble)};
}

// No lengths, (B) and (B, n), with zeros and lengths above m.
std::vector<torch::Tensor> every_kind_of_lengths(const Sizes& c) {
  return {torch::Tensor(), torch::randint(0, c.m + 3, {c.B}),
          torch::randint(0, c.m + 3, {c.B, c.n})};
}

std::vector<torch::Tensor> in_dtype(const std::vector<torch::Tensor>& qkv,
                                    torch::ScalarType dtype) {
  return {qkv[0].to(dtype), qkv[1].to(dtype), qkv[2].to(dtype)};
}

// Sizes around the register tile (8 or 16 floats, 4 or 8 doubles), the query
// block (32) and the key block (256); every kind of lengths, with zeros and
// lengths above m.
TEST_P(Flash, MatchesCompositeForwardAndBackwardInEveryDtype) {
  const std::vector<Sizes> cases = {{2, 1, 1, 1, 1},     {3, 5, 9, 7, 3},      {2, 33, 17, 16, 5},
                                    {2, 31, 257, 9, 17}, {1, 65, 300, 64, 64}, {4, 32, 256, 32, 8},
                                    {2, 40, 520, 12, 33}};
  torch::manual_seed(21);
  for (const auto& c : cases) {
    const auto qkv = random_qkv(c);
    auto all_lens = every_kind_of_lengths(c);
    all_lens.push_back(torch::randint(1, c.m + 1, {c.B}).to(torch::kFloat));
    for (size_t l = 0; l < all_lens.size(); ++l) {
      for (const auto& tol : runnable_dtypes()) {
        const auto what = fmt::format("B={} n={} m={} d={} dv={} lens#{} {}", c.B, c.n, c.m, c.d,
                                      c.dv, l, c10::toString(tol.dtype));
        check_against_composite(in_dtype(qkv, tol.dtype), all_lens[l], tol, what);
      }
    }
  }
}

// Scores spread over about ±60 around each row's maximum, so the kernel's
// float exponential (inline on AVX2 and AVX-512) meets arguments across its
// whole range down to where e^x underflows, in the forward and in the
// backward's recomputed probabilities.
TEST_P(Flash, WideScoresMatchComposite) {
  torch::manual_seed(22);
  const int64_t B = 3, n = 37, m = 300, d = 16;
  const auto q = torch::randn({B, n, d}, torch::kDouble) * 15;
  const auto k = torch::randn({B, m, d}, torch::kDouble);
  const auto v = torch::randn({B, m, d}, torch::kDouble);
  for (const auto& lens : {torch::Tensor(), torch::randint(0, m + 3, {B, n})}) {
    // In float, sharp rows make the gradients more sensitive to rounding:
    // the two float paths then differ by up to 3.2e-5 on every instruction
    // set (SLEEF's exponential or ours); a wrong exponential is off by far more.
    for (const DtypeTolerance& tol :
         {kFastPathDtypes[0], DtypeTolerance{torch::kFloat, 1e-5, 1e-4}}) {
      check_against_composite(
          {q.to(tol.dtype), k.to(tol.dtype), v.to(tol.dtype)}, lens, tol,
          fmt::format("wide scores, lengths {}, {}", lens.defined(), c10::toString(tol.dtype)));
    }
  }
}

// Blocks of a few queries run row by row in the forward (one query: a
// decoding step), beside whole blocks where n is a block and a few rows:
// features past a vector and past four (weighted_sum's register group), in
// every dtype, with and without weights, at one and two threads.
TEST_P(Flash, FewQueriesRowByRowMatchComposite) {
  const std::vector<Sizes> cases = {
      {3, 1, 1000, 64, 64}, {2, 3, 70, 67, 70}, {4, 2, 33, 5, 131}, {2, 34, 40, 16, 16}};
  torch::manual_seed(32);
  const int saved = at::get_num_threads();
  for (const auto& c : cases) {
    const auto qkv = random_qkv(c);
    const auto all_lens = every_kind_of_lengths(c);
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      for (size_t l = 0; l < all_lens.size(); ++l) {
        for (const auto& tol : runnable_dtypes()) {
          for (int weights : {0, 2}) {
            const auto what =
                fmt::format("B={} n={} m={} d={} dv={} threads {} lens#{} {} weights {}", c.B, c.n,
                            c.m, c.d, c.dv, threads, l, c10::toString(tol.dtype), weights);
            check_against_composite(in_dtype(qkv, tol.dtype), all_lens[l], tol, what, weights);
          }
        }
      }
    }
  }
  at::set_num_threads(saved);
}

// One query over m keys whose first 700 scores are -inf (a -inf key feature
// against a positive query feature) and the rest about -112 in float and
// -1100 in double, where e^-score overflows the dtype: the -inf keys count
// as nothing (no NaN), both in a first chunk of them and in a first part of
// a split over threads, and the output is the composite's (outputs of about
// 0.1; in float a score of that size is only good to ~1e-5).
void expect_minus_inf_keys_count_as_nothing(int64_t m, int64_t d) {
  auto q = torch::randn({1, 1, d}, torch::kDouble);
  q[0][0][0] = 1.5;
  const auto v = torch::randn({1, m, d}, torch::kDouble);
  for (const auto& [dtype, far, tol] : {std::tuple{torch::kDouble, -3000.0, 1e-12},
                                        std::tuple{torch::kFloat, -300.0, 1e-5}}) {
    auto k = torch::randn({1, m, d}, torch::kDouble);
    k.narrow(1, 0, 700).select(2, 0).fill_(-std::numeric_limits<double>::infinity());
    k.narrow(1, 700, m - 700).select(2, 0).fill_(far);
    const std::vector<torch::Tensor> qkv{q.to(dtype), k.to(dtype), v.to(dtype)};
    const auto flash = attend(qkv, torch::Tensor(), Path::kFused);
    EXPECT_FALSE(flash.isnan().any().item<bool>()) << dtype << " threads " << at::get_num_threads();
    EXPECT_TRUE(torch::allclose(flash, attend(qkv, torch::Tensor(), Path::kComposite), tol, tol))
        << dtype << " threads " << at::get_num_threads();
  }
}

// A decoding row of more than 512 valid keys without weights runs chunk by
// chunk (kRowChunk) with an online softmax: keys whose scores grow down the
// row, so that each chunk raises the maximum and the output so far is
// rescaled (by up to e^-40 in float), lengths at and around the chunk
// boundaries, in every dtype, forward and backward; and a first chunk of
// only -inf scores.
TEST_P(Flash, LongDecodingRowsChunkByChunkMatchComposite) {
  torch::manual_seed(41);
  const int64_t B = 3, m = 1300, d = 16;
  for (const int64_t n : {1, 3}) {
    const auto q = torch::randn({B, n, d}, torch::kDouble) * 2;
    const auto rising = torch::linspace(0, 1, m, torch::kDouble).view({1, m, 1});
    const auto k = torch::randn({B, m, d}, torch::kDouble) * 0.3 + rising * q.mean(1, true) * 2;
    const auto v = torch::randn({B, m, d}, torch::kDouble);
    for (const auto& lens : {torch::Tensor(), torch::tensor({512, 513, 1025}),
                             torch::tensor({1024, 1300, 600}).view({B, 1}).expand({B, n})}) {
      for (const auto& tol : runnable_dtypes()) {
        check_against_composite(in_dtype({q, k, v}, tol.dtype), lens, tol,
                                fmt::format("n={} lengths {} {}", n, lens.defined(),
                                            c10::toString(tol.dtype)));
      }
    }
  }
  expect_minus_inf_keys_count_as_nothing(m, d);
}

// One sequence decoding (B·H below the thread count) splits each row's keys
// over threads and combines the parts: at 2 and 4 threads against the
// composite path in every dtype, forward and backward, with one and three
// queries, zero-length rows, parts of different lengths, features that end
// inside a register tile; and a first part of only -inf scores.
TEST_P(Flash, OneSequenceDecodingSplitsKeysOverThreads) {
  torch::manual_seed(43);
  const int saved = at::get_num_threads();
  for (const int threads : {2, 4}) {
    at::set_num_threads(threads);
    for (const Sizes& c : {Sizes{1, 1, 1500, 24, 40}, Sizes{1, 3, 2100, 64, 64},
                           Sizes{2, 1, 1100, 16, 16}}) {
      const auto qkv = random_qkv(c);
      const auto ragged = torch::tensor({0, 700, 2100}).narrow(0, 3 - c.n, c.n);
      for (const auto& lens : {torch::Tensor(), torch::full({c.B, c.n}, 1030, torch::kLong),
                               ragged.view({1, c.n}).expand({c.B, c.n})}) {
        for (const auto& tol : runnable_dtypes()) {
          check_against_composite(in_dtype(qkv, tol.dtype), lens, tol,
                                  fmt::format("threads {} B={} n={} m={} lengths {} {}", threads,
                                              c.B, c.n, c.m, lens.defined(),
                                              c10::toString(tol.dtype)));
        }
      }
    }
    expect_minus_inf_keys_count_as_nothing(1300, 16);
  }
  at::set_num_threads(saved);
}

// Many query blocks (of one register tile of rows in the forward, 48 rows in
// the backward; Note [Flash attention]), a last partial one, cut differently
// where two threads split the work, with lengths that grow down the rows so
// that every block reaches a different length and masks inside its key
// blocks. With and without weights; features of 5 and 8 (accumulated in
// scratch in the backward) and 64 (in the outputs themselves).
TEST_P(Flash, ManyQueryBlocksOfGrowingLengthsMatchComposite) {
  torch::manual_seed(29);
  const int64_t B = 2, n = 8 * 48 + 50, m = 300;
  for (const auto [d, dv] : {std::pair<int64_t, int64_t>{8, 5}, {64, 64}}) {
    const auto q = torch::randn({B, n, d}, torch::kDouble) * 2;
    const auto k = torch::randn({B, m, d}, torch::kDouble);
    const auto v = torch::randn({B, m, dv}, torch::kDouble);
    // Lengths that grow down the rows, so that the group's blocks differ.
    const auto growing = torch::div(torch::arange(n) * (m + 20), n, "floor").repeat({B, 1}) -
                         torch::tensor({0, 7}).view({B, 1});
    const std::vector<torch::Tensor> all_lens = {torch::Tensor(), torch::tensor({300, 131}),
                                                 torch::randint(0, m + 3, {B, n}),
                                                 growing.clamp_min(0)};
    const int saved = at::get_num_threads();
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      for (size_t l = 0; l < all_lens.size(); ++l) {
        for (const auto& tol : {kFastPathDtypes[0], kFastPathDtypes[1]}) {
          for (int weights : {0, 2}) {
            check_against_composite({q.to(tol.dtype), k.to(tol.dtype), v.to(tol.dtype)},
                                    all_lens[l], tol,
                                    fmt::format("d {} dv {} threads {} lens#{} {} weights {}", d,
                                                dv, threads, l, c10::toString(tol.dtype), weights),
                                    weights);
          }
        }
      }
    }
    at::set_num_threads(saved);
  }
}

// The backward splits the keys of one batch entry into several blocks (a
// quarter of the longest length each), whose tasks add to the same rows of
// dQ: with one batch entry and two threads, both threads add to one dQ,
// straight into its rows (d = 64) or through a share (d = 24), each key block
// starting at a different query block.
TEST_P(Flash, KeyBlocksOfOneBatchEntryAddUpInDqAtTwoThreads) {
  torch::manual_seed(31);
  const int64_t n = 3 * 48 + 7, m = 411;
  for (const auto [d, dv] : {std::pair<int64_t, int64_t>{64, 64}, {24, 40}}) {
    const auto q = torch::randn({1, n, d}, torch::kDouble) * 2;
    const auto k = torch::randn({1, m, d}, torch::kDouble);
    const auto v = torch::randn({1, m, dv}, torch::kDouble);
    const std::vector<torch::Tensor> all_lens = {torch::Tensor(), torch::tensor({250}),
                                                 torch::randint(0, m + 3, {1, n})};
    const int saved = at::get_num_threads();
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      for (size_t l = 0; l < all_lens.size(); ++l) {
        for (const auto& tol : {kFastPathDtypes[0], kFastPathDtypes[1]}) {
          check_against_composite({q.to(tol.dtype), k.to(tol.dtype), v.to(tol.dtype)},
                                  all_lens[l], tol,
                                  fmt::format("d {} dv {} threads {} lens#{} {}", d, dv, threads,
                                              l, c10::toString(tol.dtype)),
                                  0);
        }
      }
    }
    at::set_num_threads(saved);
  }
}

// The intra-op thread count and torch's deterministic-algorithms flag for a
// scope, both restored after it.
class ThreadsAndDeterminism {
 public:
  ThreadsAndDeterminism(int threads, bool deterministic)
      : threads_(at::get_num_threads()),
        deterministic_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::set_num_threads(threads);
    at::globalContext().setDeterministicAlgorithms(deterministic, false);
  }
  ~ThreadsAndDeterminism() {
    at::set_num_threads(threads_);
    at::globalContext().setDeterministicAlgorithms(deterministic_, warn_only_);
  }
  ThreadsAndDeterminism(const ThreadsAndDeterminism&) = delete;
  ThreadsAndDeterminism& operator=(const ThreadsAndDeterminism&) = delete;

 private:
  int threads_;
  bool deterministic_, warn_only_;
};

// Several threads add the shares of key blocks of one batch entry into its
// rows of dQ. With deterministic algorithms on (and always on the rows path,
// a few queries an entry), a run that starts inside an entry keeps its own
// share, added after the others in run order: at 2, 3 and 4 threads every
// call returns the same bits, and the numbers of 1 thread within float
// rounding. One entry (every run meets in it), three of ragged lengths;
// features in whole tiles (added into dQ's rows) and not (through a share);
// and a few queries against many keys (row by row), without the flag too.
TEST_P(Flash, BackwardSumsAreTheSameFromCallToCall) {
  torch::manual_seed(47);
  struct Case {
    Sizes sizes;
    torch::Tensor lens;
    bool flag;
  };
  const std::vector<Case> cases{{{1, 151, 411, 64, 64}, torch::tensor({400}), true},
                                {{1, 151, 411, 24, 40}, torch::Tensor(), true},
                                {{3, 70, 600, 16, 8}, torch::tensor({600, 3, 457}), true},
                                {{2, 3, 2000, 32, 32}, torch::tensor({1999, 1200}), false},
                                // Eight equal entries: the runs that share an entry order
                                // their sums by scheduling, without the flag.
                                {{8, 70, 300, 16, 8}, torch::Tensor(), false}};
  for (const auto& c : cases) {
    const auto qkv = in_dtype(random_qkv(c.sizes), torch::kFloat);
    const auto upstream = torch::randn({c.sizes.B, c.sizes.n, c.sizes.dv});
    auto run = [&] {
      return value_and_grads([&](const auto& in) { return attend(in, c.lens, Path::kFused); },
                             qkv, upstream);
    };
    std::vector<torch::Tensor> one;
    {
      ThreadsAndDeterminism scope(1, c.flag);
      one = run();
    }
    for (const int threads : {2, 3, 4}) {
      ThreadsAndDeterminism scope(threads, c.flag);
      const std::string what = fmt::format("B={} n={} d={} threads {}", c.sizes.B, c.sizes.n,
                                           c.sizes.d, threads);
      const auto first = run();
      for (int call = 0; call < 6; ++call) {
        const auto again = run();
        for (size_t i = 0; i < first.size(); ++i) {
          EXPECT_TRUE(torch::equal(first[i], again[i])) << what << " call " << call << " output "
                                                        << i;
        }
      }
      for (size_t i = 0; i < first.size(); ++i) {
        EXPECT_LT(max_rel_error(first[i], one[i]), 1e-5) << what << " output " << i;
      }
    }
  }
}

// With weights asked for, the kernel writes them as it goes (Note [Flash
// attention]); a gradient reaching them takes the saved-weights backward.
TEST_P(Flash, WeightsMatchCompositeForwardAndBackwardInEveryDtype) {
  const std::vector<Sizes> cases = {
      {2, 1, 1, 1, 1}, {3, 5, 9, 7, 3}, {2, 31, 257, 9, 17}, {2, 50, 530, 12, 33}};
  torch::manual_seed(28);
  for (const auto& c : cases) {
    const auto qkv = random_qkv(c);
    const auto all_lens = every_kind_of_lengths(c);
    for (size_t l = 0; l < all_lens.size(); ++l) {
      for (const auto& tol : runnable_dtypes()) {
        for (int weights : {1, 2}) {
          const auto what = fmt::format("B={} n={} m={} d={} dv={} lens#{} {} weights {}", c.B, c.n,
                                        c.m, c.d, c.dv, l, c10::toString(tol.dtype), weights);
          check_against_composite(in_dtype(qkv, tol.dtype), all_lens[l], tol, what, weights);
        }
      }
    }
  }
}

// Weights past a row's length are exactly 0, a row with no valid key has all
// 0, and inf or NaN stored in padding reaches neither the weights nor any
// gradient, with a gradient through the weights too.
TEST_P(Flash, WeightsOfPaddingAreZeroAndStayClean) {
  torch::manual_seed(29);
  const int64_t B = 3, n = 7, m = 300;
  const auto q = torch::randn({B, n, 8}), k = torch::randn({B, m, 8}), v = torch::randn({B, m, 4});
  const auto lens = torch::tensor({0, 37, 260});
  const auto G = torch::ones({B, n, 4}), H = torch::randn({B, n, m});
  const auto clean = with_weights({q, k, v}, lens, Path::kFused, true, G, H);
  EXPECT_EQ(clean[1][0].abs().sum().item<float>(), 0);
  EXPECT_EQ(clean[1][1].narrow(1, 37, m - 37).abs().sum().item<float>(), 0);
  EXPECT_NEAR(clean[1][1].sum().item<float>(), n, 1e-4);
  auto k_bad = k.clone(), v_bad = v.clone();
  k_bad[1].narrow(0, 37, m - 37).fill_(std::numeric_limits<float>::infinity());
  v_bad[1].narrow(0, 37, m - 37).fill_(std::numeric_limits<float>::quiet_NaN());
  v_bad[2].narrow(0, 260, m - 260).fill_(-std::numeric_limits<float>::infinity());
  const auto dirty = with_weights({q, k_bad, v_bad}, lens, Path::kFused, true, G, H);
  for (size_t i = 0; i < clean.size(); ++i) {
    EXPECT_TRUE(torch::equal(clean[i], dirty[i])) << "output " << i;
  }
}

TEST_P(Flash, NonContiguousInputsMatchComposite) {
  torch::manual_seed(22);
  const auto q = torch::randn({20, 3, 40}, torch::kDouble).permute({1, 0, 2}).narrow(2, 0, 11);
  const auto k = torch::randn({3, 11, 300}, torch::kDouble).transpose(1, 2);
  const auto v = torch::randn({3, 300, 12}, torch::kDouble).narrow(2, 2, 6);
  ASSERT_FALSE(q.is_contiguous() || k.is_contiguous() || v.is_contiguous());
  const auto lens =
      torch::tensor({{0, 5, 300, 299, 1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 400}})
          .expand({3, 20});
  check_against_composite({q, k, v}, lens, kFastPathDtypes[0], "non-contiguous, expanded lengths");
  check_against_composite({q, k, v}, lens, kFastPathDtypes[0], "non-contiguous, weights", 2);
}

// Rows with no valid key give zeros and zero gradients; keys past every
// length get zero gradients; inf and NaN stored in the padding never reach
// an output or a gradient: bit for bit on 1 thread. On 2 threads the key
// blocks of a batch entry add their shares of dQ in the order the threads
// reach its lock, so dQ's last bits may differ between two runs: there the
// gradients must be NaN-free and equal within rounding.
void expect_padding_stays_clean(int64_t n) {
  torch::manual_seed(23);
  const int64_t B = 3, m = 300, d = 8;
  auto q = torch::randn({B, n, d}), k = torch::randn({B, m, d}), v = torch::randn({B, m, 4});
  const auto lens = torch::tensor({0, 37, 260});
  auto k_bad = k.clone(), v_bad = v.clone();
  k_bad[1].narrow(0, 37, m - 37).fill_(std::numeric_limits<float>::infinity());
  v_bad[1].narrow(0, 37, m - 37).fill_(std::numeric_limits<float>::quiet_NaN());
  k_bad[2].narrow(0, 260, m - 260).fill_(std::numeric_limits<float>::quiet_NaN());
  v_bad[2].narrow(0, 260, m - 260).fill_(-std::numeric_limits<float>::infinity());
  // Bit for bit wherever dQ's sums have one order: 1 thread, the rows path,
  // deterministic algorithms.
  for (const auto [threads, flag] : {std::pair{1, false}, {2, false}, {2, true}}) {
    ThreadsAndDeterminism scope(threads, flag);
    const bool same_bits = threads == 1 || flag || n <= 12;
    SCOPED_TRACE(fmt::format("{} threads, deterministic {}", threads, flag));
    const auto clean = value_and_grads(
        [&](const auto& in) { return attend(in, lens, Path::kFused); }, {q, k, v},
        torch::ones({B, n, 4}));
    EXPECT_EQ(clean[0][0].abs().sum().item<float>(), 0);
    EXPECT_EQ(clean[1][0].abs().sum().item<float>(), 0);
    EXPECT_EQ(clean[2].narrow(1, 37, m - 37)[1].abs().sum().item<float>(), 0);
    EXPECT_EQ(clean[3].narrow(1, 260, m - 260)[2].abs().sum().item<float>(), 0);
    const auto dirty = value_and_grads(
        [&](const auto& in) { return attend(in, lens, Path::kFused); }, {q, k_bad, v_bad},
        torch::ones({B, n, 4}));
    for (size_t i = 0; i < clean.size(); ++i) {
      EXPECT_TRUE(same_bits ? torch::equal(clean[i], dirty[i])
                            : torch::allclose(clean[i], dirty[i], 1e-5, 1e-6))
          << "output " << i;
      EXPECT_FALSE(dirty[i].isnan().any().item<bool>()) << "output " << i;
    }
  }
}

// With 40 queries the forward's blocks and the backward's register tiles run,
// with 3 both run row by row.
TEST_P(Flash, ZeroLengthRowsAndNonFinitePaddingStayClean) {
  for (const int64_t n : {40, 3}) {
    SCOPED_TRACE(fmt::format("{} queries", n));
    expect_padding_stays_clean(n);
  }
}

TEST_P(Flash, DoubleBackwardMatchesComposite) {
  torch::manual_seed(24);
  const auto q = torch::randn({2, 5, 6}, torch::kDouble),
             k = torch::randn({2, 9, 6}, torch::kDouble);
  const auto v = torch::randn({2, 9, 3}, torch::kDouble);
  const auto lens = torch::tensor({{1, 0, 9, 12, 4}, {3, 3, 3, 3, 3}});
  auto second_order = [&](Path path) {
    std::vector<torch::Tensor> in{q.clone().requires_grad_(), k.clone().requires_grad_(),
                                  v.clone().requires_grad_()};
    const auto y = attend(in, lens, path);
    const auto g = torch::autograd::grad({(y * y).sum()}, in, {}, true, true);
    return torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum()}, in);
  };
  const auto flash = second_order(Path::kFused), composite = second_order(Path::kComposite);
  for (size_t i = 0; i < flash.size(); ++i) EXPECT_LT(max_rel_error(flash[i], composite[i]), 1e-11);
  // With the weights in the first-order loss as well.
  auto with_weights_second_order = [&](Path path) {
    std::vector<torch::Tensor> in{q.clone().requires_grad_(), k.clone().requires_grad_(),
                                  v.clone().requires_grad_()};
    auto [y, w] = d2l::functional::dot_product_attention(in[0], in[1], in[2], lens, 0.0, false,
                                                         path, /*need_weights=*/true);
    const auto g = torch::autograd::grad({(y * y).sum() + (w * w).sum()}, in, {}, true, true);
    return torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum()}, in);
  };
  const auto flash_w = with_weights_second_order(Path::kFused);
  const auto composite_w = with_weights_second_order(Path::kComposite);
  for (size_t i = 0; i < flash_w.size(); ++i) {
    EXPECT_LT(max_rel_error(flash_w[i], composite_w[i]), 1e-11) << "with weights, input " << i;
  }
}

// Work is split by cost over threads, and dQ gathered from per-thread shares:
// the same numbers at 1 and 2 threads, whichever thread takes which keys.
TEST_P(Flash, SameNumbersAtOneAndTwoThreads) {
  torch::manual_seed(25);
  // 70 queries: blocks and register tiles; 2: row by row in both passes.
  for (const int64_t n : {70, 2}) {
    const auto q = torch::randn({3, n, 16}, torch::kDouble),
               k = torch::randn({3, 600, 16}, torch::kDouble);
    const auto v = torch::randn({3, 600, 8}, torch::kDouble);
    const auto lens = torch::tensor({600, 3, 257});
    const int saved = at::get_num_threads();
    std::vector<std::vector<torch::Tensor>> runs;
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      runs.push_back(value_and_grads([&](const auto& in) { return attend(in, lens, Path::kFused); },
                                     {q, k, v}, torch::ones({3, n, 8}, torch::kDouble)));
    }
    at::set_num_threads(saved);
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_LT(max_rel_error(runs[0][i], runs[1][i]), 1e-13) << n << " queries, output " << i;
    }
  }
}

// Without autograd (NoGradGuard, InferenceMode) the kernel runs directly;
// the inputs are never modified.
TEST_P(Flash, WithoutAutogradMatchesCompositeAndLeavesInputsAlone) {
  torch::manual_seed(26);
  const auto q = torch::randn({2, 33, 12}), k = torch::randn({2, 270, 12});
  const auto v = torch::randn({2, 270, 5});
  const auto q0 = q.clone(), k0 = k.clone(), v0 = v.clone();
  const auto lens = torch::tensor({270, 100});
  const auto expected = attend({q, k, v}, lens, Path::kComposite);
  {
    torch::NoGradGuard no_grad;
    EXPECT_LT(max_rel_error(attend({q, k, v}, lens, Path::kFused), expected), 2e-6);
  }
  {
    c10::InferenceMode inference;
    EXPECT_LT(max_rel_error(attend({q, k, v}, lens, Path::kAuto), expected), 2e-6);
  }
  EXPECT_TRUE(torch::equal(q, q0) && torch::equal(k, k0) && torch::equal(v, v0));
}

INSTANTIATE_TEST_SUITE_P(Isa, Flash, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

// The modules take the flash kernel, with the composite path's numbers,
// whether they record weights or not.
TEST(FlashModules, DotProductAndMultiHeadWithoutWeightsMatchComposite) {
  torch::manual_seed(27);
  const auto q = torch::randn({2, 40, 8}), k = torch::randn({2, 300, 8}),
             v = torch::randn({2, 300, 8});
  const auto lens = torch::tensor({299, 3});
  d2l::DotProductAttention flash(d2l::DotProductAttentionOptions().record_attention_weights(false));
  d2l::DotProductAttention composite(d2l::DotProductAttentionOptions().path(Path::kComposite));
  EXPECT_LT(max_rel_error(flash(q, k, v, lens), composite(q, k, v, lens)), 2e-6);
  EXPECT_FALSE(flash->attention_weights.defined());
  d2l::DotProductAttention recording;  // the default: the book's, weights recorded
  EXPECT_LT(max_rel_error(recording(q, k, v, lens), composite(q, k, v, lens)), 2e-6);
  EXPECT_LT(max_rel_error(recording->last_attention_weights(), composite->last_attention_weights()),
            2e-6);

  auto options = d2l::MultiHeadAttentionOptions(8, 8, 8, 8, 2).bias(true);
  d2l::MultiHeadAttention mha_flash(
      d2l::MultiHeadAttentionOptions(options).record_attention_weights(false));
  d2l::MultiHeadAttention mha_composite(
      d2l::MultiHeadAttentionOptions(options).path(Path::kComposite));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : mha_flash->named_parameters()) {
      p.value().copy_(mha_composite->named_parameters()[p.key()]);
    }
  }
  const auto got =
      value_and_grads([&](const auto& in) { return mha_flash(in[0], in[1], in[2], lens); },
                      {q, k, v}, torch::ones({2, 40, 8}));
  const auto want =
      value_and_grads([&](const auto& in) { return mha_composite(in[0], in[1], in[2], lens); },
                      {q, k, v}, torch::ones({2, 40, 8}));
  expect_close(got, want, kFastPathDtypes[1], "multi-head");
}

}  // namespace
