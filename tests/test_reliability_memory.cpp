// Reliability, memory: resident set size stays flat over 10,000 forward and
// backward calls, and the measurement itself sees a leak of 1 KiB per call.
// Skipped under the sanitizers, whose quarantine holds freed memory
// (docs/reliability.md).

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cpu/kernel_args.h"
#include "test_utils.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define D2L_UNDER_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define D2L_UNDER_SANITIZER 1
#endif

namespace {

using d2l::AttentionBackend;

// ---------------------------------------------------------------------------
// Memory: resident set size over 10,000 forward + backward calls.

int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Growth allowed between call 500 and call 10,000: 4 MiB. A leak of one 1 KiB
// tensor per call would add 9,500 x (1 KiB + TensorImpl, storage and malloc
// headers) > 9 MiB and fail; the margin below that absorbs malloc's own
// fluctuations (measured here: under 0.5 MiB).
constexpr int64_t kAllowedGrowthKib = 4 * 1024;
constexpr int kWarmupCalls = 500, kCalls = 10000;

// The calls run on one intra-op thread: memory does not depend on the
// thread count, and on LibTorch 2.11 ATen's softmax opens a parallel region
// per call even at these sizes, so that under `ctest -j 2` on two cores the
// 10,000 calls took 80 s to over 300 s (1 thread: under 10 s).
template <typename Step>
int64_t growth_kib_over_calls(Step step) {
  struct OneThread {
    int saved = at::get_num_threads();
    OneThread() { at::set_num_threads(1); }
    ~OneThread() { at::set_num_threads(saved); }
  } one_thread;
  for (int call = 0; call < kWarmupCalls; ++call) step();
#if defined(__GLIBC__)
  // Free heap pages that earlier tests in this process left resident would
  // take a leak without any growth of the resident set (the leak probe below
  // failed that way when the whole binary ran in one process): hand them back.
  malloc_trim(0);
#endif
  const int64_t before = resident_kib();
  for (int call = kWarmupCalls; call < kCalls; ++call) step();
  return resident_kib() - before;
}

TEST(ReliabilityMemory, TenThousandForwardBackwardCallsDoNotGrowMemory) {
#ifdef D2L_UNDER_SANITIZER
  GTEST_SKIP() << "sanitizer builds hold freed memory in quarantine; LeakSanitizer covers leaks";
#endif
  ASSERT_GT(resident_kib(), 0) << "no VmRSS in /proc/self/status";
  torch::manual_seed(36);
  d2l::AdditiveAttention additive(4, 4, 8, 0.1);
  d2l::DotProductAttention dot(
      d2l::DotProductAttentionOptions().backend(AttentionBackend::kComposite));
  const auto q = torch::randn({2, 3, 4}).requires_grad_(), k = torch::randn({2, 10, 4});
  const auto v = torch::randn({2, 10, 4}), lens = torch::tensor({{3, 10, 0}, {7, 1, 2}});
  const auto growth = growth_kib_over_calls([&] {
    (additive(q, k, v, lens).sum() + dot(q, k, v, lens).sum()).backward();
    additive->zero_grad();
    q.mutable_grad() = torch::Tensor();
  });
  EXPECT_LT(growth, kAllowedGrowthKib) << "resident memory grew by " << growth << " KiB";
}

// The probe itself: the same measurement must see a leak of 1 KiB per call.
TEST(ReliabilityMemory, MeasurementSeesALeakOfOneKibPerCall) {
#ifdef D2L_UNDER_SANITIZER
  GTEST_SKIP() << "sanitizer builds hold freed memory in quarantine";
#endif
  std::vector<torch::Tensor> leaked;
  leaked.reserve(kCalls);
  const auto growth = growth_kib_over_calls([&] { leaked.push_back(torch::zeros({256})); });
  EXPECT_GT(growth, kAllowedGrowthKib) << "resident memory grew by only " << growth << " KiB";
}

// ---------------------------------------------------------------------------
// Large outputs on transparent huge pages (empty_output, cpu/kernel_args.h).

// The VmFlags of the mapping that holds `address` ("" when none does).
std::string mapping_flags(std::uintptr_t address) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = begin <= address && address < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool huge_pages_flagged(const torch::Tensor& t) {
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto first = (reinterpret_cast<std::uintptr_t>(t.data_ptr()) + kHuge - 1) & ~(kHuge - 1);
  return mapping_flags(first).find(" hg") != std::string::npos;
}

// Outputs of 32 MiB and more (glibc maps each on its own) are asked onto huge
// pages (VmFlags "hg"): each is written in full right after, and fresh 4 KiB
// pages cost a fault each (README, "Fresh memory for large outputs"). Here
// the attention weights of a 2900 x 2900 problem (32.1 MiB).
TEST(ReliabilityMemory, LargeOutputsAskForHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  const auto direct = d2l::detail::empty_output({3, 2048, 2048}, torch::kFloat);
  EXPECT_EQ(direct.sizes(), (std::vector<int64_t>{3, 2048, 2048}));
  EXPECT_EQ(direct.scalar_type(), torch::kFloat);
  EXPECT_TRUE(direct.is_contiguous());
  EXPECT_TRUE(huge_pages_flagged(direct));

  torch::manual_seed(0);
  const int64_t n = 2900;
  const auto weights = std::get<1>(d2l::functional::dot_product_attention(
      torch::randn({1, n, 4}), torch::randn({1, n, 4}), torch::randn({1, n, 4}),
      d2l::functional::DotProductAttentionFuncOptions()
          .valid_lens(torch::tensor({n - 10}))
          .dropout(0.0)
          .training(false)
          .backend(AttentionBackend::kFused)
          .need_weights(true)));
  EXPECT_TRUE(huge_pages_flagged(weights));
}

}  // namespace
