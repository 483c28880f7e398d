// Coverage that depends on the machine or on LibTorch, said rather than
// dropped: each case here is skipped, with what was not run, where the CPU,
// the build or LibTorch leaves part of the suite out; elsewhere it checks
// that the part it stands for can run.

#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/torch_version.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "checks.h"
#include "fused_helpers.h"
#include "test_utils.h"

namespace {

// The tests that loop over the instruction sets inside one case
// (FusedKernels.FastTanhIsAccurateOverTheWholeFloatRange,
// ReliabilityNumerics.NonFiniteValidScoresNeverLeakIntoMaskedPositions) run
// the ones this machine has; the Isa/* suites skip the others case by case.
class CoverageIsa : public ::testing::TestWithParam<d2l::CpuIsa> {};

TEST_P(CoverageIsa, KernelsRunHere) {
  const auto isa = GetParam();
  if (!d2l::cpu_isa_available(isa)) {
    GTEST_SKIP() << "this CPU or build cannot run the " << d2l::to_string(isa)
                 << " kernels: their part of the tests that loop over instruction sets is "
                    "not run";
  }
  const auto saved = d2l::cpu_isa();
  d2l::set_cpu_isa(isa);
  EXPECT_EQ(d2l::cpu_isa(), isa);
  const auto X = torch::randn({2, 3, 37});
  const auto lens = torch::tensor({5, 37});
  EXPECT_LT(d2l::testing::max_rel_error(d2l::masked_softmax(X, lens, d2l::AttentionBackend::kFused),
                                        d2l::testing::reference_masked_softmax(X, lens)),
            2e-6);
  d2l::set_cpu_isa(saved);
}

INSTANTIATE_TEST_SUITE_P(Isa, CoverageIsa, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

// LibTorch 1.13 cannot multiply float16 on the CPU, and the library refuses
// float16 attention there (ReliabilityLayouts.Float16OnTheCpuWorksOrIsRefusedWithAdvice):
// the float16 cases of the flash tests (Isa/Flash.*), of the fused additive
// gradients (Isa/Fused.*) and of ReliabilityEmpty are then left out.
TEST(Coverage, Float16AttentionOnTheCpu) {
  if (!d2l::detail::cpu_float16_matmul_available()) {
    GTEST_SKIP() << "LibTorch " << d2l::torch_version()
                 << " has no float16 matrix product on the CPU: the float16 cases of "
                    "Isa/Flash.*, Isa/Fused.* and ReliabilityEmpty.* are not run";
  }
  torch::manual_seed(5);
  const auto q = torch::randn({2, 3, 8}), k = torch::randn({2, 9, 8}), v = torch::randn({2, 9, 4});
  const auto lens = torch::tensor({3, 9});
  const auto expected = std::get<0>(d2l::functional::dot_product_attention(
      q, k, v, d2l::functional::DotProductAttentionFuncOptions().valid_lens(lens)));
  for (bool weights : {true, false}) {
    const auto out = std::get<0>(d2l::functional::dot_product_attention(
        q.to(torch::kHalf), k.to(torch::kHalf), v.to(torch::kHalf),
        d2l::functional::DotProductAttentionFuncOptions()
            .valid_lens(lens)
            .dropout(0.0)
            .training(false)
            .backend(d2l::AttentionBackend::kAuto)
            .need_weights(weights)));
    EXPECT_EQ(out.scalar_type(), torch::kHalf);
    EXPECT_LT(d2l::testing::max_rel_error(out, expected), 5e-3) << "weights " << weights;
  }
}

}  // namespace
