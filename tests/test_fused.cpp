// The fused CPU kernels against the composite (book) path: forward and
// backward, every dtype, odd sizes around the vector width, non-contiguous
// inputs, zero-length rows and lengths above the key count, under every
// instruction set this machine runs.

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "additive_attention.h"
#include "cpu/additive_attention_kernel.h"
#include "fused_helpers.h"
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

TEST_P(Fused, AdditiveMatchesCompositeAcrossShapesAndDtypes) {
  torch::manual_seed(12);
  for (const auto& tol : kFastPathDtypes) {
    for (auto [n, m, h] : {std::tuple{1, 10, 8}, {3, 7, 5}, {4, 9, 16}, {2, 17, 3}, {5, 33, 9}}) {
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

INSTANTIATE_TEST_SUITE_P(Isa, Fused, ::testing::ValuesIn(runnable_isas()),
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
