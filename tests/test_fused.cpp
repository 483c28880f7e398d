// The fused CPU kernels against the composite (book) path: forward and
// backward, every dtype, odd sizes around the vector width, non-contiguous
// inputs, zero-length rows and lengths above the key count, under every
// instruction set this machine runs.
//
// This file: the masked softmax and dot-product attention under every
// instruction set, and the instantiation of the Fused suite for the other
// test_fused_*.cpp files; test_fused_additive.cpp, test_fused_kernels.cpp and
// test_fused_linear.cpp hold the rest.

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
      expect_close(run(masked_softmax_by(AttentionBackend::kFused)),
                   run(masked_softmax_by(AttentionBackend::kComposite)), tol,
                   "masked_softmax m=" + std::to_string(m));
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
    auto run = [&](AttentionBackend path) {
      return value_and_grads([&](const auto& in) { return d2l::masked_softmax(in[0], lens, path); },
                             {X}, G);
    };
    const std::string what = lens.defined() ? "lengths " + d2l::detail::shape_of(lens) : "none";
    at::set_num_threads(1);
    const auto one = run(AttentionBackend::kFused);
    at::set_num_threads(2);
    const auto two = run(AttentionBackend::kFused);
    at::set_num_threads(saved);
    expect_close(two, run(AttentionBackend::kComposite), kFastPathDtypes[1], what);  // float
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
  const auto y =
      d2l::masked_softmax(x64.to(torch::kFloat), torch::tensor({m}), AttentionBackend::kFused);
  const auto ref = torch::softmax(x64.to(torch::kFloat).to(torch::kDouble), -1);
  const auto err = (y.to(torch::kDouble) - ref).abs();
  const auto normal = ref > std::numeric_limits<float>::min();
  EXPECT_LT((err / ref).masked_select(normal).max().item<double>(), 3e-7);
  EXPECT_LT(err.masked_select(~normal).max().item<double>(), 2 * std::numeric_limits<float>::min());

  const float inf = std::numeric_limits<float>::infinity();
  const auto hostile = torch::tensor({0.0f, -inf, -1e30f, -100.0f, -87.0f, -1.0f}).view({1, 1, 6});
  const auto h =
      d2l::masked_softmax(hostile, torch::tensor({6}), AttentionBackend::kFused).view({6});
  const auto h_ref = torch::softmax(hostile.to(torch::kDouble), -1).view({6});
  for (int64_t j : {1, 2}) EXPECT_EQ(h[j].item<float>(), 0.0f) << "entry " << j;
  EXPECT_LT(h[3].item<float>(), std::numeric_limits<float>::min());
  for (int64_t j : {0, 4, 5}) {
    EXPECT_NEAR(h[j].item<double>() / h_ref[j].item<double>(), 1.0, 1e-6) << "entry " << j;
  }
  auto with_nan = hostile.clone();
  with_nan[0][0][3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(d2l::masked_softmax(with_nan, torch::tensor({6}), AttentionBackend::kFused)
                  .isnan()
                  .all()
                  .item<bool>());
  // Past the length, a NaN is masked away.
  EXPECT_FALSE(d2l::masked_softmax(with_nan, torch::tensor({3}), AttentionBackend::kFused)
                   .isnan()
                   .any()
                   .item<bool>());
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
      const auto y =
          d2l::masked_softmax(X, torch::full({1, m}, m, torch::kLong), AttentionBackend::kFused);
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
  expect_close(run(masked_softmax_by(AttentionBackend::kFused)),
               run(masked_softmax_by(AttentionBackend::kComposite)), kFastPathDtypes[0],
               "non-contiguous");
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
  EXPECT_LT(max_rel_error(second_order(masked_softmax_by(AttentionBackend::kFused)),
                          second_order(masked_softmax_by(AttentionBackend::kComposite))),
            1e-11);
}

TEST_P(Fused, DotProductImplsAgreeForwardAndBackward) {
  torch::manual_seed(14);
  for (const auto& tol : {kFastPathDtypes[0], kFastPathDtypes[1]}) {
    const auto q = torch::randn({2, 5, 7}).to(tol.dtype), k = torch::randn({2, 9, 7}).to(tol.dtype);
    const auto v = torch::randn({2, 9, 3}).to(tol.dtype);
    const auto lens = torch::tensor({{1, 0, 9, 12, 4}, {3, 3, 3, 3, 3}});
    auto run = [&](AttentionBackend path) {
      return value_and_grads(
          [&](const auto& in) {
            return std::get<0>(d2l::functional::dot_product_attention(
                in[0], in[1], in[2],
                d2l::functional::DotProductAttentionFuncOptions()
                    .valid_lens(lens)
                    .dropout(0)
                    .training(false)
                    .backend(path)));
          },
          {q, k, v}, torch::randn({2, 5, 3}, torch::kDouble));
    };
    torch::manual_seed(15);
    const auto fused = run(AttentionBackend::kFused);
    torch::manual_seed(15);
    expect_close(fused, run(AttentionBackend::kComposite), tol, "dot");
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
            d2l::functional::dot_product_attention(q, k, v,
                                                   d2l::functional::DotProductAttentionFuncOptions()
                                                       .valid_lens(lens)
                                                       .dropout(0)
                                                       .training(false)
                                                       .backend(AttentionBackend::kComposite));
        auto check = [&](const char* mode) {
          const auto [out, weights] = d2l::functional::dot_product_attention(
              q, k, v,
              d2l::functional::DotProductAttentionFuncOptions()
                  .valid_lens(lens)
                  .dropout(0)
                  .training(false)
                  .backend(AttentionBackend::kFused));
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

}  // namespace
