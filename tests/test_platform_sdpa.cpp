// The SDPA path of dot-product attention (LibTorch 2.1+) against the
// composite oracle: forward and backward in every dtype SDPA has a CPU kernel
// for, lengths of every kind, non-contiguous inputs, non-finite padding,
// empty sizes, the modules, dropout and double backward. Skipped on LibTorch
// versions without SDPA (test_platform.cpp checks its errors there).

#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/multi_head_attention.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "platform_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::dot;
using d2l::testing::length_cases;
using d2l::testing::max_rel_error;

// Every dtype SDPA has a CPU kernel for, with its tolerance against the
// composite path in the same dtype (reduced precision: both round to it, as
// the BLAS and ATen kernels LibTorch picks for this CPU do, so there the
// bound is also at least 2.5 times the composite path's own error against
// float64 on the same inputs: SDPA as accurate as it, the two differ by up
// to twice that error, and a quarter more for the luck of the draw).
using d2l::testing::DtypeTolerance;
const std::vector<DtypeTolerance> kSdpaDtypes = {{torch::kDouble, 1e-12, 1e-10},
                                                 {torch::kFloat, 2e-6, 2e-5},
                                                 {torch::kBFloat16, 2e-2, 5e-2},
                                                 {torch::kHalf, 3e-3, 1e-2}};

// Forward and backward of the SDPA path against the composite oracle.
void expect_sdpa_matches_composite(const torch::Tensor& q0, const torch::Tensor& k0,
                                   const torch::Tensor& v0, const torch::Tensor& lens,
                                   const DtypeTolerance& c, const std::string& what) {
  auto run = [&](AttentionBackend path, torch::ScalarType dtype) {
    auto q = q0.detach().to(dtype).clone().requires_grad_(),
         k = k0.detach().to(dtype).clone().requires_grad_(),
         v = v0.detach().to(dtype).clone().requires_grad_();
    auto out = std::get<0>(dot(q, k, v, lens, path));
    // The upstream gradient rounded to c.dtype, also for the float64 oracle.
    const auto G = torch::linspace(-1, 1, out.numel(), torch::kDouble)
                       .reshape(out.sizes())
                       .to(c.dtype)
                       .to(dtype);
    (out * G).sum().backward();
    return std::vector<torch::Tensor>{out, q.grad(), k.grad(), v.grad()};
  };
  const auto sdpa = run(AttentionBackend::kSdpa, c.dtype);
  const auto composite = run(AttentionBackend::kComposite, c.dtype);
  const bool reduced = c.dtype == torch::kBFloat16 || c.dtype == torch::kHalf;
  const auto exact = reduced ? run(AttentionBackend::kComposite, torch::kDouble) : composite;
  EXPECT_EQ(sdpa[0].scalar_type(), c.dtype) << what;
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sdpa[i].defined()) << what << " " << names[i];
    const double own = reduced ? max_rel_error(composite[i], exact[i]) : 0.0;
    EXPECT_LT(max_rel_error(sdpa[i], composite[i]),
              std::max(i == 0 ? c.forward : c.backward, 2.5 * own))
        << what << " " << names[i] << " (the composite path's own error: " << own << ")";
  }
}

TEST(Platform, SdpaMatchesTheCompositePathForwardAndBackward) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  torch::manual_seed(11);
  for (const auto& c : kSdpaDtypes) {
    // Odd sizes, a value width unlike the key width, a single key and query.
    for (auto [B, n, m, d, dv] : std::vector<std::array<int64_t, 5>>{
             {3, 5, 7, 4, 3}, {2, 1, 1, 8, 2}, {2, 17, 33, 16, 5}, {1, 64, 129, 64, 64}}) {
      const auto opts = torch::TensorOptions().dtype(c.dtype);
      const auto q = torch::randn({B, n, d}, opts), k = torch::randn({B, m, d}, opts),
                 v = torch::randn({B, m, dv}, opts);
      for (const auto& lens : length_cases(B, n, m)) {
        expect_sdpa_matches_composite(
            q, k, v, lens, c,
            std::string(c10::toString(c.dtype)) + " B" + std::to_string(B) + " n" +
                std::to_string(n) + " m" + std::to_string(m) + " lens " +
                (lens.defined() ? std::to_string(lens.dim()) + "-D" : std::string("none")));
      }
    }
  }
}

TEST(Platform, SdpaComparesReducedPrecisionLengthsExactly) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  torch::manual_seed(16);
  const auto q = torch::randn({2, 3, 8}, torch::kDouble),
             k = torch::randn({2, 600, 8}, torch::kDouble),
             v = torch::randn({2, 600, 4}, torch::kDouble);
  for (const auto& lens :
       {torch::tensor({276, 304}), torch::tensor({{276, 0, 596}, {304, 512, 1}})}) {
    const auto expected = std::get<0>(dot(q, k, v, lens, AttentionBackend::kComposite));
    for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
      const auto out = std::get<0>(dot(q, k, v, lens.to(dtype), AttentionBackend::kSdpa));
      EXPECT_LT(max_rel_error(out, expected), 1e-12) << c10::toString(dtype) << " " << lens.dim();
    }
  }
}

TEST(Platform, SdpaHandlesNonContiguousInputs) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  torch::manual_seed(12);
  const auto q = torch::randn({5, 3, 4}, torch::kDouble).transpose(0, 1);     // (3, 5, 4)
  const auto k = torch::randn({4, 6, 3}, torch::kDouble).permute({2, 1, 0});  // (3, 6, 4)
  const auto v = torch::randn({1, 6, 2}, torch::kDouble).expand({3, 6, 2});
  expect_sdpa_matches_composite(q, k, v, torch::tensor({2, 0, 9}), kSdpaDtypes[0],
                                "non-contiguous");
}

TEST(Platform, SdpaKeepsNonFinitePaddingKeysOut) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  const double inf = std::numeric_limits<double>::infinity();
  for (double bad : {inf, -inf, std::nan("")}) {
    auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 6, 4}), v = torch::randn({2, 6, 2});
    // Keys at and past the longest length of each example are padding.
    k.index_put_({0, 4}, bad);
    k.index_put_({1, 2}, bad);
    for (const auto& lens :
         {torch::tensor({4, 2}), torch::tensor({{4, 1, 0}, {2, 2, 1}}), torch::tensor({2, 2})}) {
      const auto inputs = std::vector<torch::Tensor>{q.clone(), k.clone(), v.clone()};
      const auto sdpa = std::get<0>(dot(q, k, v, lens, AttentionBackend::kSdpa));
      const auto composite = std::get<0>(dot(q, k, v, lens, AttentionBackend::kComposite));
      EXPECT_TRUE(torch::isfinite(sdpa).all().item<bool>()) << bad;
      EXPECT_LT(max_rel_error(sdpa, composite), 2e-6) << bad;
      // Inputs are never modified.
      EXPECT_TRUE(torch::equal(k.isnan(), inputs[1].isnan()));
      EXPECT_TRUE(torch::equal(k.nan_to_num(), inputs[1].nan_to_num()));
    }
  }
}

TEST(Platform, SdpaOnEmptySizesKeepsTheGraph) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  for (auto [B, n, m] : std::vector<std::array<int64_t, 3>>{{0, 3, 4}, {2, 0, 4}, {2, 3, 0}}) {
    const auto q = torch::randn({B, n, 4}).requires_grad_(), k = torch::randn({B, m, 4});
    const auto v = torch::randn({B, m, 2});
    const auto out = std::get<0>(dot(q, k, v, {}, AttentionBackend::kSdpa));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{B, n, 2}));
    EXPECT_TRUE(out.requires_grad());
    EXPECT_EQ(out.abs().sum().item<float>(), 0);
    out.sum().backward();
    EXPECT_TRUE(q.grad().defined());
  }
}

TEST(Platform, ModulesWithoutWeightsRunSdpaWithTheSameNumbers) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  torch::manual_seed(13);
  const auto q = torch::randn({2, 3, 8}), k = torch::randn({2, 5, 8}), v = torch::randn({2, 5, 8});
  const auto lens = torch::tensor({3, 0});
  d2l::DotProductAttention sdpa(d2l::DotProductAttentionOptions()
                                    .backend(AttentionBackend::kSdpa)
                                    .record_attention_weights(false));
  d2l::DotProductAttention composite(
      d2l::DotProductAttentionOptions().backend(AttentionBackend::kComposite));
  EXPECT_LT(max_rel_error(sdpa(q, k, v, lens), composite(q, k, v, lens)), 2e-6);
  EXPECT_FALSE(sdpa->attention_weights.defined());

  auto options = d2l::MultiHeadAttentionOptions(8, 8, 8, 8, 2).bias(true);
  d2l::MultiHeadAttention mha_sdpa(d2l::MultiHeadAttentionOptions(options)
                                       .backend(AttentionBackend::kSdpa)
                                       .record_attention_weights(false));
  d2l::MultiHeadAttention mha_composite(
      d2l::MultiHeadAttentionOptions(options).backend(AttentionBackend::kComposite));
  torch::NoGradGuard no_grad;
  for (auto& p : mha_sdpa->named_parameters())
    p.value().copy_(mha_composite->named_parameters()[p.key()]);
  EXPECT_LT(max_rel_error(mha_sdpa(q, k, v, lens), mha_composite(q, k, v, lens)), 2e-6);
}

TEST(Platform, SdpaDropoutOnlyInTraining) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  d2l::DotProductAttention attention(d2l::DotProductAttentionOptions()
                                         .dropout(1.0)
                                         .backend(AttentionBackend::kSdpa)
                                         .record_attention_weights(false));
  attention->train();
  EXPECT_EQ(attention(q, k, v).abs().sum().item<float>(), 0);
  attention->eval();
  d2l::DotProductAttention composite(
      d2l::DotProductAttentionOptions().backend(AttentionBackend::kComposite));
  EXPECT_LT(max_rel_error(attention(q, k, v), composite(q, k, v)), 2e-6);
}

// create_graph=true through SDPA: second derivatives equal the composite
// path's (LibTorch 2.11 differentiates SDPA's CPU backward).
TEST(Platform, SdpaDoubleBackwardMatchesComposite) {
  if (!d2l::sdpa_available()) GTEST_SKIP() << "LibTorch " << d2l::torch_version() << " has no SDPA";
  torch::manual_seed(15);
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    const auto q0 = torch::randn({2, 3, 4}, dtype), k0 = torch::randn({2, 5, 4}, dtype),
               v0 = torch::randn({2, 5, 2}, dtype);
    auto second = [&](AttentionBackend path) {
      auto q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
           v = v0.clone().requires_grad_();
      const auto out = std::get<0>(dot(q, k, v, torch::tensor({2, 0}), path));
      const auto g = torch::autograd::grad({out.pow(2).sum()}, {q, k, v}, {}, true, true);
      (g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum()).backward();
      return std::vector<torch::Tensor>{q.grad(), k.grad(), v.grad()};
    };
    const auto sdpa = second(AttentionBackend::kSdpa),
               composite = second(AttentionBackend::kComposite);
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(max_rel_error(sdpa[i], composite[i]), dtype == torch::kDouble ? 1e-10 : 1e-4)
          << c10::toString(dtype) << " input " << i;
    }
  }
}

}  // namespace
