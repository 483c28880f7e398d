// The flash dot-product kernel against the composite path (continued from
// test_flash_attention.cpp): the same bits from call to call and at 1 and 2
// threads, the weights, non-contiguous inputs, padding that stays clean,
// double backward, without autograd, and the modules that choose it.

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
using d2l::testing::ThreadsAndDeterminism;
using d2l::testing::value_and_grads;
using d2l::testing::with_weights;

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
      return value_and_grads(
          [&](const auto& in) { return attend(in, c.lens, AttentionBackend::kFused); }, qkv,
          upstream);
    };
    std::vector<torch::Tensor> one;
    {
      ThreadsAndDeterminism scope(1, c.flag);
      one = run();
    }
    for (const int threads : {2, 3, 4}) {
      ThreadsAndDeterminism scope(threads, c.flag);
      const std::string what =
          fmt::format("B={} n={} d={} threads {}", c.sizes.B, c.sizes.n, c.sizes.d, threads);
      const auto first = run();
      for (int call = 0; call < 6; ++call) {
        const auto again = run();
        for (size_t i = 0; i < first.size(); ++i) {
          EXPECT_TRUE(torch::equal(first[i], again[i]))
              << what << " call " << call << " output " << i;
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
  const auto clean = with_weights({q, k, v}, lens, AttentionBackend::kFused, true, G, H);
  EXPECT_EQ(clean[1][0].abs().sum().item<float>(), 0);
  EXPECT_EQ(clean[1][1].narrow(1, 37, m - 37).abs().sum().item<float>(), 0);
  EXPECT_NEAR(clean[1][1].sum().item<float>(), n, 1e-4);
  auto k_bad = k.clone(), v_bad = v.clone();
  k_bad[1].narrow(0, 37, m - 37).fill_(std::numeric_limits<float>::infinity());
  v_bad[1].narrow(0, 37, m - 37).fill_(std::numeric_limits<float>::quiet_NaN());
  v_bad[2].narrow(0, 260, m - 260).fill_(-std::numeric_limits<float>::infinity());
  const auto dirty = with_weights({q, k_bad, v_bad}, lens, AttentionBackend::kFused, true, G, H);
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
    const auto clean =
        value_and_grads([&](const auto& in) { return attend(in, lens, AttentionBackend::kFused); },
                        {q, k, v}, torch::ones({B, n, 4}));
    EXPECT_EQ(clean[0][0].abs().sum().item<float>(), 0);
    EXPECT_EQ(clean[1][0].abs().sum().item<float>(), 0);
    EXPECT_EQ(clean[2].narrow(1, 37, m - 37)[1].abs().sum().item<float>(), 0);
    EXPECT_EQ(clean[3].narrow(1, 260, m - 260)[2].abs().sum().item<float>(), 0);
    const auto dirty =
        value_and_grads([&](const auto& in) { return attend(in, lens, AttentionBackend::kFused); },
                        {q, k_bad, v_bad}, torch::ones({B, n, 4}));
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
  auto second_order = [&](AttentionBackend path) {
    std::vector<torch::Tensor> in{q.clone().requires_grad_(), k.clone().requires_grad_(),
                                  v.clone().requires_grad_()};
    const auto y = attend(in, lens, path);
    const auto g = torch::autograd::grad({(y * y).sum()}, in, {}, true, true);
    return torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum()}, in);
  };
  const auto flash = second_order(AttentionBackend::kFused),
             composite = second_order(AttentionBackend::kComposite);
  for (size_t i = 0; i < flash.size(); ++i) EXPECT_LT(max_rel_error(flash[i], composite[i]), 1e-11);
  // With the weights in the first-order loss as well.
  auto with_weights_second_order = [&](AttentionBackend path) {
    std::vector<torch::Tensor> in{q.clone().requires_grad_(), k.clone().requires_grad_(),
                                  v.clone().requires_grad_()};
    auto [y, w] =
        d2l::functional::dot_product_attention(in[0], in[1], in[2],
                                               d2l::functional::DotProductAttentionFuncOptions()
                                                   .valid_lens(lens)
                                                   .dropout(0.0)
                                                   .training(false)
                                                   .backend(path)
                                                   .need_weights(true));
    const auto g = torch::autograd::grad({(y * y).sum() + (w * w).sum()}, in, {}, true, true);
    return torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum()}, in);
  };
  const auto flash_w = with_weights_second_order(AttentionBackend::kFused);
  const auto composite_w = with_weights_second_order(AttentionBackend::kComposite);
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
      runs.push_back(value_and_grads(
          [&](const auto& in) { return attend(in, lens, AttentionBackend::kFused); }, {q, k, v},
          torch::ones({3, n, 8}, torch::kDouble)));
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
  const auto expected = attend({q, k, v}, lens, AttentionBackend::kComposite);
  {
    torch::NoGradGuard no_grad;
    EXPECT_LT(max_rel_error(attend({q, k, v}, lens, AttentionBackend::kFused), expected), 2e-6);
  }
  {
    c10::InferenceMode inference;
    EXPECT_LT(max_rel_error(attend({q, k, v}, lens, AttentionBackend::kAuto), expected), 2e-6);
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
  d2l::DotProductAttention composite(
      d2l::DotProductAttentionOptions().backend(AttentionBackend::kComposite));
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
      d2l::MultiHeadAttentionOptions(options).backend(AttentionBackend::kComposite));
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
