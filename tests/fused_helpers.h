#pragma once

// Shared by the fast-path test files (test_fused*.cpp, test_flash_attention*.cpp,
// test_training_dropout.cpp): a fixture that runs a test once per instruction
// set (skipped, with the reason, where this machine cannot run it), the
// tolerances of each dtype against the composite oracle, and forward and
// backward comparisons.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <d2l/additive_attention.h>
#include <d2l/backend.h>

#include <functional>
#include <string>
#include <vector>

#include "test_utils.h"

namespace d2l::testing {

// max |got - exact| / max |scale_of| over the whole tensors (absolute where
// scale_of is all zeros): a result's error in units of its own size (or of a
// related result's, for one that is exactly zero by construction). Divided by
// bfloat16's rounding 2⁻⁸, it reads as "so many roundings of bfloat16".
inline double normwise_error(const torch::Tensor& got, const torch::Tensor& exact,
                             const torch::Tensor& scale_of) {
  const double scale = scale_of.to(torch::kDouble).abs().max().item<double>();
  const double error =
      (got.to(torch::kDouble) - exact.to(torch::kDouble)).abs().max().item<double>();
  return scale == 0 ? error : error / scale;
}
inline double normwise_error(const torch::Tensor& got, const torch::Tensor& exact) {
  return normwise_error(got, exact, exact);
}

// Every instruction set the kernels have: the parameterized suites name each,
// and one this CPU or build cannot run is skipped with the reason, not left
// out of the list. At avx512_bf16 the float kernels are the AVX-512 ones and
// bfloat16 dot-product attention runs its own kernel; at amx_bf16 that
// kernel's products run on AMX tiles.
inline std::vector<d2l::CpuIsa> all_isas() {
  return {d2l::CpuIsa::kDefault, d2l::CpuIsa::kAvx2, d2l::CpuIsa::kAvx512,
          d2l::CpuIsa::kAvx512Bf16, d2l::CpuIsa::kAmxBf16};
}

inline std::vector<d2l::CpuIsa> runnable_isas() {
  std::vector<d2l::CpuIsa> isas;
  for (auto isa : all_isas()) {
    if (d2l::cpu_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

// Runs the test body once per instruction set, restoring the choice after.
class Fused : public ::testing::TestWithParam<d2l::CpuIsa> {
 protected:
  void SetUp() override {
    saved_ = d2l::cpu_isa();
    if (!d2l::cpu_isa_available(GetParam())) {
      GTEST_SKIP() << "this CPU or build cannot run the " << d2l::to_string(GetParam())
                   << " kernels";
    }
    d2l::set_cpu_isa(GetParam());
  }
  void TearDown() override { d2l::set_cpu_isa(saved_); }

 private:
  d2l::CpuIsa saved_ = d2l::CpuIsa::kDefault;
};

inline const std::vector<DtypeTolerance> kFastPathDtypes = {{torch::kDouble, 1e-12, 1e-11},
                                                            {torch::kFloat, 2e-6, 1e-5},
                                                            {torch::kBFloat16, 2e-2, 5e-2},
                                                            {torch::kHalf, 2e-3, 5e-3}};

// Forward value and input gradients of `f` for a fixed upstream gradient.
inline std::vector<torch::Tensor> value_and_grads(
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
    const std::vector<torch::Tensor>& inputs, const torch::Tensor& upstream) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  const auto out = f(leaves);
  (out * upstream.to(out.scalar_type())).sum().backward();
  std::vector<torch::Tensor> result{out.detach()};
  for (const auto& t : leaves) result.push_back(t.grad());
  return result;
}

inline void expect_close(const std::vector<torch::Tensor>& fused,
                         const std::vector<torch::Tensor>& ref, const DtypeTolerance& tol,
                         const std::string& what) {
  ASSERT_EQ(fused.size(), ref.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_TRUE(fused[i].defined()) << what << " output " << i;
    EXPECT_EQ(fused[i].scalar_type(), ref[i].scalar_type()) << what << " output " << i;
    EXPECT_EQ(fused[i].sizes(), ref[i].sizes()) << what << " output " << i;
    EXPECT_FALSE(fused[i].isnan().any().item<bool>()) << what << " output " << i;
    EXPECT_LT(max_rel_error(fused[i], ref[i]), i == 0 ? tol.forward : tol.backward)
        << what << " output " << i << " (" << c10::toString(tol.dtype) << ")";
  }
}

// Additive attention through the values (the fused kernel's forward_values
// and backward_values, taken whenever no dropout is drawn): output, weights
// and the gradients of queries, keys, values and the three weights, for a
// loss on the output, on the weights, or on both.
enum class AdditiveLoss { kOutput, kWeights, kBoth };

inline std::vector<torch::Tensor> additive_through_values(const std::vector<torch::Tensor>& inputs,
                                                          const torch::Tensor& lens,
                                                          AttentionBackend path, AdditiveLoss loss,
                                                          const torch::Tensor& G_out,
                                                          const torch::Tensor& G_weights) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : inputs) leaves.push_back(t.detach().clone().requires_grad_());
  auto [out, weights] = d2l::functional::additive_attention(
      leaves[0], leaves[1], leaves[2],
      d2l::functional::AdditiveAttentionFuncOptions(leaves[3], leaves[4], leaves[5])
          .valid_lens(lens)
          .dropout(0.0)
          .training(false)
          .backend(path));
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

}  // namespace d2l::testing
