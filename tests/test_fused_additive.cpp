// The fused additive attention kernel against the composite (book) path under
// every instruction set (the Fused suite, instantiated in test_fused.cpp):
// scores, weights, the kernel through the values, its splits over threads.

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "additive_attention_internal.h"
#include "checks.h"
#include "cpu/additive_attention_kernel.h"
#include "fused_helpers.h"
#include "linear.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::error_message;
using d2l::testing::masked_softmax_by;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

using d2l::testing::additive_through_values;
using d2l::testing::AdditiveLoss;
using d2l::testing::DtypeTolerance;
using d2l::testing::expect_close;
using d2l::testing::Fused;
using d2l::testing::kFastPathDtypes;
using d2l::testing::runnable_isas;
using d2l::testing::value_and_grads;

// Scores and weights of the fused additive kernel against the composite path,
// for queries, keys and w_v gradients.
void check_additive(int64_t B, int64_t n, int64_t m, int64_t h, const torch::Tensor& lens,
                    const DtypeTolerance& tol) {
  const auto q = (torch::randn({B, n, h}, torch::kDouble) * 0.7).to(tol.dtype);
  const auto k = (torch::randn({B, m, h}, torch::kDouble) * 0.7).to(tol.dtype);
  const auto w = torch::randn({1, h}, torch::kDouble).to(tol.dtype);
  const auto G = torch::randn({B, n, m}, torch::kDouble);
  auto scores = [&](AttentionBackend path) {
    return value_and_grads(
        [&](const auto& in) {
          return d2l::functional::additive_scores(
              in[0], in[1], in[2], d2l::functional::AdditiveScoresFuncOptions().backend(path));
        },
        {q, k, w}, G);
  };
  auto weights = [&](AttentionBackend path) {
    return value_and_grads(
        [&](const auto& in) {
          return d2l::detail::additive_weights_nocheck(in[0], in[1], in[2], lens, path);
        },
        {q, k, w}, G);
  };
  const auto what = fmt::format("B={} n={} m={} h={}", B, n, m, h);
  // Reduced precision: the composite path rounds every intermediate to the
  // dtype, the kernel accumulates in float; compare both to float64 instead.
  if (tol.dtype == torch::kHalf || tol.dtype == torch::kBFloat16) {
    auto to_double = [&](auto fn) {
      return value_and_grads(fn, {q.to(torch::kDouble), k.to(torch::kDouble), w.to(torch::kDouble)},
                             G);
    };
    auto fused_scores = scores(AttentionBackend::kFused);
    auto ref = to_double([&](const auto& in) {
      return d2l::functional::additive_scores(
          in[0], in[1], in[2],
          d2l::functional::AdditiveScoresFuncOptions().backend(AttentionBackend::kComposite));
    });
    for (auto& t : ref) t = t.to(tol.dtype);
    expect_close(fused_scores, ref, tol, "scores " + what);
    return;
  }
  expect_close(scores(AttentionBackend::kFused), scores(AttentionBackend::kComposite), tol,
               "scores " + what);
  expect_close(weights(AttentionBackend::kFused), weights(AttentionBackend::kComposite), tol,
               "weights " + what);
}

// The kernel loops over keys or over hidden units, whichever computes fewer
// tanh lanes for the call's lengths. With 4, 8 or 16 lanes a vector (every
// instruction set and dtype), m = 3 at h = 32 and m = 2 at h = 20 (hidden
// units padded to whole vectors) always go over hidden units, and m = 40 at
// h = 3 over keys; the other shapes go either way.
TEST_P(Fused, AdditiveMatchesCompositeAcrossShapesAndDtypes) {
  torch::manual_seed(12);
  for (const auto& tol : kFastPathDtypes) {
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{
        {1, 10, 8}, {3, 7, 5},  {4, 9, 16}, {2, 17, 3},
        {5, 33, 9}, {6, 3, 32}, {5, 2, 20}, {3, 40, 3}};
    for (auto [n, m, h] : shapes) {
      check_additive(2, n, m, h, torch::randint(0, m + 2, {2, n}), tol);
    }
    check_additive(3, 4, 8, 4, torch::tensor({0, 8, 20}), tol);
  }
}

TEST_P(Fused, AdditiveModuleImplsAgreeIncludingNonContiguousInputs) {
  torch::manual_seed(13);
  d2l::AdditiveAttention fused(
      d2l::AdditiveAttentionOptions(5, 6, 12).backend(AttentionBackend::kFused));
  d2l::AdditiveAttention composite(
      d2l::AdditiveAttentionOptions(5, 6, 12).backend(AttentionBackend::kComposite));
  std::stringstream weights;
  torch::save(fused, weights);
  torch::load(composite, weights);
  for (auto* m : {&fused, &composite}) (*m)->to(torch::kDouble);
  const auto q = torch::randn({7, 3, 6}, torch::kDouble).transpose(0, 1);  // (3, 7, 6)
  const auto k = torch::randn({3, 11, 5}, torch::kDouble);
  const auto v = torch::randn({3, 11, 2}, torch::kDouble);
  const auto lens =
      torch::tensor({{1, 0, 11, 4, 5, 6, 30}, {2, 2, 2, 2, 2, 2, 2}, {9, 8, 7, 6, 5, 4, 3}});
  const auto a = fused(q, k, v, lens), b = composite(q, k, v, lens);
  EXPECT_LT(max_rel_error(a, b), 1e-12);
  EXPECT_LT(max_rel_error(fused->attention_weights, composite->attention_weights), 1e-12);
  a.sum().backward();
  b.sum().backward();
  for (const auto& name : {"W_q.weight", "W_k.weight", "w_v.weight"}) {
    EXPECT_LT(max_rel_error(fused->named_parameters()[name].grad(),
                            composite->named_parameters()[name].grad()),
              1e-11)
        << name;
  }
}

TEST_P(Fused, AdditiveThroughValuesMatchesCompositeInEveryDtype) {
  torch::manual_seed(15);
  struct Case {
    int64_t B, n, m, query_size, key_size, h, d;
  };
  // d around the vector widths (4, 8, 16 lanes) and across the 4-vector block;
  // the last two over hidden units in every instruction set and dtype (see
  // AdditiveMatchesCompositeAcrossShapesAndDtypes), one with h padded.
  for (const Case& c :
       {Case{2, 1, 10, 3, 4, 8, 2}, Case{2, 3, 7, 5, 6, 5, 9}, Case{3, 4, 9, 4, 4, 16, 17},
        Case{2, 2, 17, 3, 3, 3, 33}, Case{2, 5, 33, 6, 7, 9, 8}, Case{2, 4, 8, 4, 4, 4, 1},
        Case{2, 3, 20, 4, 4, 8, 65}, Case{3, 6, 3, 4, 5, 32, 8}, Case{2, 5, 2, 3, 4, 20, 17}}) {
    const std::vector<torch::Tensor> inputs64{
        torch::randn({c.B, c.n, c.query_size}, torch::kDouble),
        torch::randn({c.B, c.m, c.key_size}, torch::kDouble),
        torch::randn({c.B, c.m, c.d}, torch::kDouble),
        torch::randn({c.h, c.query_size}, torch::kDouble) * 0.5,
        torch::randn({c.h, c.key_size}, torch::kDouble) * 0.5,
        torch::randn({1, c.h}, torch::kDouble)};
    const auto G_out = torch::randn({c.B, c.n, c.d}, torch::kDouble);
    const auto G_weights = torch::randn({c.B, c.n, c.m}, torch::kDouble);
    const std::vector<torch::Tensor> all_lens{
        torch::Tensor(), torch::randint(0, c.m + 3, {c.B}), torch::randint(0, c.m + 3, {c.B, c.n}),
        torch::cat({torch::tensor({0}), torch::full({c.B - 1}, c.m + 5, torch::kLong)})};
    for (const auto& lens : all_lens) {
      for (auto loss : {AdditiveLoss::kOutput, AdditiveLoss::kWeights, AdditiveLoss::kBoth}) {
        for (const auto& tol : kFastPathDtypes) {
          // float16 on the CPU is refused where LibTorch cannot multiply it (1.13).
          if (tol.dtype == torch::kHalf && !d2l::detail::cpu_float16_matmul_available()) continue;
          std::vector<torch::Tensor> inputs;
          for (const auto& t : inputs64) inputs.push_back(t.to(tol.dtype));
          const auto what =
              fmt::format("B={} n={} m={} h={} d={} lens {} loss {}", c.B, c.n, c.m, c.h, c.d,
                          lens.defined() ? lens.dim() : -1, static_cast<int>(loss));
          const auto fused = additive_through_values(inputs, lens, AttentionBackend::kFused, loss,
                                                     G_out, G_weights);
          // Reduced precision: the kernel accumulates in float; the reference
          // is the float64 composite result on the same (rounded) inputs and
          // upstream gradients. The fused path must be within the dtype's
          // tolerance of it, or within 1.5x the composite path's own error in
          // that dtype: the W_q and W_k gradients come from the Linear layers'
          // backward, which rounds in the dtype on both paths (in bfloat16 at
          // d = 65 both reach 6-7e-2 here, on different elements).
          if (tol.dtype == torch::kHalf || tol.dtype == torch::kBFloat16) {
            std::vector<torch::Tensor> rounded;
            for (const auto& t : inputs) rounded.push_back(t.to(torch::kDouble));
            const auto ref = additive_through_values(rounded, lens, AttentionBackend::kComposite,
                                                     loss, G_out.to(tol.dtype).to(torch::kDouble),
                                                     G_weights.to(tol.dtype).to(torch::kDouble));
            const auto composite = additive_through_values(
                inputs, lens, AttentionBackend::kComposite, loss, G_out, G_weights);
            ASSERT_EQ(fused.size(), ref.size());
            for (size_t i = 0; i < fused.size(); ++i) {
              EXPECT_EQ(fused[i].scalar_type(), tol.dtype) << what << " output " << i;
              EXPECT_FALSE(fused[i].isnan().any().item<bool>()) << what << " output " << i;
              const double err = max_rel_error(fused[i], ref[i]);
              const double bound = std::max(i == 0 ? tol.forward : tol.backward,
                                            1.5 * max_rel_error(composite[i], ref[i]));
              EXPECT_LE(err, bound)
                  << what << " output " << i << " (" << c10::toString(tol.dtype) << ")";
            }
          } else {
            expect_close(fused,
                         additive_through_values(inputs, lens, AttentionBackend::kComposite, loss,
                                                 G_out, G_weights),
                         tol, what);
          }
        }
      }
    }
  }
}

// Values are read for valid keys only: inf and NaN stored at padding keys
// change nothing (the book's bmm would multiply them by zero weights: NaN),
// non-contiguous values are read as they are, and padding keys get zero
// value gradients.
TEST_P(Fused, AdditiveThroughValuesNeverReadsPaddingValues) {
  torch::manual_seed(16);
  const int64_t B = 3, n = 4, m = 11, d = 10;
  const auto q = torch::randn({B, n, 6}, torch::kDouble);
  const auto k = torch::randn({B, m, 5}, torch::kDouble);
  const auto W_q = torch::randn({12, 6}, torch::kDouble),
             W_k = torch::randn({12, 5}, torch::kDouble);
  const auto w_v = torch::randn({1, 12}, torch::kDouble);
  // Entry 0 reads keys 0..8, entry 1 keys 0..1, entry 2 all of them.
  const auto lens = torch::tensor({{1, 0, 9, 4}, {2, 2, 2, 2}, {9, 8, 7, 30}});
  // Non-contiguous values: (B, d, m) transposed.
  const auto clean = torch::randn({B, d, m}, torch::kDouble).transpose(1, 2);
  auto dirty = clean.clone();
  ASSERT_FALSE(dirty.is_contiguous());
  dirty.select(0, 0).narrow(0, 9, 2).fill_(std::numeric_limits<double>::quiet_NaN());
  dirty.select(0, 1).narrow(0, 2, 9).fill_(std::numeric_limits<double>::infinity());
  const auto G = torch::randn({B, n, d}, torch::kDouble);
  auto run = [&](const torch::Tensor& values) {
    return additive_through_values({q, k, values, W_q, W_k, w_v}, lens, AttentionBackend::kFused,
                                   AdditiveLoss::kBoth, G, torch::ones({B, n, m}, torch::kDouble));
  };
  const auto a = run(clean), b = run(dirty);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(b[i].isnan().any().item<bool>()) << "output " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "output " << i;
  }
  const auto dv = b[4];  // the values' gradient: zero at every padding key
  EXPECT_EQ(dv.select(0, 0).narrow(0, 9, 2).abs().max().item<double>(), 0.0);
  EXPECT_EQ(dv.select(0, 1).narrow(0, 2, 9).abs().max().item<double>(), 0.0);
  EXPECT_LT(
      max_rel_error(a[0], additive_through_values({q, k, clean, W_q, W_k, w_v}, lens,
                                                  AttentionBackend::kComposite, AdditiveLoss::kBoth,
                                                  G, torch::ones({B, n, m}, torch::kDouble))[0]),
      1e-12);
}

// The value gradients of a batch entry are gathered from per-thread buffers:
// the same numbers at 1 and 2 threads, wherever the split falls.
TEST_P(Fused, AdditiveThroughValuesSameNumbersAtOneAndTwoThreads) {
  torch::manual_seed(17);
  const int64_t B = 3, n = 64, m = 70, h = 32, d = 16;
  const std::vector<torch::Tensor> inputs{
      torch::randn({B, n, 8}, torch::kDouble), torch::randn({B, m, 8}, torch::kDouble),
      torch::randn({B, m, d}, torch::kDouble), torch::randn({h, 8}, torch::kDouble),
      torch::randn({h, 8}, torch::kDouble),    torch::randn({1, h}, torch::kDouble)};
  const auto lens = torch::randint(0, m + 2, {B, n});
  const auto G = torch::randn({B, n, d}, torch::kDouble);
  const int saved = at::get_num_threads();
  std::vector<std::vector<torch::Tensor>> runs;
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    runs.push_back(additive_through_values(inputs, lens, AttentionBackend::kFused,
                                           AdditiveLoss::kOutput, G, torch::Tensor()));
  }
  at::set_num_threads(saved);
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_LT(max_rel_error(runs[0][i], runs[1][i]), 1e-13) << "output " << i;
  }
}

// dK and dV of a batch entry gather the shares of the runs that meet in it.
// One entry split over 3 and 4 threads (so three or four runs add into it):
// a run that starts inside the entry adds its share after the others, in run
// order, and every call returns the same bits, through the values and for
// the weights alone; the numbers of 1 thread within float rounding. Over
// keys (m = 70, h = 3) and over hidden units (m = 8, h = 32), and either way
// at m = 70, h = 32 (the loop orders: AdditiveMatchesCompositeAcrossShapes).
TEST_P(Fused, AdditiveBackwardSumsAreTheSameFromCallToCall) {
  for (const auto& [m, h] : {std::pair<int64_t, int64_t>{70, 32}, {70, 3}, {8, 32}}) {
    torch::manual_seed(48);
    const int64_t B = 1, n = 128, d = 16;
    const std::vector<torch::Tensor> inputs{torch::randn({B, n, 8}), torch::randn({B, m, 8}),
                                            torch::randn({B, m, d}), torch::randn({h, 8}),
                                            torch::randn({h, 8}),    torch::randn({1, h})};
    const auto lens = torch::randint(0, m + 2, {B, n});
    const auto G = torch::randn({B, n, d}), H = torch::randn({B, n, m});
    const std::vector<torch::Tensor> projected{torch::randn({B, n, h}), torch::randn({B, m, h}),
                                               torch::randn({1, h})};
    const std::vector<std::pair<std::string, std::function<std::vector<torch::Tensor>()>>> passes{
        {"through the values",
         [&] {
           return additive_through_values(inputs, lens, AttentionBackend::kFused,
                                          AdditiveLoss::kBoth, G, H);
         }},
        {"weights alone", [&] {
           return value_and_grads(
               [&](const auto& in) {
                 return d2l::detail::additive_weights_nocheck(in[0], in[1], in[2], lens,
                                                              AttentionBackend::kFused);
               },
               projected, H);
         }}};
    const int saved = at::get_num_threads();
    for (const auto& [name, pass] : passes) {
      at::set_num_threads(1);
      const auto one = pass();
      for (const int threads : {3, 4}) {
        at::set_num_threads(threads);
        const auto first = pass();
        for (int call = 0; call < 6; ++call) {
          const auto again = pass();
          for (size_t i = 0; i < first.size(); ++i) {
            EXPECT_TRUE(torch::equal(first[i], again[i]))
                << name << ", m " << m << ", h " << h << ", " << threads << " threads, call "
                << call << ", output " << i;
          }
        }
        for (size_t i = 0; i < first.size(); ++i) {
          EXPECT_LT(max_rel_error(first[i], one[i]), 1e-4)
              << name << ", m " << m << ", h " << h << ", " << threads << " threads, output " << i;
        }
      }
    }
    at::set_num_threads(saved);
  }
}

}  // namespace
