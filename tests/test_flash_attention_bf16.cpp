// The flash kernel's bfloat16 kernel (Note [bfloat16 flash attention]: VDPBF16PS on bfloat16
// pairs, float softmax and sums), where the CPU has AVX512-BF16, and bfloat16 widened to float
// elsewhere: outputs and gradients against the float64 composite path on the same
// bfloat16-rounded inputs, within bounds stated in units of bfloat16's rounding, under every
// instruction set (the bfloat16 kernel runs at avx512_bf16, the widened float kernel below it);
// masks, odd sizes, padding that holds inf and NaN, threads, dropout, the widened path forced,
// explain_path and mixed dtypes.

#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "flash_helpers.h"
#include "fused_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::attend;
using d2l::testing::normwise_error;
using d2l::testing::on_one_thread;
using d2l::testing::Sizes;
using d2l::testing::value_and_grads;
namespace F = d2l::functional;

/// bfloat16's unit roundoff: 8 significant bits, so rounding to nearest is
/// within 2^-8 of a value, relative.
constexpr double kUnit = 0x1p-8;

class FlashBf16 : public d2l::testing::Fused {};

bool bf16_kernel_in_use() { return d2l::cpu_isa() >= d2l::CpuIsa::kAvx512Bf16; }

// What /proc/cpuinfo says of AMX for bfloat16, apart from the library's own
// probe (Linux lists the flags whether or not it grants the tile state).
bool cpu_has_amx_bf16() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      return line.find(" amx_bf16") != std::string::npos &&
             line.find(" amx_tile") != std::string::npos;
    }
  }
  return false;
}

// Output and the q, k, v gradients for an upstream gradient G on `path`;
// values in double for the oracle.
std::vector<torch::Tensor> run(const std::vector<torch::Tensor>& qkv, const torch::Tensor& lens,
                               AttentionBackend path, const torch::Tensor& G) {
  return value_and_grads([&](const auto& x) { return attend(x, lens, path); }, qkv, G);
}

std::vector<torch::Tensor> rounded(const std::vector<torch::Tensor>& qkv) {
  std::vector<torch::Tensor> out;
  for (const auto& t : qkv) out.push_back(t.to(torch::kBFloat16));
  return out;
}

std::vector<torch::Tensor> widened(const std::vector<torch::Tensor>& qkv) {
  std::vector<torch::Tensor> out;
  for (const auto& t : qkv) out.push_back(t.to(torch::kDouble));
  return out;
}

// The bounds the tests assert, in units of kUnit, for the output and the
// gradients of q, k and v (normwise_error). What bfloat16 allows: each
// result is rounded once (at most 1 unit), and the bfloat16 kernel also
// rounds P before P V, and P and dS before the gradients' products, whose
// float sums add those roundings with random signs: of L terms, about
// sqrt(L) roundings of terms about sqrt(L) times smaller than the result,
// so a unit or so whatever L is (a worst case of c·L units would need every
// rounding to go one way). dQ = dS K sums terms whose dS add up to zero in
// each row: it is smaller than its terms, most of all with few features,
// and its error larger in its units. Measured on the cases below
// (avx512_bf16, AMD EPYC Zen 5, 2026-11-28): output up to 0.99 units, dQ
// 2.91 (d = 1; 1.07 at d = 64), dK 1.50, dV 1.06, the rows (fewer than 11
// queries) within them (0.95, 1.57, 1.36, 0.70); the widened float kernel
// 0.83, 0.93, 0.98, 0.73 (its one rounding of each result). The bounds
// asserted are 1.5 to 2 times those.
struct Bounds {
  double out, dq, dk, dv;
};
constexpr Bounds kBf16Kernel{1.5, 6, 3, 3};
constexpr Bounds kWidened{1.5, 2, 1.5, 1.5};

// Sizes around the bfloat16 kernel's blocks (32 queries forward, 96
// backward; key blocks of up to 128, pairs of keys, queries and features):
// the fewest queries the blocks take (11), one past a block, odd n, m, d
// and dv (pairs completed with zeros), one feature, several key blocks; and
// its rows (fewer than 11 queries: decoding): one query, ten, odd sizes,
// more than 128 features (two passes down V), rows longer than a chunk of
// 512 keys, and one row's keys split over threads (B = n = 1 at 2 threads
// and more).
const std::vector<Sizes> kCases = {
    {2, 11, 16, 8, 8},     {2, 33, 45, 7, 9},     {3, 49, 130, 33, 17},  {2, 50, 257, 1, 3},
    {2, 128, 513, 64, 64}, {1, 300, 1100, 64, 64}, {3, 1, 300, 64, 64},  {2, 10, 45, 7, 9},
    {2, 3, 131, 1, 33},    {2, 2, 70, 150, 130},  {2, 1, 1300, 64, 64}, {1, 1, 2100, 40, 72}};

std::vector<torch::Tensor> lengths_for(const Sizes& c) {
  return {torch::Tensor(),                        // every key valid
          torch::randint(0, c.m + 3, {c.B}),      // zeros, below, at and above m
          torch::randint(0, c.m + 3, {c.B, c.n}),  // per query
          torch::full({c.B}, c.m, torch::kLong)};
}

TEST_P(FlashBf16, MatchesFloat64OracleWithinBf16Bounds) {
  torch::manual_seed(61);
  const Bounds bounds = bf16_kernel_in_use() ? kBf16Kernel : kWidened;
  for (const auto& c : kCases) {
    // Inputs rounded to bfloat16 first: the oracle sees the same numbers.
    const auto qkv = rounded({torch::randn({c.B, c.n, c.d}, torch::kDouble) * 1.5,
                              torch::randn({c.B, c.m, c.d}, torch::kDouble),
                              torch::randn({c.B, c.m, c.dv}, torch::kDouble)});
    const auto G = torch::randn({c.B, c.n, c.dv}, torch::kDouble).to(torch::kBFloat16);
    const auto lens = lengths_for(c);
    for (size_t l = 0; l < lens.size(); ++l) {
      const auto what = fmt::format("B={} n={} m={} d={} dv={} lens#{}", c.B, c.n, c.m, c.d, c.dv, l);
      const auto options = F::DotProductAttentionFuncOptions().valid_lens(lens[l]).need_weights(false);
      EXPECT_EQ(d2l::explain_path(qkv[0], qkv[1], qkv[2], options).path,
                bf16_kernel_in_use() ? "flash_bf16" : "flash")
          << what;
      const auto ours = run(qkv, lens[l], AttentionBackend::kFused, G);
      const auto exact = on_one_thread(
          [&] { return run(widened(qkv), lens[l], AttentionBackend::kComposite, G.to(torch::kDouble)); });
      const double limits[] = {bounds.out, bounds.dq, bounds.dk, bounds.dv};
      const char* names[] = {"output", "dQ", "dK", "dV"};
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(ours[i].scalar_type(), torch::kBFloat16) << what << " " << names[i];
        EXPECT_FALSE(ours[i].isnan().any().item<bool>()) << what << " " << names[i];
        EXPECT_LE(normwise_error(ours[i], exact[i]), limits[i] * kUnit)
            << what << " " << names[i] << ": "
            << normwise_error(ours[i], exact[i]) / kUnit << " units";
      }
    }
  }
}

// Below avx512_bf16, bfloat16 runs the float kernel on the bfloat16
// operands read in place (decoding rows: K and V widened in registers;
// blocks: a batch entry's keys and values widened once a thread) instead of
// on float copies made first: the same bits as the float kernel on the
// widened inputs, outputs and gradients rounded once; without and with
// autograd, rows of one to five queries and blocks of six and more (odd
// sizes: padded tiles), rows longer than a chunk of 512 keys, one row's keys
// split over threads, every kind of lengths, 1 and 2 threads.
TEST_P(FlashBf16, BelowAvx512Bf16OperandsAreReadInPlace) {
  if (bf16_kernel_in_use()) GTEST_SKIP() << "the bfloat16 kernel runs at this level";
  torch::manual_seed(64);
  const std::vector<Sizes> cases = {{3, 1, 700, 64, 64}, {2, 5, 45, 7, 9},     {1, 1, 2100, 40, 72},
                                    {2, 6, 40, 16, 16},  {2, 37, 300, 33, 17}, {1, 80, 80, 64, 64}};
  for (const auto& c : cases) {
    const auto qkv = rounded({torch::randn({c.B, c.n, c.d}, torch::kDouble) * 1.5,
                              torch::randn({c.B, c.m, c.d}, torch::kDouble),
                              torch::randn({c.B, c.m, c.dv}, torch::kDouble)});
    std::vector<torch::Tensor> wide;
    for (const auto& t : qkv) wide.push_back(t.to(torch::kFloat));
    const auto G = torch::randn({c.B, c.n, c.dv}).to(torch::kBFloat16);
    for (const auto& lens : lengths_for(c)) {
      for (const int threads : {1, 2}) {
        // dQ's sums in a fixed order at 2 threads: else a batch entry split
        // over both threads adds its key blocks' shares in the order the
        // threads reach its lock, which may differ between the two calls.
        const d2l::testing::ThreadsAndDeterminism scope(threads, /*deterministic=*/true);
        const auto what = fmt::format("B={} n={} m={} d={} dv={} threads {} lengths {}", c.B, c.n,
                                      c.m, c.d, c.dv, threads, lens.defined() ? lens.dim() : -1);
        const auto expected = run(wide, lens, AttentionBackend::kFused, G.to(torch::kFloat));
        EXPECT_TRUE(torch::equal(attend(qkv, lens, AttentionBackend::kFused),
                                 expected[0].to(torch::kBFloat16)))
            << what;
        const auto trained = run(qkv, lens, AttentionBackend::kFused, G);
        const char* names[] = {"output", "dQ", "dK", "dV"};
        for (size_t i = 0; i < 4; ++i) {
          EXPECT_TRUE(torch::equal(trained[i], expected[i].to(torch::kBFloat16)))
              << what << " " << names[i];
        }
      }
    }
  }
}

// Where the bfloat16 kernel runs, the widened float kernel (the instruction
// set capped at avx512) gives the same numbers within both bounds.
TEST_P(FlashBf16, WidenedPathForcedAgrees) {
  if (!bf16_kernel_in_use()) GTEST_SKIP() << "the bfloat16 kernel does not run at this level";
  torch::manual_seed(62);
  const Sizes c{3, 70, 300, 40, 24};
  const auto qkv = rounded({torch::randn({c.B, c.n, c.d}, torch::kDouble),
                            torch::randn({c.B, c.m, c.d}, torch::kDouble),
                            torch::randn({c.B, c.m, c.dv}, torch::kDouble)});
  const auto G = torch::randn({c.B, c.n, c.dv}).to(torch::kBFloat16);
  const auto lens = torch::tensor({300, 0, 171});
  const auto ours = run(qkv, lens, AttentionBackend::kFused, G);
  const auto saved = d2l::cpu_isa();
  d2l::set_cpu_isa(d2l::CpuIsa::kAvx512);
  const auto explained = d2l::explain_path(
      qkv[0], qkv[1], qkv[2], F::DotProductAttentionFuncOptions().valid_lens(lens).need_weights(false));
  const auto wide = run(qkv, lens, AttentionBackend::kFused, G);
  d2l::set_cpu_isa(saved);
  EXPECT_EQ(explained.path, "flash");
  ASSERT_EQ(explained.reasons.size(), 1u);
  EXPECT_EQ(explained.reasons[0],
            "flash_bf16: the kernels' instruction set is avx512 (D2L_CPU_ISA or d2l::set_cpu_isa; "
            "the bfloat16 kernel needs avx512_bf16); bfloat16 is widened to float");
  const double limits[] = {kBf16Kernel.out + kWidened.out, kBf16Kernel.dq + kWidened.dq,
                           kBf16Kernel.dk + kWidened.dk, kBf16Kernel.dv + kWidened.dv};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_LE(normwise_error(ours[i], wide[i]), limits[i] * kUnit) << "result " << i;
  }
}

// inf and NaN stored in keys and values past every query's length (odd
// lengths: the last pair of keys is completed with a zero, not with the next
// key) reach no result: the same bits as with clean padding, on 1 and 2
// threads (dQ's sums have a fixed order in this kernel), and rows with no
// valid key give zeros; in blocks of queries and row by row.
TEST_P(FlashBf16, NonFinitePaddingStaysClean) {
  torch::manual_seed(63);
  for (const int64_t n : {40, 3}) {  // blocks, and rows (decoding)
    const int64_t B = 3, m = 300, d = 9, dv = 5;
    const auto q = torch::randn({B, n, d}).to(torch::kBFloat16);
    const auto k = torch::randn({B, m, d}).to(torch::kBFloat16);
    const auto v = torch::randn({B, m, dv}).to(torch::kBFloat16);
    const auto per_query = torch::randint(0, 38, {B, n}).index_put_({1, 0}, 37);
    for (const auto& lens : {torch::tensor({0, 37, 261}), per_query}) {
      auto k_bad = k.clone(), v_bad = v.clone();
      for (int64_t b = 0; b < B; ++b) {
        const int64_t from = lens.dim() == 1 ? lens[b].item<int64_t>() : lens[b].max().item<int64_t>();
        k_bad[b].narrow(0, from, m - from).fill_(b % 2 ? std::numeric_limits<float>::infinity()
                                                       : std::numeric_limits<float>::quiet_NaN());
        v_bad[b].narrow(0, from, m - from).fill_(b % 2 ? std::numeric_limits<float>::quiet_NaN()
                                                       : -std::numeric_limits<float>::infinity());
      }
      const int saved = at::get_num_threads();
      for (int threads : {1, 2}) {
        at::set_num_threads(threads);
        const auto G = torch::ones({B, n, dv}, torch::kBFloat16);
        const auto clean = run({q, k, v}, lens, AttentionBackend::kFused, G);
        const auto dirty = run({q, k_bad, v_bad}, lens, AttentionBackend::kFused, G);
        for (size_t i = 0; i < clean.size(); ++i) {
          EXPECT_TRUE(torch::equal(clean[i], dirty[i]))
              << "result " << i << ", lengths " << lens.dim() << "-D, threads " << threads;
          EXPECT_FALSE(dirty[i].isnan().any().item<bool>()) << "result " << i;
        }
        if (lens.dim() == 1) {
          EXPECT_EQ(clean[0][0].abs().sum().item<float>(), 0);  // no valid key: zeros
          EXPECT_EQ(clean[1][0].abs().sum().item<float>(), 0);
        }
      }
      at::set_num_threads(saved);
    }
  }
}

// The bfloat16 kernel sums dQ in an order the work split fixes: two calls at
// 2 threads give the same bits (the float kernel does so with deterministic
// algorithms on: test_flash_attention_numerics.cpp), and 1 and 2 threads
// agree within rounding on either kernel. The second shape is one sequence
// decoding: at 2 threads the forward splits the row's 5900 keys over both
// threads and combines the parts in a fixed order.
TEST_P(FlashBf16, SameBitsFromCallToCall) {
  torch::manual_seed(64);
  for (const auto& [n, m, len] : {std::tuple<int64_t, int64_t, int64_t>{151, 411, 400}, {1, 6000, 5900}}) {
    const auto qkv = rounded({torch::randn({1, n, 64}), torch::randn({1, m, 64}), torch::randn({1, m, 64})});
    const auto G = torch::randn({1, n, 64}).to(torch::kBFloat16);
    const auto lens = torch::tensor({len});
    const int saved = at::get_num_threads();
    at::set_num_threads(2);
    const auto first = run(qkv, lens, AttentionBackend::kFused, G);
    const auto second = run(qkv, lens, AttentionBackend::kFused, G);
    at::set_num_threads(1);
    const auto one = run(qkv, lens, AttentionBackend::kFused, G);
    at::set_num_threads(saved);
    const auto exact = on_one_thread([&] {
      return run(widened(qkv), lens, AttentionBackend::kComposite, G.to(torch::kDouble));
    });
    for (size_t i = 0; i < first.size(); ++i) {
      if (bf16_kernel_in_use()) EXPECT_TRUE(torch::equal(first[i], second[i])) << "n " << n << ", result " << i;
      EXPECT_LE(normwise_error(one[i], first[i]), 2 * kUnit) << "n " << n << ", result " << i;
      EXPECT_LE(normwise_error(first[i], exact[i]), 6 * kUnit) << "n " << n << ", result " << i;
    }
  }
}

// Non-contiguous bfloat16 views run as their contiguous copies.
TEST_P(FlashBf16, NonContiguousInputs) {
  torch::manual_seed(65);
  const auto q = torch::randn({40, 3, 24}).to(torch::kBFloat16).permute({1, 0, 2}).narrow(2, 0, 11);
  const auto k = torch::randn({3, 11, 200}).to(torch::kBFloat16).transpose(1, 2);
  const auto v = torch::randn({3, 200, 12}).to(torch::kBFloat16).narrow(2, 2, 6);
  ASSERT_FALSE(q.is_contiguous() || k.is_contiguous() || v.is_contiguous());
  const auto lens = torch::tensor({200, 3, 120});
  const auto G = torch::randn({3, 40, 6}).to(torch::kBFloat16);
  const auto views = run({q, k, v}, lens, AttentionBackend::kFused, G);
  const auto copies = run({q.contiguous(), k.contiguous(), v.contiguous()}, lens,
                          AttentionBackend::kFused, G);
  for (size_t i = 0; i < views.size(); ++i) {
    EXPECT_TRUE(torch::equal(views[i], copies[i])) << "result " << i;
  }
}

// A double backward recomputes with ATen ops in bfloat16, as the float
// kernel's does: close to the float64 second derivatives. Those ops round as
// the BLAS kernels LibTorch picks for this CPU do (OpenBLAS's Haswell or
// SkylakeX kernels, oneDNN, ATen's AVX2 or AVX-512 code), so the bound is
// 0.05 normwise or 1.25 times what the book's composite ops in bfloat16 err
// by on the same inputs, whichever is larger (as in
// Isa/SmallHeads.BFloat16AgainstTheFloat64CompositePath).
TEST_P(FlashBf16, DoubleBackwardRunsOnAtenOps) {
  torch::manual_seed(66);
  const auto qkv = rounded({torch::randn({2, 20, 6}), torch::randn({2, 24, 6}),
                            torch::randn({2, 24, 3})});
  const auto lens = torch::tensor({{24}, {9}}).expand({2, 20});
  auto second_order = [&](const std::vector<torch::Tensor>& x, AttentionBackend path) {
    std::vector<torch::Tensor> in;
    for (const auto& t : x) in.push_back(t.clone().requires_grad_());
    const auto y = attend(in, lens, path);
    const auto g = torch::autograd::grad({(y * y).sum()}, in, {}, true, true);
    return torch::autograd::grad({g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum()}, in);
  };
  const auto ours = second_order(qkv, AttentionBackend::kFused);
  const auto exact = second_order(widened(qkv), AttentionBackend::kComposite);
  const auto book = second_order(qkv, AttentionBackend::kComposite);  // the book's ops in bfloat16
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(ours[i].scalar_type(), torch::kBFloat16);
    const double book_error = normwise_error(book[i], exact[i]);
    EXPECT_LT(normwise_error(ours[i], exact[i]), std::max(0.05, 1.25 * book_error))
        << "input " << i << " (the book's ops in bfloat16: " << book_error << ")";
  }
}

// Dropout in training is drawn on the weights, so bfloat16 takes the fused
// softmax path there, with the composite path's random stream: the same
// numbers for the same seed.
TEST_P(FlashBf16, DropoutInTrainingRunsTheSoftmaxPathWithTheSameStream) {
  torch::manual_seed(67);
  const auto qkv = rounded({torch::randn({2, 32, 16}), torch::randn({2, 50, 16}),
                            torch::randn({2, 50, 8})});
  const auto lens = torch::tensor({50, 17});
  const auto call = [&](AttentionBackend path) {
    return F::DotProductAttentionFuncOptions().valid_lens(lens).dropout(0.3).training(true).backend(
        path);
  };
  const auto explained = d2l::explain_path(qkv[0], qkv[1], qkv[2], call(AttentionBackend::kFused));
  EXPECT_EQ(explained.path, "fused_softmax");
  EXPECT_EQ(explained.reasons,
            std::vector<std::string>{"flash: dropout 0.3 in training (no dropout in the kernel)"});
  torch::manual_seed(5);
  const auto fused = std::get<0>(F::dot_product_attention(qkv[0], qkv[1], qkv[2], call(AttentionBackend::kFused)));
  torch::manual_seed(5);
  const auto composite =
      std::get<0>(F::dot_product_attention(qkv[0], qkv[1], qkv[2], call(AttentionBackend::kComposite)));
  EXPECT_LE(normwise_error(fused, composite), 2 * kUnit);
}

// explain_path names the kernel that runs, and why bfloat16 runs widened.
TEST_P(FlashBf16, ExplainPathSaysWhichKernel) {
  const auto q = torch::randn({2, 20, 8}).to(torch::kBFloat16);
  const auto k = torch::randn({2, 30, 8}).to(torch::kBFloat16);
  const auto explain = [&](const torch::Tensor& queries, bool weights) {
    return d2l::explain_path(queries, k, k,
                             F::DotProductAttentionFuncOptions().need_weights(weights));
  };
  const std::string widened_suffix = "; bfloat16 is widened to float";
  if (!bf16_kernel_in_use()) {
    const auto e = explain(q, false);
    EXPECT_EQ(e.path, "flash");
    ASSERT_EQ(e.reasons.size(), 1u);
    EXPECT_THAT(e.reasons[0], ::testing::StartsWith("flash_bf16: "));
    EXPECT_THAT(e.reasons[0], ::testing::EndsWith(widened_suffix));
    return;
  }
  EXPECT_EQ(explain(q, false).path, "flash_bf16");
  // Where the CPU has AMX for bfloat16 but the products do not run on its
  // tiles, one line says why; else none.
  const auto reasons = explain(q, false).reasons;
  if (d2l::cpu_isa() == d2l::CpuIsa::kAvx512Bf16 && d2l::cpu_isa_available(d2l::CpuIsa::kAmxBf16)) {
    ASSERT_EQ(reasons.size(), 1u);
    EXPECT_THAT(reasons[0], ::testing::StartsWith("flash_bf16_amx: the kernels' instruction set "
                                                  "is avx512_bf16 ("));
    EXPECT_THAT(reasons[0], ::testing::EndsWith("); the products run in VDPBF16PS"));
  } else if (cpu_has_amx_bf16() && !d2l::cpu_isa_available(d2l::CpuIsa::kAmxBf16)) {
    ASSERT_EQ(reasons.size(), 1u);
    EXPECT_THAT(reasons[0], ::testing::StartsWith("flash_bf16_amx: "));
    EXPECT_THAT(reasons[0], ::testing::EndsWith("; the products run in VDPBF16PS"));
  } else {
    EXPECT_TRUE(reasons.empty()) << ::testing::PrintToString(reasons);
  }
  EXPECT_EQ(explain(q, true).reasons,
            std::vector<std::string>{"flash_bf16: attention weights asked for (the bfloat16 "
                                     "kernel writes none)" + widened_suffix});
  // A few queries (decoding) run row by row inside the bfloat16 kernel.
  EXPECT_EQ(explain(q.narrow(1, 0, 1), false).path, "flash_bf16");
  EXPECT_EQ(explain(q.narrow(1, 0, 10), false).reasons, reasons);
}

INSTANTIATE_TEST_SUITE_P(Isa, FlashBf16, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

// float16 has no kernel of its own: widened to float, and explain_path says so.
TEST(FlashReducedPrecision, Float16IsWidenedAndSaysSo) {
  if (!d2l::detail::cpu_float16_matmul_available()) {
    GTEST_SKIP() << "this LibTorch refuses float16 attention on the CPU "
                    "(ReliabilityLayouts.Float16OnTheCpuWorksOrIsRefusedWithAdvice)";
  }
  const auto q = torch::randn({2, 20, 8}).to(torch::kHalf);
  const auto explained =
      d2l::explain_path(q, q, q, F::DotProductAttentionFuncOptions().need_weights(false));
  EXPECT_EQ(explained.path, "flash");
  EXPECT_EQ(explained.reasons,
            std::vector<std::string>{"flash_fp16: no float16 kernel (AVX512-FP16 and AMX-FP16 are "
                                     "not used); float16 is widened to float"});
}

// Mixed dtypes are an error naming the arguments, never a silent conversion.
TEST(FlashReducedPrecision, MixedDtypesAreAnErrorNamingTheArguments) {
  const auto q = torch::randn({2, 20, 8}).to(torch::kBFloat16);
  const auto k = torch::randn({2, 30, 8});
  EXPECT_THAT(d2l::testing::error_message([&] { attend({q, k, k}, {}, AttentionBackend::kAuto); }),
              ::testing::HasSubstr("d2l::dot_product_attention: keys must have the same dtype as "
                                   "queries (BFloat16), got Float"));
  EXPECT_THAT(d2l::testing::error_message(
                  [&] { attend({q, k.to(torch::kBFloat16), k}, {}, AttentionBackend::kAuto); }),
              ::testing::HasSubstr("d2l::dot_product_attention: values must have the same dtype as "
                                   "queries (BFloat16), got Float"));
}

}  // namespace
