// The flash dot-product kernel (AttentionBackend::kFused or kAuto without training-time
// dropout, Note [Flash attention]), with and without weights, against the composite (book) path:
// forward and backward in every dtype, odd sizes around the register tiles and the query and key
// blocks, non-contiguous inputs, zero-length rows, lengths above the key
// count, non-finite padding, double backward, threads, and the modules that
// choose it, under every instruction set this machine runs.
//
// This file: sizes, lengths, decoding rows and blocks, forward and backward;
// test_flash_attention_numerics.cpp: threads, weights, padding, double
// backward and the modules (and the suite's instantiation).

#include <d2l/dot_product_attention.h>
#include <d2l/multi_head_attention.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "checks.h"
#include "flash_helpers.h"
#include "fused_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::attend;
using d2l::testing::check_against_composite;
using d2l::testing::DtypeTolerance;
using d2l::testing::every_kind_of_lengths;
using d2l::testing::expect_close;
using d2l::testing::Flash;
using d2l::testing::in_dtype;
using d2l::testing::kFastPathDtypes;
using d2l::testing::max_rel_error;
using d2l::testing::on_one_thread;
using d2l::testing::random_qkv;
using d2l::testing::runnable_dtypes;
using d2l::testing::Sizes;
using d2l::testing::value_and_grads;
using d2l::testing::with_weights;

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

// The kernel's float exponential across its range, through the weights it
// makes: one feature, a query of 1 and keys 0, -80/m, ..., so that the
// scores are the keys (scale 1 at d = 1) and each row's maximum is 0. Each
// weight over the row's first (e^0 / sum) is e^s, free of the sum's
// rounding: it must be within the exponential's own error (AVX2's base-2
// polynomial 2.1e-7, AVX-512's 2.2e-7: Note [Base-2 exponentials in the
// flash kernel]) plus the rounding of the exponent, |s| 2^-23 (a score
// multiplied by scale · log2 e, then less the maximum), and three roundings
// of the division and the weights. In blocks of queries (8) and row by row
// (1), in key blocks of both passes of the weights; weights below 2^-100
// are left out (their exponent is near the bottom of float's).
TEST_P(Flash, ExponentialWithinItsErrorAcrossItsRange) {
  const int64_t m = 3000;
  const auto keys = (-torch::arange(m, torch::kDouble) * (80.0 / m)).to(torch::kFloat);
  const auto s = keys.to(torch::kDouble);  // the scores, exactly
  const auto values = torch::randn({1, m, 4});
  for (const int64_t n : {1, 8}) {
    const auto q = torch::ones({1, n, 1});
    const auto [out, weights] = d2l::functional::dot_product_attention(
        q, keys.view({1, m, 1}), values,
        d2l::functional::DotProductAttentionFuncOptions().need_weights(true).backend(
            AttentionBackend::kFused));
    for (int64_t i = 0; i < n; ++i) {
      const auto w = weights[0][i].to(torch::kDouble);
      const auto ratio = w / w[0];
      const auto exact = s.exp();
      const auto bound = 2.2e-7 + s.abs() * 0x1p-23 + 3 * 0x1p-24;
      const auto kept = exact > 0x1p-100;
      const auto excess = ((ratio / exact - 1).abs() - bound).masked_select(kept);
      EXPECT_LE(excess.max().item<double>(), 0.0)
          << n << " queries, row " << i << ": worst relative error "
          << (ratio / exact - 1).abs().masked_select(kept).max().item<double>();
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
  for (const auto& [dtype, far, tol] :
       {std::tuple{torch::kDouble, -3000.0, 1e-12}, std::tuple{torch::kFloat, -300.0, 1e-5}}) {
    auto k = torch::randn({1, m, d}, torch::kDouble);
    k.narrow(1, 0, 700).select(2, 0).fill_(-std::numeric_limits<double>::infinity());
    k.narrow(1, 700, m - 700).select(2, 0).fill_(far);
    const std::vector<torch::Tensor> qkv{q.to(dtype), k.to(dtype), v.to(dtype)};
    const auto flash = attend(qkv, torch::Tensor(), AttentionBackend::kFused);
    EXPECT_FALSE(flash.isnan().any().item<bool>()) << dtype << " threads " << at::get_num_threads();
    EXPECT_TRUE(torch::allclose(flash, attend(qkv, torch::Tensor(), AttentionBackend::kComposite),
                                tol, tol))
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
        check_against_composite(
            in_dtype({q, k, v}, tol.dtype), lens, tol,
            fmt::format("n={} lengths {} {}", n, lens.defined(), c10::toString(tol.dtype)));
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
    for (const Sizes& c :
         {Sizes{1, 1, 1500, 24, 40}, Sizes{1, 3, 2100, 64, 64}, Sizes{2, 1, 1100, 16, 16}}) {
      const auto qkv = random_qkv(c);
      const auto ragged = torch::tensor({0, 700, 2100}).narrow(0, 3 - c.n, c.n);
      for (const auto& lens : {torch::Tensor(), torch::full({c.B, c.n}, 1030, torch::kLong),
                               ragged.view({1, c.n}).expand({c.B, c.n})}) {
        for (const auto& tol : runnable_dtypes()) {
          check_against_composite(
              in_dtype(qkv, tol.dtype), lens, tol,
              fmt::format("threads {} B={} n={} m={} lengths {} {}", threads, c.B, c.n, c.m,
                          lens.defined(), c10::toString(tol.dtype)));
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
          check_against_composite({q.to(tol.dtype), k.to(tol.dtype), v.to(tol.dtype)}, all_lens[l],
                                  tol,
                                  fmt::format("d {} dv {} threads {} lens#{} {}", d, dv, threads, l,
                                              c10::toString(tol.dtype)),
                                  0);
        }
      }
    }
    at::set_num_threads(saved);
  }
}

}  // namespace
