// What depends on the LibTorch version and the device: the version the build
// reports, the thread pools, the choice AttentionBackend::kAuto makes, the errors where a
// feature is missing, and every path on CUDA where a GPU is present. The SDPA
// path (LibTorch 2.1+) against the composite oracle: test_platform_sdpa.cpp.

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/torch_version.h>

#include <ATen/Version.h>
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "masked_softmax_internal.h"
#include "select_helpers.h"
#include "platform_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::dot;
using d2l::testing::error_message;
using d2l::testing::length_cases;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

TEST(Platform, ReportsTheLibTorchItWasBuiltWith) {
  EXPECT_EQ(d2l::torch_version(), std::to_string(TORCH_VERSION_MAJOR) + "." +
                                      std::to_string(TORCH_VERSION_MINOR) + "." +
                                      std::to_string(TORCH_VERSION_PATCH));
  EXPECT_GE(TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR, 113);
  EXPECT_EQ(d2l::sdpa_available(),
            TORCH_VERSION_MAJOR >= 2 && (TORCH_VERSION_MAJOR > 2 || TORCH_VERSION_MINOR >= 1));
  // The macro compares both numbers: 1.13 is older than 2.0.
  EXPECT_EQ(D2L_TORCH_VERSION_AT_LEAST(2, 0), TORCH_VERSION_MAJOR >= 2);
  EXPECT_TRUE(D2L_TORCH_VERSION_AT_LEAST(1, 13));
  EXPECT_FALSE(D2L_TORCH_VERSION_AT_LEAST(99, 0));
  EXPECT_EQ(d2l::to_string(AttentionBackend::kAuto), "auto");
  EXPECT_EQ(d2l::to_string(AttentionBackend::kSdpa), "sdpa");
}

// Whether this process mapped an OpenBLAS library: Debian's is
// .../openblas-pthread/libblas.so.3 (the libblas.so.3 alternative), others
// are libopenblas*.so.
bool platform_maps_openblas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("openblas") != std::string::npos) return true;
  }
  return false;
}

TEST(Platform, SetNumThreadsSizesBothPools) {
  const auto before = d2l::cpu_threads();
  EXPECT_EQ(before.intra_op, at::get_num_threads());
  // The BLAS is read from the process, whatever the version: Debian's
  // LibTorch calls OpenBLAS on 1.13 and on 2.6 (Debian 13), the PyPI wheels
  // MKL.
  const bool mapped = platform_maps_openblas();
  EXPECT_EQ(before.openblas >= 1, mapped);
  EXPECT_EQ(before.blas, mapped ? "openblas" : at::hasMKL() ? "mkl" : "other");
#ifdef D2L_TEST_DEBIAN_TORCH
  // Debian's libtorch calls OpenBLAS when libopenblas0-pthread provides
  // libblas.so.3 (`make deps` installs it; without it bmm is ~15x slower).
  EXPECT_TRUE(mapped) << "OpenBLAS is not the BLAS of this process";
#endif
  const auto two = d2l::set_num_threads(2);
  EXPECT_EQ(two.intra_op, 2);
  EXPECT_EQ(at::get_num_threads(), 2);
  EXPECT_EQ(two.openblas, before.openblas > 0 ? 1 : 0);
  const auto other = d2l::set_num_threads(1, 2);
  EXPECT_EQ(other.intra_op, 1);
  EXPECT_EQ(other.openblas, before.openblas > 0 ? 2 : 0);
  EXPECT_EQ(d2l::cpu_threads().openblas, other.openblas);

  EXPECT_THAT(error_message([] { d2l::set_num_threads(0); }),
              HasSubstr("d2l::set_num_threads: threads must be at least 1 (and fit an int), got 0"));
  EXPECT_THAT(error_message([] { d2l::set_num_threads(2, -1); }),
              HasSubstr("openblas_threads must be at least 1 (and fit an int), got -1"));
  EXPECT_THAT(error_message([] { d2l::set_num_threads(int64_t{1} << 40); }),
              HasSubstr("got 1099511627776"));
  // A refused call changes nothing.
  EXPECT_EQ(d2l::cpu_threads().intra_op, 1);
  EXPECT_EQ(d2l::cpu_threads().openblas, other.openblas);
  d2l::set_num_threads(before.intra_op, std::max<int64_t>(before.openblas, 1));
}

// CI's Debian 13 leg runs the suite as an AVX2-only CPU would
// (docs/building.md, "What CI runs"): our kernels pinned with D2L_CPU_ISA,
// ATen's with ATEN_CPU_CAPABILITY, OpenBLAS's with OPENBLAS_CORETYPE (and MKL's
// with MKL_ENABLE_INSTRUCTIONS, where LibTorch is built with MKL). Each pin
// set must have taken effect: a LibTorch that ignored one (a renamed
// variable, a BLAS without run-time kernel choice) would quietly test the
// host's wider kernels instead. D2L_EXPECT_AVX2_PINNING=1, which the leg sets,
// makes the pins themselves required.
TEST(Platform, PinnedInstructionSetsTakeEffect) {
  const auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value == nullptr ? "" : value;
  };
  const auto upper = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
  };
  const bool required = env("D2L_EXPECT_AVX2_PINNING") == "1";
  int checked = 0;
  if (const auto isa = env("D2L_CPU_ISA"); !isa.empty()) {
    EXPECT_EQ(d2l::to_string(d2l::cpu_isa()), isa);
    ++checked;
  } else {
    EXPECT_FALSE(required) << "D2L_CPU_ISA is not set";
  }
  if (const auto aten = env("ATEN_CPU_CAPABILITY"); !aten.empty()) {
    // ATen's own record of the level its kernels dispatch on.
    const auto config = at::show_config();
    const std::string key = "CPU capability usage: ";
    const auto pos = config.find(key);
    ASSERT_NE(pos, std::string::npos) << config;
    const auto end = config.find('\n', pos);
    EXPECT_EQ(config.substr(pos + key.size(), end - pos - key.size()), upper(aten))
        << "ATen's kernels (at::show_config)";
    ++checked;
  } else {
    EXPECT_FALSE(required) << "ATEN_CPU_CAPABILITY is not set";
  }
  using CoreName = char* (*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (const auto core = env("OPENBLAS_CORETYPE"); !core.empty() && corename != nullptr) {
    EXPECT_EQ(upper(corename()), upper(core)) << "OpenBLAS's kernels";
    ++checked;
  } else {
    EXPECT_FALSE(required && d2l::cpu_threads().blas == "openblas")
        << "OPENBLAS_CORETYPE is not set, and LibTorch's BLAS is OpenBLAS";
  }
  if (!env("MKL_ENABLE_INSTRUCTIONS").empty()) {
    // MKL has no call that reports the kernels it chose; where LibTorch has
    // MKL the variable is set for it, and this leg's LibTorch has none.
    EXPECT_FALSE(required && d2l::cpu_threads().blas == "mkl")
        << "MKL_ENABLE_INSTRUCTIONS cannot be checked: the AVX2 leg must run on OpenBLAS";
  }
  if (checked == 0) GTEST_SKIP() << "no instruction set pinned in this run";
}

TEST(Platform, SdpaIsAClearErrorWhereItCannotRun) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  if (!d2l::sdpa_available()) {
    EXPECT_THAT(
        error_message([&] { dot(q, k, v, {}, AttentionBackend::kSdpa); }),
        HasSubstr("d2l::dot_product_attention: AttentionBackend::kSdpa needs LibTorch 2.1 or newer "
                  "(at::scaled_dot_product_attention); this build of d2l_attention uses "
                  "LibTorch " +
                  d2l::torch_version()));
  } else {
    EXPECT_THAT(
        error_message([&] { dot(q, k, v, {}, AttentionBackend::kSdpa, /*need_weights=*/true); }),
        HasSubstr(
            "d2l::dot_product_attention: AttentionBackend::kSdpa returns no attention weights; "
            "call it with need_weights=false"));
    d2l::DotProductAttention recording(
        d2l::DotProductAttentionOptions().backend(AttentionBackend::kSdpa));
    EXPECT_THAT(error_message([&] { recording(q, k, v); }),
                HasSubstr("record_attention_weights(false)"));
  }
  // Only dot-product attention has an SDPA path.
  EXPECT_THAT(
      error_message([&] {
        d2l::detail::masked_softmax_nocheck(torch::randn({2, 2, 2}), {}, AttentionBackend::kSdpa);
      }),
      HasSubstr(
          "d2l::masked_softmax: AttentionBackend::kSdpa (LibTorch's scaled_dot_product_attention) "
          "is only for dot-product attention"));
  d2l::AdditiveAttention additive(
      d2l::AdditiveAttentionOptions(4, 4, 8).backend(AttentionBackend::kSdpa));
  EXPECT_THAT(error_message([&] { additive(q, k, v); }), HasSubstr("is only for dot-product"));
}

TEST(Platform, AutoChoosesFlashOnTheCpuWhereNoDropoutIsDrawn) {
  using d2l::detail::DotProductPath;
  auto choose = [](AttentionBackend path, const torch::Tensor& q, const torch::Tensor& k,
                   double dropout, bool training, bool need_weights) {
    return d2l::testing::select_dot("test", path, q, k, dropout, training, need_weights);
  };
  const auto q = torch::randn({1, 2, 4}), k = torch::randn({1, 3000, 4});
  const auto q_grad = q.clone().requires_grad_();
  for (const auto& query : {q, q_grad}) {
    EXPECT_EQ(choose(AttentionBackend::kAuto, query, k, 0, false, false), DotProductPath::kFlash);
    EXPECT_EQ(choose(AttentionBackend::kFused, query, k, 0, false, false), DotProductPath::kFlash);
    // Dropout outside training draws nothing.
    EXPECT_EQ(choose(AttentionBackend::kAuto, query, k, 0.1, false, false), DotProductPath::kFlash);
    // Weights asked for: the flash kernel writes them.
    EXPECT_EQ(choose(AttentionBackend::kAuto, query, k, 0, false, true), DotProductPath::kFlash);
    EXPECT_EQ(choose(AttentionBackend::kFused, query, k, 0, false, true), DotProductPath::kFlash);
    // Dropout in training: the fused softmax.
    EXPECT_EQ(choose(AttentionBackend::kAuto, query, k, 0.1, true, false),
              DotProductPath::kFusedSoftmax);
    EXPECT_EQ(choose(AttentionBackend::kComposite, query, k, 0, false, false),
              DotProductPath::kComposite);
  }
  {
    torch::InferenceMode inference;
    EXPECT_EQ(choose(AttentionBackend::kAuto, q, k, 0, false, false), DotProductPath::kFlash);
  }
  // Empty sizes keep the softmax paths, which keep the autograd graph.
  EXPECT_EQ(choose(AttentionBackend::kAuto, torch::randn({0, 2, 4}), torch::randn({0, 3, 4}), 0,
                   false, false),
            DotProductPath::kFusedSoftmax);
  EXPECT_EQ(choose(AttentionBackend::kAuto, q, torch::randn({1, 0, 4}), 0, false, false),
            DotProductPath::kFusedSoftmax);
  if (d2l::sdpa_available()) {
    EXPECT_EQ(choose(AttentionBackend::kSdpa, q_grad, k, 0, true, false), DotProductPath::kSdpa);
    EXPECT_EQ(choose(AttentionBackend::kSdpa, torch::randn({0, 2, 4}), k, 0, false, false),
              DotProductPath::kComposite);
  }
}

// Tensors without data (the meta device) are refused by name before any path
// is chosen, on every LibTorch, as our kernels and length checks read data.
// Mixing real devices is PlatformCuda's (below), which needs a GPU.
TEST(Platform, MetaTensorsAreRefusedByNameOnEveryVersion) {
  const auto meta = torch::TensorOptions().device(torch::kMeta);
  const auto q = torch::empty({2, 3, 4}, meta), k = torch::empty({2, 5, 4}, meta),
             v = torch::empty({2, 5, 2}, meta);
  std::vector<AttentionBackend> impls = {AttentionBackend::kAuto, AttentionBackend::kComposite};
  if (d2l::sdpa_available()) impls.push_back(AttentionBackend::kSdpa);
  for (AttentionBackend path : impls) {
    EXPECT_THAT(error_message([&] {
                  dot(q, k, v, torch::tensor({1, 2}), path);
                }),
                HasSubstr("d2l::dot_product_attention: queries must hold data, got a tensor on "
                          "the meta device (shape [2, 3, 4])"))
        << d2l::to_string(path);
    EXPECT_THAT(error_message([&] {
                  dot(torch::randn({2, 3, 4}), torch::randn({2, 5, 4}), v, {}, path);
                }),
                HasSubstr("d2l::dot_product_attention: values must hold data, got a tensor on "
                          "the meta device (shape [2, 5, 2])"))
        << d2l::to_string(path);
  }
  d2l::DotProductAttention module(
      d2l::DotProductAttentionOptions().record_attention_weights(false));
  EXPECT_THAT(error_message([&] {
                module(torch::randn({2, 3, 4}), k, v);
              }),
              HasSubstr("keys must hold data, got a tensor on the meta device"));
}

// CUDA: every path against the CPU composite oracle, forward and backward,
// and the device errors. Skips without a GPU.
TEST(PlatformCuda, EveryPathMatchesTheCpuOracle) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(14);
  std::vector<AttentionBackend> impls = {AttentionBackend::kAuto, AttentionBackend::kComposite};
  if (d2l::sdpa_available()) impls.push_back(AttentionBackend::kSdpa);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
    const double fwd_tol = dtype == torch::kFloat ? 1e-4 : dtype == torch::kDouble ? 1e-10 : 3e-2;
    const auto q = torch::randn({3, 9, 64}), k = torch::randn({3, 33, 64}),
               v = torch::randn({3, 33, 64});
    for (const auto& lens : length_cases(3, 9, 33)) {
      auto ref_q = q.to(torch::kDouble).requires_grad_(),
           ref_k = k.to(torch::kDouble).requires_grad_(),
           ref_v = v.to(torch::kDouble).requires_grad_();
      const auto ref = std::get<0>(dot(ref_q, ref_k, ref_v, lens, AttentionBackend::kComposite));
      ref.sum().backward();
      for (AttentionBackend path : impls) {
        auto cq = q.to(torch::kCUDA, dtype).requires_grad_(),
             ck = k.to(torch::kCUDA, dtype).requires_grad_(),
             cv = v.to(torch::kCUDA, dtype).requires_grad_();
        const auto out = std::get<0>(dot(cq, ck, cv, lens.defined() ? lens.cuda() : lens, path,
                                         /*need_weights=*/path != AttentionBackend::kSdpa));
        ASSERT_TRUE(out.is_cuda());
        EXPECT_LT(max_rel_error(out, ref), fwd_tol) << d2l::to_string(path) << " " << dtype;
        out.sum().backward();
        EXPECT_LT(max_rel_error(cq.grad(), ref_q.grad()), 10 * fwd_tol) << d2l::to_string(path);
        EXPECT_LT(max_rel_error(ck.grad(), ref_k.grad()), 10 * fwd_tol) << d2l::to_string(path);
        EXPECT_LT(max_rel_error(cv.grad(), ref_v.grad()), 10 * fwd_tol) << d2l::to_string(path);
      }
    }
  }
}

TEST(PlatformCuda, MixedDevicesAreClearErrors) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto q = torch::randn({2, 3, 4}).cuda(), k = torch::randn({2, 5, 4}).cuda(),
             v = torch::randn({2, 5, 2}).cuda();
  for (AttentionBackend path :
       {AttentionBackend::kAuto, AttentionBackend::kComposite, AttentionBackend::kSdpa}) {
    if (path == AttentionBackend::kSdpa && !d2l::sdpa_available()) continue;
    EXPECT_THAT(error_message([&] {
                  dot(q, k, v, torch::tensor({1, 2}), path);
                }),
                HasSubstr("d2l::dot_product_attention: valid_lens must be on the same device as "
                          "queries (cuda:0), got cpu"));
    EXPECT_THAT(error_message([&] { dot(q, k.cpu(), v, {}, path); }),
                HasSubstr("keys must be on the same device as queries (cuda:0), got cpu"));
  }
}

// The lengths are read back in one copy on CUDA: each kind of bad value still
// gets the CPU's message, with its index.
TEST(PlatformCuda, BadLengthsAreClearErrors) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto q = torch::randn({2, 3, 4}).cuda(), k = torch::randn({2, 5, 4}).cuda(),
             v = torch::randn({2, 5, 2}).cuda();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<torch::Tensor, std::string>> cases = {
      {torch::tensor({2, -1}), "valid_lens must hold non-negative lengths, got -1 at flat index 1"},
      {torch::tensor({1.5, 2.0}), "valid_lens must hold whole numbers, got 1.5 at flat index 0"},
      {torch::tensor({2.0, inf}), "valid_lens must hold whole numbers, got inf at flat index 1"},
      {torch::tensor({std::nan(""), 1.0}),
       "valid_lens must hold whole numbers, got nan at flat index 0"},
      {torch::tensor({-inf, 1.0}), "valid_lens must hold whole numbers, got -inf at flat index 0"}};
  for (AttentionBackend path :
       {AttentionBackend::kAuto, AttentionBackend::kComposite, AttentionBackend::kSdpa}) {
    if (path == AttentionBackend::kSdpa && !d2l::sdpa_available()) continue;
    for (const auto& [lens, message] : cases) {
      EXPECT_THAT(error_message([&, &lens = lens] { dot(q, k, v, lens.cuda(), path); }),
                  HasSubstr("d2l::dot_product_attention: " + message))
          << d2l::to_string(path);
    }
  }
}

}  // namespace
