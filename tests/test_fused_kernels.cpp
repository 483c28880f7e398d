// The fused kernels' pieces outside the per-ISA suite: the fast tanh, the
// chunked scores, double backward refused, dropout in training, no keys,
// recording turned off, other devices, choosing the instruction set.

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
#include "cpu/dispatch.h"
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
using d2l::testing::all_isas;
using d2l::testing::runnable_isas;
using d2l::testing::value_and_grads;

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
        return d2l::functional::additive_scores(
            in[0], in[1], in[2],
            d2l::functional::AdditiveScoresFuncOptions().backend(AttentionBackend::kComposite));
      },
      {q, k, w}, G);
  expect_close(chunked, composite, kFastPathDtypes[0], "chunked");
}

TEST(FusedKernels, FusedAdditiveRefusesDoubleBackwardClearly) {
  const auto q = torch::randn({1, 2, 3}, torch::kDouble).requires_grad_();
  const auto k = torch::randn({1, 4, 3}, torch::kDouble);
  const auto w = torch::randn({1, 3}, torch::kDouble);
  const auto s = d2l::functional::additive_scores(
      q, k, w, d2l::functional::AdditiveScoresFuncOptions().backend(AttentionBackend::kFused));
  EXPECT_THAT(
      error_message([&] { torch::autograd::grad({s.sum()}, {q}, {}, true, true); }),
      HasSubstr("the fused CPU kernel has no double backward; use AttentionBackend::kComposite"));
}

TEST(FusedKernels, FusedAdditiveThroughValuesRefusesDoubleBackwardClearly) {
  const auto q = torch::randn({1, 2, 3}, torch::kDouble).requires_grad_();
  const auto k = torch::randn({1, 4, 3}, torch::kDouble),
             v = torch::randn({1, 4, 2}, torch::kDouble);
  const auto W = torch::randn({5, 3}, torch::kDouble), w_v = torch::randn({1, 5}, torch::kDouble);
  const auto out = std::get<0>(d2l::functional::additive_attention(
      q, k, v,
      d2l::functional::AdditiveAttentionFuncOptions(W, W, w_v).dropout(0.0).training(false).backend(
          AttentionBackend::kFused)));
  EXPECT_THAT(
      error_message([&] { torch::autograd::grad({out.sum()}, {q}, {}, true, true); }),
      HasSubstr("the fused CPU kernel has no double backward; use AttentionBackend::kComposite"));
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
  auto run = [&](AttentionBackend path) {
    torch::manual_seed(18);
    auto leaf = v.clone().requires_grad_();
    const auto out = std::get<0>(d2l::functional::additive_attention(
        q, k, leaf,
        d2l::functional::AdditiveAttentionFuncOptions(W_q, W_k, w_v)
            .valid_lens(lens)
            .dropout(0.5)
            .training(true)
            .backend(path)));
    out.sum().backward();
    return std::vector<torch::Tensor>{out.detach(), leaf.grad()};
  };
  const auto fused = run(AttentionBackend::kFused), composite = run(AttentionBackend::kComposite);
  EXPECT_LT(max_rel_error(fused[0], composite[0]), 1e-12);
  EXPECT_LT(max_rel_error(fused[1], composite[1]), 1e-12);
  // And the mask is drawn: some weight was dropped, the rest scaled by 2.
  torch::manual_seed(18);
  const auto kept = std::get<0>(d2l::functional::additive_attention(
      q, k, v,
      d2l::functional::AdditiveAttentionFuncOptions(W_q, W_k, w_v)
          .valid_lens(lens)
          .dropout(0.5)
          .training(false)
          .backend(AttentionBackend::kFused)));
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
      torch::randn({0, 5, 6}, torch::kDouble),
      d2l::functional::AdditiveAttentionFuncOptions(inputs[3], inputs[4], inputs[5])));
  const auto result = additive_through_values(
      inputs, torch::tensor({0, 0}), AttentionBackend::kFused, AdditiveLoss::kBoth,
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
  d2l::DotProductAttention dot(d2l::DotProductAttentionOptions().backend(AttentionBackend::kFused));
  const auto q = torch::randn({1, 2, 2}).cuda();
  EXPECT_THAT(error_message([&] { dot(q, q, q); }),
              HasSubstr("d2l::dot_product_attention: AttentionBackend::kFused runs on the CPU, got "
                        "tensors on cuda:0"));
}

TEST(FusedKernels, IsaCanBeChosenAndNamed) {
  const auto saved = d2l::cpu_isa();
  // Without D2L_CPU_ISA in the environment, the widest runnable one is
  // chosen: amx_bf16 where the CPU's tiles run it (a test build that models
  // the tiles in software stops at avx512_bf16).
  if (std::getenv("D2L_CPU_ISA") == nullptr) {
    const auto isas = runnable_isas();
    if (isas.back() == d2l::CpuIsa::kAmxBf16) {
      EXPECT_TRUE(saved == d2l::CpuIsa::kAmxBf16 || saved == d2l::CpuIsa::kAvx512Bf16)
          << d2l::to_string(saved);
    } else {
      EXPECT_EQ(saved, isas.back());
    }
  }
  d2l::set_cpu_isa(d2l::CpuIsa::kDefault);
  EXPECT_EQ(d2l::cpu_isa(), d2l::CpuIsa::kDefault);
  EXPECT_EQ(d2l::to_string(d2l::cpu_isa()), "default");
  EXPECT_EQ(d2l::to_string(d2l::CpuIsa::kAvx2), "avx2");
  EXPECT_EQ(d2l::to_string(d2l::CpuIsa::kAvx512), "avx512");
  EXPECT_EQ(d2l::to_string(d2l::CpuIsa::kAvx512Bf16), "avx512_bf16");
  EXPECT_EQ(d2l::to_string(d2l::CpuIsa::kAmxBf16), "amx_bf16");
  EXPECT_TRUE(d2l::cpu_isa_available(d2l::CpuIsa::kDefault));
  // Each level includes the ones before it.
  EXPECT_TRUE(!d2l::cpu_isa_available(d2l::CpuIsa::kAvx512Bf16) ||
              d2l::cpu_isa_available(d2l::CpuIsa::kAvx512));
  EXPECT_TRUE(!d2l::cpu_isa_available(d2l::CpuIsa::kAmxBf16) ||
              d2l::cpu_isa_available(d2l::CpuIsa::kAvx512Bf16));
  for (auto isa : {d2l::CpuIsa::kAvx2, d2l::CpuIsa::kAvx512, d2l::CpuIsa::kAvx512Bf16,
                   d2l::CpuIsa::kAmxBf16}) {
    if (d2l::cpu_isa_available(isa)) continue;
    EXPECT_THAT(error_message([&] { d2l::set_cpu_isa(isa); }),
                HasSubstr("d2l::set_cpu_isa: " + d2l::to_string(isa) + " kernels cannot run here"));
    EXPECT_EQ(d2l::cpu_isa(), d2l::CpuIsa::kDefault);
  }
  d2l::set_cpu_isa(saved);
}

// "default, avx2": the levels this CPU and build run, whatever D2L_CPU_ISA
// caps the process at, as the errors list them.
std::string runnable_list() {
  std::string out;
  for (const auto isa : all_isas()) {
    if (d2l::cpu::isa_runnable_on_this_cpu(isa)) {
      out += (out.empty() ? "" : ", ") + d2l::to_string(isa);
    }
  }
  return out;
}

// D2L_CPU_ISA naming a level this CPU lacks is an error naming the variable,
// the level and the levels at hand, never a SIGILL nor a quiet fallback; so
// is a value that names no level.
TEST(FusedKernels, EnvironmentLevelsThisCpuLacksAreRefused) {
  for (const auto isa : all_isas()) {
    const auto name = d2l::to_string(isa);
    if (d2l::cpu::isa_runnable_on_this_cpu(isa)) {
      EXPECT_EQ(d2l::cpu::isa_from_environment(name.c_str()), isa) << name;
      continue;
    }
    EXPECT_THAT(error_message([&] { d2l::cpu::isa_from_environment(name.c_str()); }),
                HasSubstr("d2l: D2L_CPU_ISA=" + name + " asks for the " + name +
                          " kernels, which cannot run here: this CPU and build run " +
                          runnable_list()))
        << name;
  }
  EXPECT_THAT(error_message([] { d2l::cpu::isa_from_environment("avx3"); }),
              HasSubstr("d2l: D2L_CPU_ISA=avx3 names no instruction set: default, avx2, avx512, "
                        "avx512_bf16 or amx_bf16 (this CPU and build run " +
                        runnable_list()));
  // Unset or empty: the widest level (amx_bf16 only where the CPU's tiles
  // run it; a test build that models them in software stops below).
  auto widest = d2l::CpuIsa::kDefault;
  for (const auto isa : {d2l::CpuIsa::kAvx2, d2l::CpuIsa::kAvx512, d2l::CpuIsa::kAvx512Bf16}) {
    if (d2l::cpu::isa_runnable_on_this_cpu(isa)) widest = isa;
  }
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const auto chosen = d2l::cpu::isa_from_environment(unset);
    if (d2l::cpu::isa_runnable_on_this_cpu(d2l::CpuIsa::kAmxBf16)) {
      EXPECT_TRUE(chosen == d2l::CpuIsa::kAmxBf16 || chosen == widest) << d2l::to_string(chosen);
    } else {
      EXPECT_EQ(chosen, widest);
    }
  }
}

// D2L_CPU_ISA is the widest level the process may use, as an AVX2-only CPU
// would be (CI's AVX2 leg pins avx2 on an AVX-512 CPU): the levels above it
// are not available, and asking for one is refused naming the variable.
TEST(FusedKernels, EnvironmentLevelCapsTheProcess) {
  const char* value = std::getenv("D2L_CPU_ISA");
  if (value == nullptr || *value == '\0') GTEST_SKIP() << "D2L_CPU_ISA is not set";
  const auto cap = d2l::cpu::isa_from_environment(value);
  const auto saved = d2l::cpu_isa();
  int above = 0;
  for (const auto isa : all_isas()) {
    EXPECT_EQ(d2l::cpu_isa_available(isa), isa <= cap && d2l::cpu::isa_runnable_on_this_cpu(isa))
        << d2l::to_string(isa);
    if (isa <= cap || !d2l::cpu::isa_runnable_on_this_cpu(isa)) continue;
    ++above;
    EXPECT_THAT(error_message([&] { d2l::set_cpu_isa(isa); }),
                HasSubstr("d2l::set_cpu_isa: " + d2l::to_string(isa) +
                          " kernels cannot run here: D2L_CPU_ISA=" + value +
                          " caps this process at " + value));
    EXPECT_EQ(d2l::cpu_isa(), saved);
  }
  std::printf("[D2L_CPU_ISA=%s] %d runnable levels above it refused\n", value, above);
}

// A CpuIsa made from an integer is no level: refused, and never runnable
// (it once read as available and ran the AVX-512 table on an AVX2 CPU).
TEST(FusedKernels, UnknownLevelIsRefused) {
  const auto saved = d2l::cpu_isa();
  const auto bogus = static_cast<d2l::CpuIsa>(42);
  EXPECT_FALSE(d2l::cpu_isa_available(bogus));
  EXPECT_THAT(error_message([&] { d2l::set_cpu_isa(bogus); }),
              HasSubstr("d2l::set_cpu_isa: 42 is not a CpuIsa; this CPU and build run " +
                        runnable_list()));
  EXPECT_EQ(d2l::cpu_isa(), saved);
}

}  // namespace
