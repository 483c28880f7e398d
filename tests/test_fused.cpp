// The fused CPU kernels against the composite (book) path: forward and
// backward, every dtype, odd sizes around the vector width, non-contiguous
// inputs, zero-length rows and lengths above the key count, under every
// instruction set this machine runs.

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

#include "additive_attention.h"
#include "checks.h"
#include "cpu/additive_attention_kernel.h"
#include "fused_helpers.h"
#include "linear.h"
#include "test_utils.h"

namespace {

using d2l::Path;
using d2l::testing::error_message;
using d2l::testing::masked_softmax_by;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

using d2l::testing::DtypeTolerance;
using d2l::testing::expect_close;
using d2l::testing::Fused;
using d2l::testing::kFastPathDtypes;
using d2l::testing::runnable_isas;
using d2l::testing::value_and_grads;

TEST_P(Fused, MaskedSoftmaxMatchesCompositeForwardAndBackward) {
  torch::manual_seed(11);
  for (int64_t m : {1, 3, 7, 8, 9, 16, 17, 33, 100}) {
    const auto X64 = torch::randn({3, 5, m}, torch::kDouble) * 3;
    const auto lens = torch::randint(0, m + 3, {3, 5});
    const auto G = torch::randn({3, 5, m}, torch::kDouble);
    for (const auto& tol : kFastPathDtypes) {
      const auto X = X64.to(tol.dtype);
      auto run = [&](auto fn) {
        return value_and_grads([&](const auto& in) { return fn(in[0], lens); }, {X}, G);
      };
      expect_close(run(masked_softmax_by(Path::kFused)), run(masked_softmax_by(Path::kComposite)),
                   tol, "masked_softmax m=" + std::to_string(m));
    }
  }
}

// Large enough for the kernel to split rows over threads by cost (tasks of
// one batch entry with (B) lengths, 16 rows otherwise, ragged last task):
// the composite's numbers, and the same bits at 1 and 2 threads.
TEST_P(Fused, MaskedSoftmaxSplitOverThreadsByCost) {
  torch::manual_seed(12);
  const int64_t B = 37, n = 45, m = 100;
  const auto X = torch::randn({B, n, m}) * 3;
  const auto G = torch::randn({B, n, m});
  const std::vector<torch::Tensor> all_lens{torch::randint(0, m + 3, {B}),
                                            torch::randint(0, m + 3, {B, n}), torch::Tensor()};
  const int saved = at::get_num_threads();
  for (const auto& lens : all_lens) {
    auto run = [&](Path path) {
      return value_and_grads([&](const auto& in) { return d2l::masked_softmax(in[0], lens, path); },
                             {X}, G);
    };
    const std::string what = lens.defined() ? "lengths " + d2l::detail::shape_of(lens) : "none";
    at::set_num_threads(1);
    const auto one = run(Path::kFused);
    at::set_num_threads(2);
    const auto two = run(Path::kFused);
    at::set_num_threads(saved);
    expect_close(two, run(Path::kComposite), kFastPathDtypes[1], what);  // float
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_TRUE(torch::equal(one[i], two[i])) << what << " output " << i;
    }
  }
}

// The float kernels' own exponential (AVX2 and AVX-512; SLEEF elsewhere)
// over the whole range a softmax feeds it, [-87.3, 0], and beyond: one row
// of 4099 scores (whole vectors and a tail) against the softmax in double.
// Where the result is a normal float, within 3e-7 relative (ours reach
// 2.4e-7, SLEEF 1e-7, and ours with its degree-6 coefficient off by a fifth
// 7.8e-7); below, zero or a subnormal. -inf and -1e30 give exact zeros, -100
// zero or a subnormal, and a NaN score makes its row NaN as in ATen.
TEST_P(Fused, MaskedSoftmaxExponentialIsAccurateOverTheWholeFloatRange) {
  const int64_t m = 4099;
  const auto x64 = torch::linspace(-90.0, 0.0, m, torch::kDouble).view({1, 1, m});
  const auto y = d2l::masked_softmax(x64.to(torch::kFloat), torch::tensor({m}), Path::kFused);
  const auto ref = torch::softmax(x64.to(torch::kFloat).to(torch::kDouble), -1);
  const auto err = (y.to(torch::kDouble) - ref).abs();
  const auto normal = ref > std::numeric_limits<float>::min();
  EXPECT_LT((err / ref).masked_select(normal).max().item<double>(), 3e-7);
  EXPECT_LT(err.masked_select(~normal).max().item<double>(), 2 * std::numeric_limits<float>::min());

  const float inf = std::numeric_limits<float>::infinity();
  const auto hostile = torch::tensor({0.0f, -inf, -1e30f, -100.0f, -87.0f, -1.0f}).view({1, 1, 6});
  const auto h = d2l::masked_softmax(hostile, torch::tensor({6}), Path::kFused).view({6});
  const auto h_ref = torch::softmax(hostile.to(torch::kDouble), -1).view({6});
  for (int64_t j : {1, 2}) EXPECT_EQ(h[j].item<float>(), 0.0f) << "entry " << j;
  EXPECT_LT(h[3].item<float>(), std::numeric_limits<float>::min());
  for (int64_t j : {0, 4, 5}) {
    EXPECT_NEAR(h[j].item<double>() / h_ref[j].item<double>(), 1.0, 1e-6) << "entry " << j;
  }
  auto with_nan = hostile.clone();
  with_nan[0][0][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(
      d2l::masked_softmax(with_nan, torch::tensor({6}), Path::kFused).isnan().all().item<bool>());
  // Past the length, a NaN is masked away.
  EXPECT_FALSE(
      d2l::masked_softmax(with_nan, torch::tensor({3}), Path::kFused).isnan().any().item<bool>());
}

// The row maximum that keeps the exponentials finite must see every valid
// lane: one score of 1000 (e^1000 overflows float and double) at each
// position of rows around the vector widths, zeros elsewhere, in every
// dtype. The answer is exactly one-hot; a maximum that missed the lane would
// give inf / inf = NaN.
TEST_P(Fused, MaskedSoftmaxRowMaximumSeesEveryLane) {
  for (int64_t m : {1, 5, 8, 10, 15, 16, 17, 31, 33}) {
    const auto eye = torch::eye(m, torch::kDouble).view({1, m, m});
    for (const auto& tol : kFastPathDtypes) {
      const auto X = (eye * 1000).to(tol.dtype);
      const auto y = d2l::masked_softmax(X, torch::full({1, m}, m, torch::kLong), Path::kFused);
      EXPECT_TRUE(torch::equal(y.to(torch::kDouble), eye)) << "m=" << m << " " << tol.dtype;
    }
  }
}

TEST_P(Fused, MaskedSoftmaxOnNonContiguousInputWithOneDimLengths) {
  const auto X = torch::randn({9, 4, 2}, torch::kDouble).permute({2, 1, 0});  // (2, 4, 9)
  const auto lens = torch::tensor({0, 11});
  const auto G = torch::randn({2, 4, 9}, torch::kDouble);
  auto run = [&](auto fn) {
    return value_and_grads([&](const auto& in) { return fn(in[0], lens); }, {X}, G);
  };
  expect_close(run(masked_softmax_by(Path::kFused)), run(masked_softmax_by(Path::kComposite)),
               kFastPathDtypes[0], "non-contiguous");
}

TEST_P(Fused, MaskedSoftmaxDoubleBackwardMatchesComposite) {
  const auto X = torch::randn({2, 3, 5}, torch::kDouble);
  const auto lens = torch::tensor({{1, 5, 0}, {3, 2, 9}});
  auto second_order = [&](auto fn) {
    auto x = X.clone().requires_grad_();
    const auto y = fn(x, lens);
    auto g = torch::autograd::grad({(y * y).sum()}, {x}, {}, true, true)[0];
    return torch::autograd::grad({g.pow(2).sum()}, {x})[0];
  };
  EXPECT_LT(max_rel_error(second_order(masked_softmax_by(Path::kFused)),
                          second_order(masked_softmax_by(Path::kComposite))),
            1e-11);
}

// Scores and weights of the fused additive kernel against the composite path,
// for queries, keys and w_v gradients.
void check_additive(int64_t B, int64_t n, int64_t m, int64_t h, const torch::Tensor& lens,
                    const DtypeTolerance& tol) {
  const auto q = (torch::randn({B, n, h}, torch::kDouble) * 0.7).to(tol.dtype);
  const auto k = (torch::randn({B, m, h}, torch::kDouble) * 0.7).to(tol.dtype);
  const auto w = torch::randn({1, h}, torch::kDouble).to(tol.dtype);
  const auto G = torch::randn({B, n, m}, torch::kDouble);
  auto scores = [&](Path path) {
    return value_and_grads(
        [&](const auto& in) { return d2l::functional::additive_scores(in[0], in[1], in[2], path); },
        {q, k, w}, G);
  };
  auto weights = [&](Path path) {
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
    auto fused_scores = scores(Path::kFused);
    auto ref = to_double([&](const auto& in) {
      return d2l::functional::additive_scores(in[0], in[1], in[2], Path::kComposite);
    });
    for (auto& t : ref) t = t.to(tol.dtype);
    expect_close(fused_scores, ref, tol, "scores " + what);
    return;
  }
  expect_close(scores(Path::kFused), scores(Path::kComposite), tol, "scores " + what);
  expect_close(weights(Path::kFused), weights(Path::kComposite), tol, "weights " + what);
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
  d2l::AdditiveAttention fused(d2l::AdditiveAttentionOptions(5, 6, 12).path(Path::kFused));
  d2l::AdditiveAttention composite(d2l::AdditiveAttentionOptions(5, 6, 12).path(Path::kComposite));
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

// Additive attention through the values (the fused kernel's forward_values
// and backward_values, taken whenever no dropout is drawn): output, weights
// and the gradients of queries, keys, values and the three weights, for a
// loss on the output, on the weights, or on both.
enum class AdditiveLoss { kOutput, kWeights, kBoth };

std::vector<torch::Tensor> additive_through_values(const std::vector<torch::Tensor>& inputs,
                                                   const torch::Tensor& lens, Path path,
                                                   AdditiveLoss loss, const torch::Tensor& G_out,
                                                   const torch::Tensor& G_weights) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  auto [out, weights] = d2l::functional::additive_attention(
      leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5], lens, 0.0, false, path);
  torch::Tensor total = torch::zeros({}, out.options());
  if (loss != AdditiveLoss::kWeights) total = total + (out * G_out.to(out.scalar_type())).sum();
  if (loss != AdditiveLoss::kOutput) {
    total = total + (weights * G_weights.to(weights.scalar_type())).sum();
  }
  total.backward();
  std::vector<torch::Tensor> result{out.detach(), weights.detach()};
  for (const auto& t : leaves) {
    result.push_back(t.grad().defined() ? t.grad() : torch::zeros_like(t));
  }
  return result;
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
          const auto fused =
              additive_through_values(inputs, lens, Path::kFused, loss, G_out, G_weights);
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
            const auto ref = additive_through_values(rounded, lens, Path::kComposite, loss,
                                                     G_out.to(tol.dtype).to(torch::kDouble),
                                                     G_weights.to(tol.dtype).to(torch::kDouble));
            const auto composite =
                additive_through_values(inputs, lens, Path::kComposite, loss, G_out, G_weights);
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
            expect_close(
                fused,
                additive_through_values(inputs, lens, Path::kComposite, loss, G_out, G_weights),
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
    return additive_through_values({q, k, values, W_q, W_k, w_v}, lens, Path::kFused,
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
  EXPECT_LT(max_rel_error(a[0], additive_through_values({q, k, clean, W_q, W_k, w_v}, lens,
                                                        Path::kComposite, AdditiveLoss::kBoth, G,
                                                        torch::ones({B, n, m}, torch::kDouble))[0]),
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
    runs.push_back(additive_through_values(inputs, lens, Path::kFused, AdditiveLoss::kOutput, G,
                                           torch::Tensor()));
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
           return additive_through_values(inputs, lens, Path::kFused, AdditiveLoss::kBoth, G, H);
         }},
        {"weights alone", [&] {
           return value_and_grads(
               [&](const auto& in) {
                 return d2l::detail::additive_weights_nocheck(in[0], in[1], in[2], lens,
                                                              Path::kFused);
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

TEST_P(Fused, DotProductImplsAgreeForwardAndBackward) {
  torch::manual_seed(14);
  for (const auto& tol : {kFastPathDtypes[0], kFastPathDtypes[1]}) {
    const auto q = torch::randn({2, 5, 7}).to(tol.dtype), k = torch::randn({2, 9, 7}).to(tol.dtype);
    const auto v = torch::randn({2, 9, 3}).to(tol.dtype);
    const auto lens = torch::tensor({{1, 0, 9, 12, 4}, {3, 3, 3, 3, 3}});
    auto run = [&](Path path) {
      return value_and_grads(
          [&](const auto& in) {
            return std::get<0>(
                d2l::functional::dot_product_attention(in[0], in[1], in[2], lens, 0, false, path));
          },
          {q, k, v}, torch::randn({2, 5, 3}, torch::kDouble));
    };
    torch::manual_seed(15);
    const auto fused = run(Path::kFused);
    torch::manual_seed(15);
    expect_close(fused, run(Path::kComposite), tol, "dot");
  }
}

// Without autograd the fused path writes the weights over its own bmm result:
// same numbers as the composite path under NoGradGuard and InferenceMode, for
// every kind of lengths and odd key counts, and the inputs stay untouched.
TEST_P(Fused, DotProductWithoutAutogradMatchesComposite) {
  torch::manual_seed(16);
  for (const auto& tol : {kFastPathDtypes[0], kFastPathDtypes[1]}) {
    for (int64_t m : {1, 7, 9, 17}) {
      const auto q = torch::randn({3, 4, 5}).to(tol.dtype),
                 k = torch::randn({3, m, 5}).to(tol.dtype);
      const auto v = torch::randn({3, m, 2}).to(tol.dtype);
      const auto q0 = q.clone(), k0 = k.clone(), v0 = v.clone();
      for (const auto& lens :
           {torch::Tensor(), torch::randint(0, m + 2, {3}), torch::randint(0, m + 2, {3, 4})}) {
        const auto expected =
            d2l::functional::dot_product_attention(q, k, v, lens, 0, false, Path::kComposite);
        auto check = [&](const char* mode) {
          const auto [out, weights] =
              d2l::functional::dot_product_attention(q, k, v, lens, 0, false, Path::kFused);
          const auto what = fmt::format("{} {} m={}", mode, c10::toString(tol.dtype), m);
          EXPECT_LT(max_rel_error(out, std::get<0>(expected)), tol.forward) << what;
          EXPECT_LT(max_rel_error(weights, std::get<1>(expected)), tol.forward) << what;
          EXPECT_TRUE(weights.is_contiguous()) << what;
        };
        {
          torch::NoGradGuard no_grad;
          check("no_grad");
        }
        {
          c10::InferenceMode inference;
          check("inference");
        }
      }
      EXPECT_TRUE(torch::equal(q, q0) && torch::equal(k, k0) && torch::equal(v, v0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, Fused, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

TEST(FusedKernels, FastTanhIsAccurateOverTheWholeFloatRange) {
  // Every 257th bit pattern (all exponents and many mantissas), both signs.
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 257) {
    float f;
    const auto b = static_cast<uint32_t>(bits);
    std::memcpy(&f, &b, sizeof f);
    if (!std::isnan(f)) x.push_back(f);
  }
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  const auto saved = d2l::cpu_isa();
  for (auto isa : runnable_isas()) {
    d2l::set_cpu_isa(isa);
    std::vector<float> y(x.size());
    const auto n = static_cast<int64_t>(x.size());
    d2l::cpu::additive_attention_kernels().tanh(torch::from_blob(x.data(), {n}),
                                                torch::from_blob(y.data(), {n}));
    double worst_abs = 0, worst_ulps = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double exact = std::tanh(static_cast<double>(x[i]));
      const double err = std::abs(y[i] - exact);
      const double ulp = std::nextafter(static_cast<float>(std::abs(exact)), 2.0f) -
                         static_cast<float>(std::abs(exact));
      worst_abs = std::max(worst_abs, err);
      worst_ulps = std::max(worst_ulps, err / std::max(ulp, 1e-45));
    }
    EXPECT_LT(worst_abs, 5e-7) << d2l::to_string(isa);
    EXPECT_LT(worst_ulps, 8) << d2l::to_string(isa);
    // NaN stays NaN, in every lane of a vector and in a partial tail.
    std::vector<float> nan_in(37, std::numeric_limits<float>::quiet_NaN()), nan_out(37);
    d2l::cpu::additive_attention_kernels().tanh(torch::from_blob(nan_in.data(), {37}),
                                                torch::from_blob(nan_out.data(), {37}));
    EXPECT_TRUE(std::all_of(nan_out.begin(), nan_out.end(), [](float v) { return std::isnan(v); }))
        << d2l::to_string(isa);
  }
  d2l::set_cpu_isa(saved);
}

TEST(FusedKernels, ChunkedScoresMatchCompositeAcrossManyChunks) {
  torch::manual_seed(16);
  const auto q = torch::randn({2, 13, 6}, torch::kDouble),
             k = torch::randn({2, 5, 6}, torch::kDouble);
  const auto w = torch::randn({1, 6}, torch::kDouble);
  const auto G = torch::randn({2, 13, 5}, torch::kDouble);
  // 2 * 5 * 6 doubles per query: 1 KiB blocks hold two queries, so 7 blocks.
  const auto chunked = value_and_grads(
      [&](const auto& in) {
        return d2l::detail::chunked_additive_scores(in[0], in[1], in[2], 1024);
      },
      {q, k, w}, G);
  const auto composite = value_and_grads(
      [&](const auto& in) {
        return d2l::functional::additive_scores(in[0], in[1], in[2], Path::kComposite);
      },
      {q, k, w}, G);
  expect_close(chunked, composite, kFastPathDtypes[0], "chunked");
}

TEST(FusedKernels, FusedAdditiveRefusesDoubleBackwardClearly) {
  const auto q = torch::randn({1, 2, 3}, torch::kDouble).requires_grad_();
  const auto k = torch::randn({1, 4, 3}, torch::kDouble);
  const auto w = torch::randn({1, 3}, torch::kDouble);
  const auto s = d2l::functional::additive_scores(q, k, w, Path::kFused);
  EXPECT_THAT(error_message([&] { torch::autograd::grad({s.sum()}, {q}, {}, true, true); }),
              HasSubstr("the fused CPU kernel has no double backward; use Path::kComposite"));
}

TEST(FusedKernels, FusedAdditiveThroughValuesRefusesDoubleBackwardClearly) {
  const auto q = torch::randn({1, 2, 3}, torch::kDouble).requires_grad_();
  const auto k = torch::randn({1, 4, 3}, torch::kDouble),
             v = torch::randn({1, 4, 2}, torch::kDouble);
  const auto W = torch::randn({5, 3}, torch::kDouble), w_v = torch::randn({1, 5}, torch::kDouble);
  const auto out = std::get<0>(
      d2l::functional::additive_attention(q, k, v, W, W, w_v, {}, 0.0, false, Path::kFused));
  EXPECT_THAT(error_message([&] { torch::autograd::grad({out.sum()}, {q}, {}, true, true); }),
              HasSubstr("the fused CPU kernel has no double backward; use Path::kComposite"));
}

// Dropout in training keeps the weights, dropout, bmm path: under the same
// seed it draws the same mask as the composite path and gives its numbers.
TEST(FusedKernels, AdditiveWithDropoutInTrainingMatchesComposite) {
  const auto q = torch::randn({2, 5, 3}, torch::kDouble),
             k = torch::randn({2, 6, 4}, torch::kDouble);
  const auto v = torch::randn({2, 6, 7}, torch::kDouble);
  const auto W_q = torch::randn({8, 3}, torch::kDouble), W_k = torch::randn({8, 4}, torch::kDouble);
  const auto w_v = torch::randn({1, 8}, torch::kDouble);
  const auto lens = torch::tensor({3, 6});
  auto run = [&](Path path) {
    torch::manual_seed(18);
    auto leaf = v.clone().requires_grad_();
    const auto out = std::get<0>(
        d2l::functional::additive_attention(q, k, leaf, W_q, W_k, w_v, lens, 0.5, true, path));
    out.sum().backward();
    return std::vector<torch::Tensor>{out.detach(), leaf.grad()};
  };
  const auto fused = run(Path::kFused), composite = run(Path::kComposite);
  EXPECT_LT(max_rel_error(fused[0], composite[0]), 1e-12);
  EXPECT_LT(max_rel_error(fused[1], composite[1]), 1e-12);
  // And the mask is drawn: some weight was dropped, the rest scaled by 2.
  torch::manual_seed(18);
  const auto kept = std::get<0>(
      d2l::functional::additive_attention(q, k, v, W_q, W_k, w_v, lens, 0.5, false, Path::kFused));
  EXPECT_GT(max_rel_error(fused[0], kept), 1e-3);
}

// No keys: zero outputs, zero gradients, and a values gradient of no rows.
TEST(FusedKernels, AdditiveThroughValuesWithNoKeys) {
  const std::vector<torch::Tensor> inputs{
      torch::randn({2, 3, 2}, torch::kDouble), torch::randn({2, 0, 3}, torch::kDouble),
      torch::randn({2, 0, 6}, torch::kDouble), torch::randn({4, 2}, torch::kDouble),
      torch::randn({4, 3}, torch::kDouble),    torch::randn({1, 4}, torch::kDouble)};
  // An empty batch first: its allocations must not leave the next output unwritten.
  std::get<0>(d2l::functional::additive_attention(
      torch::randn({0, 3, 2}, torch::kDouble), torch::randn({0, 5, 3}, torch::kDouble),
      torch::randn({0, 5, 6}, torch::kDouble), inputs[3], inputs[4], inputs[5]));
  const auto result =
      additive_through_values(inputs, torch::tensor({0, 0}), Path::kFused, AdditiveLoss::kBoth,
                              torch::ones({2, 3, 6}, torch::kDouble), torch::ones({2, 3, 0}));
  EXPECT_EQ(result[0].sizes(), (std::vector<int64_t>{2, 3, 6}));
  EXPECT_EQ(result[4].sizes(), (std::vector<int64_t>{2, 0, 6}));
  for (size_t i = 0; i < result.size(); ++i) {
    EXPECT_EQ(result[i].numel() == 0 ? 0.0 : result[i].abs().max().item<double>(), 0.0)
        << "output " << i;
  }
}

TEST(FusedKernels, RecordingWeightsCanBeTurnedOff) {
  d2l::DotProductAttention dot(d2l::DotProductAttentionOptions().record_attention_weights(false));
  d2l::AdditiveAttention add(
      d2l::AdditiveAttentionOptions(2, 2, 4).record_attention_weights(false));
  const auto q = torch::randn({1, 2, 2}), k = torch::randn({1, 3, 2}), v = torch::randn({1, 3, 2});
  EXPECT_EQ(dot(q, k, v).sizes(), add(q, k, v).sizes());
  EXPECT_FALSE(dot->attention_weights.defined());
  EXPECT_FALSE(add->attention_weights.defined());
}

TEST(FusedKernels, FusedImplRefusesOtherDevices) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  d2l::DotProductAttention dot(d2l::DotProductAttentionOptions().path(Path::kFused));
  const auto q = torch::randn({1, 2, 2}).cuda();
  EXPECT_THAT(
      error_message([&] { dot(q, q, q); }),
      HasSubstr("d2l::dot_product_attention: Path::kFused runs on the CPU, got tensors on cuda:0"));
}

TEST(FusedKernels, IsaCanBeChosenAndNamed) {
  const auto saved = d2l::cpu_isa();
  // Without D2L_CPU_ISA in the environment, the widest runnable one is chosen.
  if (std::getenv("D2L_CPU_ISA") == nullptr) EXPECT_EQ(saved, runnable_isas().back());
  d2l::set_cpu_isa(d2l::CpuIsa::kDefault);
  EXPECT_EQ(d2l::cpu_isa(), d2l::CpuIsa::kDefault);
  EXPECT_EQ(d2l::to_string(d2l::cpu_isa()), "default");
  EXPECT_EQ(d2l::to_string(d2l::CpuIsa::kAvx2), "avx2");
  EXPECT_EQ(d2l::to_string(d2l::CpuIsa::kAvx512), "avx512");
  EXPECT_TRUE(d2l::cpu_isa_available(d2l::CpuIsa::kDefault));
  for (auto isa : {d2l::CpuIsa::kAvx2, d2l::CpuIsa::kAvx512}) {
    if (d2l::cpu_isa_available(isa)) continue;
    EXPECT_THAT(error_message([&] { d2l::set_cpu_isa(isa); }),
                HasSubstr("d2l::set_cpu_isa: " + d2l::to_string(isa) + " kernels cannot run here"));
    EXPECT_EQ(d2l::cpu_isa(), d2l::CpuIsa::kDefault);
  }
  d2l::set_cpu_isa(saved);
}

}  // namespace

namespace {

// Sizes ATen's pool to `threads` and OpenBLAS's to 1 (where there is one) for
// a scope, then restores both.
class ThreadsForScope {
 public:
  explicit ThreadsForScope(int64_t threads) : saved_(d2l::cpu_threads()) {
    d2l::set_num_threads(threads);
  }
  ~ThreadsForScope() {
    d2l::set_num_threads(saved_.intra_op, std::max<int64_t>(saved_.openblas, 1));
  }
  ThreadsForScope(const ThreadsForScope&) = delete;
  ThreadsForScope& operator=(const ThreadsForScope&) = delete;

 private:
  d2l::CpuThreads saved_;
};

// Where OpenBLAS is LibTorch's BLAS (Debian's 1.13), d2l::set_num_threads(2)
// makes detail::linear split its products; with MKL (the wheels) it never does.
bool blas_is_openblas() { return d2l::cpu_threads().openblas > 0; }

}  // namespace

TEST(FusedKernels, LinearSplitsOverThreadsOnlyWhereOpenBlasRunsOnOne) {
  const auto x = torch::randn({8, 128, 64}), W = torch::randn({64, 64});
  {
    ThreadsForScope two(2);
    EXPECT_EQ(d2l::detail::linear_splits_over_threads(x, W), blas_is_openblas());
    EXPECT_EQ(d2l::detail::linear_splits_over_threads(x.to(torch::kDouble), W.to(torch::kDouble)),
              blas_is_openblas());
    // Small products, other dtypes, mismatched shapes: functional::linear.
    // (A seq2seq decoder step: 64 x 32 x 32 multiply-adds. The book's (64, 10,
    // 32) projections, 10 times that, are split.)
    EXPECT_FALSE(d2l::detail::linear_splits_over_threads(torch::randn({64, 1, 32}),
                                                         torch::randn({32, 32})));
    EXPECT_EQ(d2l::detail::linear_splits_over_threads(torch::randn({64, 10, 32}),
                                                      torch::randn({32, 32})),
              blas_is_openblas());
    EXPECT_FALSE(
        d2l::detail::linear_splits_over_threads(x.to(torch::kBFloat16), W.to(torch::kBFloat16)));
    EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, torch::randn({64, 65})));
    EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, W.to(torch::kDouble)));
    if (blas_is_openblas()) {
      // OpenBLAS's pool of 2 threads does the splitting itself.
      d2l::set_num_threads(2, 2);
      EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, W));
    }
  }
  ThreadsForScope one(1);
  EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, W));
}

// Forward, every gradient and a double backward of detail::linear against
// functional::linear, split over 2 threads, in float and double, with and
// without a bias, on 2-D, 3-D and non-contiguous inputs; inputs untouched.
TEST(FusedKernels, LinearSplitOverThreadsMatchesFunctionalLinear) {
  ThreadsForScope two(2);
  torch::manual_seed(31);
  struct Case {
    std::vector<int64_t> x_sizes;
    int64_t out;
    bool bias, transposed;
  };
  const std::vector<Case> cases{{{6, 101, 64}, 48, false, false},
                                {{6, 101, 64}, 48, true, false},
                                {{700, 96}, 33, true, false},
                                {{5, 64, 130}, 40, false, true}};
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    // Split by rows, BLAS may sum the weight gradient's hundreds of products
    // in another order (2.2e-5 measured in float), and the second derivatives
    // multiply such sums (2.5e-4); double holds everything to 1e-12.
    const bool is_float = dtype == torch::kFloat;
    for (const auto& c : cases) {
      auto x = torch::randn(c.x_sizes, dtype);
      if (c.transposed) x = x.transpose(1, 2);  // (5, 130, 64), non-contiguous
      const int64_t in = x.size(-1);
      const auto W = torch::randn({c.out, in}, dtype);
      const auto b = c.bias ? torch::randn({c.out}, dtype) : torch::Tensor();
      const std::string what = fmt::format("{} x {} out {} bias {}", c10::toString(dtype),
                                           d2l::detail::shape_of(x), c.out, c.bias);
      ASSERT_EQ(d2l::detail::linear_splits_over_threads(x, W), blas_is_openblas()) << what;
      const auto x_before = x.clone(), W_before = W.clone();
      auto sizes = x.sizes().vec();
      sizes.back() = c.out;
      const auto G = torch::randn(sizes, dtype);
      auto run = [&](bool split) {
        auto xl = x.detach().clone().requires_grad_(), Wl = W.detach().clone().requires_grad_();
        auto bl = c.bias ? b.detach().clone().requires_grad_() : torch::Tensor();
        const auto y =
            split ? d2l::detail::linear(xl, Wl, bl) : torch::nn::functional::linear(xl, Wl, bl);
        std::vector<torch::Tensor> leaves{xl, Wl};
        if (c.bias) leaves.push_back(bl);
        // First gradients with a graph, then a second backward through them.
        const auto grads = torch::autograd::grad({(y * G).sum()}, leaves, {}, true, true);
        auto second = torch::zeros({}, dtype);
        for (const auto& g : grads) second = second + (g * g).sum();
        const auto grads2 = torch::autograd::grad({second}, leaves, {}, false, false, true);
        std::vector<torch::Tensor> result{y.detach()};
        for (const auto& g : grads) result.push_back(g.detach());
        for (const auto& g : grads2) result.push_back(g.defined() ? g : torch::zeros({}, dtype));
        // The plain backward (no graph): the split path's own kernels.
        auto xp = x.detach().clone().requires_grad_(), Wp = W.detach().clone().requires_grad_();
        auto bp = c.bias ? b.detach().clone().requires_grad_() : torch::Tensor();
        const auto yp =
            split ? d2l::detail::linear(xp, Wp, bp) : torch::nn::functional::linear(xp, Wp, bp);
        (yp * G).sum().backward();
        result.push_back(xp.grad());
        result.push_back(Wp.grad());
        if (c.bias) result.push_back(bp.grad());
        return result;
      };
      const auto split = run(true), plain = run(false);
      ASSERT_EQ(split.size(), plain.size()) << what;
      for (size_t i = 0; i < split.size(); ++i) {
        EXPECT_EQ(split[i].sizes(), plain[i].sizes()) << what << " result " << i;
        const double tol = !is_float ? 1e-12 : i == 0 ? 1e-5 : 1e-3;
        EXPECT_LT(max_rel_error(split[i], plain[i]), tol) << what << " result " << i;
      }
      EXPECT_TRUE(torch::equal(x, x_before)) << what;
      EXPECT_TRUE(torch::equal(W, W_before)) << what;
    }
  }
  // Bad shapes keep functional::linear's own error.
  EXPECT_THROW(d2l::detail::linear(torch::randn({4, 300, 64}), torch::randn({64, 63})), c10::Error);
}

// The modules whose projections split: the same outputs and gradients at 2
// threads (OpenBLAS at 1) as at 1 thread.
TEST(FusedKernels, ModulesWithSplitProjectionsMatchOneThread) {
  torch::manual_seed(32);
  const int64_t B = 4, n = 96, m = 80, d = 64;
  const auto q = torch::randn({B, n, d}), k = torch::randn({B, m, d}), v = torch::randn({B, m, d});
  const auto lens = torch::randint(0, m + 1, {B});
  const auto G = torch::randn({B, n, d});
  d2l::AdditiveAttention additive(d2l::AdditiveAttentionOptions(d, d, 64));
  d2l::MultiHeadAttention mha(d2l::MultiHeadAttentionOptions(d, d, d, 64, 4).bias(true));
  additive->eval();
  mha->eval();
  auto run = [&](int64_t threads) {
    ThreadsForScope scope(threads);
    if (threads > 1) {
      EXPECT_EQ(d2l::detail::linear_splits_over_threads(q, additive->W_q->weight),
                blas_is_openblas());
    }
    std::vector<torch::Tensor> result;
    for (auto& params : {additive->parameters(), mha->parameters()}) {
      for (auto p : params) p.mutable_grad().reset();
    }
    auto run_one = [&](const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
                       const std::vector<torch::Tensor>& params) {
      auto out = value_and_grads(f, {q, k, v}, G);
      for (const auto& p : params) out.push_back(p.grad().clone());
      result.insert(result.end(), out.begin(), out.end());
    };
    run_one([&](const auto& in) { return additive(in[0], in[1], in[2], lens); },
            additive->parameters());
    run_one([&](const auto& in) { return mha(in[0], in[1], in[2], lens); }, mha->parameters());
    return result;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_LT(max_rel_error(two[i], one[i]), 1e-5) << "result " << i;
  }
}

// In float and double without dropout, AdditiveAttention is one autograd node
// (projections and kernel), whose inputs are the module's leaves themselves;
// it returns the gradients asked for, and only those, with the composite
// path's values, also where the projections split over 2 threads.
TEST(FusedKernels, AdditiveIsOneAutogradNodeGivingTheGradientsAsked) {
  torch::manual_seed(19);
  for (const int64_t threads : {1, 2}) {
    ThreadsForScope scope(threads);
    // (B n) q h = 4·96·32·64: the products split at 2 threads (OpenBLAS at 1).
    const int64_t B = 4, n = 96, m = 70, h = 64;
    for (const bool freeze : {false, true}) {
      const auto what = fmt::format("threads {} freeze {}", threads, freeze);
      std::vector<torch::Tensor> grads[2];
      for (const Path path : {Path::kFused, Path::kComposite}) {
        torch::manual_seed(20);
        auto q = torch::randn({B, n, 32}).requires_grad_(), k = torch::randn({B, m, 24});
        auto v = torch::randn({B, m, 5}).requires_grad_(!freeze);
        auto W_q = (torch::randn({h, 32}) * 0.3).requires_grad_(!freeze);
        auto W_k = (torch::randn({h, 24}) * 0.3).requires_grad_();
        auto w_v = torch::randn({1, h}).requires_grad_();
        const auto lens = torch::randint(0, m + 1, {B, n});
        auto [out, weights] =
            d2l::functional::additive_attention(q, k, v, W_q, W_k, w_v, lens, 0.0, false, path);
        if (path == Path::kFused) {
          const auto& node = out.grad_fn();
          ASSERT_TRUE(node) << what;
          EXPECT_THAT(node->name(), HasSubstr("AdditiveProjectedFunction")) << what;
          EXPECT_EQ(weights.grad_fn(), node) << what;
          for (const auto& edge : node->next_edges()) {
            if (edge.function) EXPECT_THAT(edge.function->name(), HasSubstr("AccumulateGrad"));
          }
        }
        (out.sum() + (weights * weights).sum()).backward();
        EXPECT_FALSE(k.grad().defined()) << what;
        for (const auto& t : {q, v, W_q, W_k, w_v}) {
          EXPECT_EQ(t.grad().defined(), t.requires_grad()) << what;
          if (t.grad().defined()) grads[path == Path::kFused ? 0 : 1].push_back(t.grad());
        }
      }
      ASSERT_EQ(grads[0].size(), grads[1].size()) << what;
      for (size_t i = 0; i < grads[0].size(); ++i) {
        EXPECT_LT(max_rel_error(grads[0][i], grads[1][i]), 2e-4) << what << " gradient " << i;
      }
    }
  }
}
