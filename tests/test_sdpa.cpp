// d2l::nn::functional::scaled_dot_product_attention against PyTorch 2.11's
// own F.scaled_dot_product_attention (fixtures from
// tests/fixtures/generate_fixtures_sdpa.py), on every path and instruction
// set; its choice of path; dropout's statistics; its refusals.

#include <d2l/backend.h>
#include <d2l/scaled_dot_product_attention.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fixture.h"
#include "fused_helpers.h"
#include "golden_compare.h"
#include "test_utils.h"

namespace sdpa_tests {

namespace F = d2l::nn::functional;
using d2l::AttentionBackend;
using d2l::testing::Fixture;
using d2l::testing::Fused;
using d2l::testing::golden::close_to;
using d2l::testing::golden::Tolerance;

// Every fixture case, and whether it runs the kernels on the CPU (kAuto,
// float): yes where its mask is lengths (none, causal either way, boolean
// or 0/-inf prefixes), grouped heads included; no for other masks, zero
// sizes and E = 0 (the composite path).
struct Case {
  const char* name;
  bool kernels;
};
const std::vector<Case> kCases = {
    {"sdpa_plain", true},
    {"sdpa_causal", true},
    {"sdpa_causal_tall", true},
    {"sdpa_lower_right", true},
    {"sdpa_lower_right_tall", true},
    {"sdpa_gqa_lower_right", true},
    {"sdpa_bool_prefix", true},
    {"sdpa_bool_padding", true},
    {"sdpa_bool_general", false},
    {"sdpa_float_bias", false},
    {"sdpa_float_prefix", true},
    {"sdpa_scale", true},
    {"sdpa_gqa2", true},
    {"sdpa_gqa4", true},
    {"sdpa_mqa", true},
    {"sdpa_gqa8", true},
    {"sdpa_gqa_bias", false},
    {"sdpa_gqa_kv_heads", true},
    {"sdpa_broadcast", true},
    {"sdpa_3d", true},
    {"sdpa_2d", true},
    {"sdpa_5d", false},
    {"sdpa_one", true},
    {"sdpa_one_query", true},
    {"sdpa_no_keys", false},
    {"sdpa_no_queries", false},
    {"sdpa_no_features", false},
    {"sdpa_long", true},
    {"sdpa_window_causal", true},
    {"sdpa_window_both", true},
    {"sdpa_window_lower_right", true},
    {"sdpa_window_tall", true},
    {"sdpa_window_gqa", true},
    {"sdpa_window_prefix", true},
    {"sdpa_window_long", true},
};

// The fixture's options, its mask in `dtype` where it is a float one.
F::ScaledDotProductAttentionFuncOptions options_of(const Fixture& f, torch::Dtype dtype) {
  F::ScaledDotProductAttentionFuncOptions options;
  options.is_causal(f.scalar("is_causal") != 0).enable_gqa(f.scalar("enable_gqa") != 0);
  if (f.scalar("causal_lower_right") != 0) options.causal_variant(F::CausalVariant::kLowerRight);
  if (f.has_scalar("scale")) options.scale(f.scalar("scale"));
  // Python's reference had the window as a boolean mask; here it is the option.
  if (f.has_scalar("window_left") && f.scalar("window_left") >= 0)
    options.window_left(static_cast<int64_t>(f.scalar("window_left")));
  if (f.has_scalar("window_right") && f.scalar("window_right") >= 0)
    options.window_right(static_cast<int64_t>(f.scalar("window_right")));
  if (f.has_tensor("attn_mask.bool"))
    options.attn_mask(f.tensor("attn_mask.bool").to(torch::kBool));
  if (f.has_tensor("attn_mask.float")) {
    options.attn_mask(f.tensor("attn_mask.float")
                          .masked_fill(f.tensor("attn_mask.neginf").to(torch::kBool),
                                       -std::numeric_limits<double>::infinity())
                          .to(dtype));
  }
  return options;
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

// Output and the gradients of sum(output · G) in `dtype`.
Result run(const Fixture& f, torch::Dtype dtype, AttentionBackend backend) {
  auto q = f.tensor("query").to(dtype).clone().requires_grad_();
  auto k = f.tensor("key").to(dtype).clone().requires_grad_();
  auto v = f.tensor("value").to(dtype).clone().requires_grad_();
  const auto out = F::scaled_dot_product_attention(q, k, v, options_of(f, dtype).backend(backend));
  (out.to(torch::kDouble) * f.tensor("G").to(torch::kDouble)).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

class SdpaParity : public Fused {};

// Every case in float64 and float32, through the composite path, the
// kernels (kFused: the flash kernel where the mask is lengths) and, on
// LibTorch 2.x, LibTorch's own SDPA, against Python's numbers in the same
// dtype.
TEST_P(SdpaParity, MatchesPythonInEveryCase) {
  for (const auto& [name, kernels] : kCases) {
    for (const std::string dname : {"float64", "float32"}) {
      const auto f = d2l::testing::load_fixture(std::string(name) + "_" + dname);
      const auto dtype = d2l::testing::golden::dtype_of(dname);
      const Tolerance tol = dname == "float64" ? Tolerance{1e-9, 1e-11} : Tolerance{2e-5, 2e-6};
      std::vector<AttentionBackend> backends = {AttentionBackend::kComposite,
                                                AttentionBackend::kFused};
      // LibTorch 2.x's own at::scaled_dot_product_attention, given the same arguments.
      if (d2l::sdpa_available()) backends.push_back(AttentionBackend::kSdpa);
      for (const auto backend : backends) {
        const auto what = fmt::format("{} {} {}", name, dname, d2l::to_string(backend));
        const auto r = run(f, dtype, backend);
        EXPECT_TRUE(close_to(r.out, f.tensor("output"), tol, what + " output"));
        EXPECT_TRUE(close_to(r.dq, f.tensor("grad.query"), tol, what + " grad.query"));
        EXPECT_TRUE(close_to(r.dk, f.tensor("grad.key"), tol, what + " grad.key"));
        EXPECT_TRUE(close_to(r.dv, f.tensor("grad.value"), tol, what + " grad.value"));
      }
    }
  }
}

// bfloat16 and float16 against Python's float64 numbers, normwise in units
// of their rounding; the kernels no further from them than the composite.
TEST_P(SdpaParity, ReducedPrecisionFollowsPython) {
  for (const auto& c : kCases) {
    const std::string name = c.name;
    const auto f = d2l::testing::load_fixture(name + "_float64");
    if (f.tensor("output").numel() == 0) continue;
    for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
      const double unit = dtype == torch::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const auto fused = run(f, dtype, AttentionBackend::kFused);
      const auto composite = run(f, dtype, AttentionBackend::kComposite);
      const std::pair<const char*, torch::Tensor Result::*> parts[] = {{"output", &Result::out},
                                                                       {"grad.query", &Result::dq},
                                                                       {"grad.key", &Result::dk},
                                                                       {"grad.value", &Result::dv}};
      for (const auto& [part, member] : parts) {
        const auto exact = f.tensor(part);
        if (exact.numel() == 0) continue;
        const double ours = d2l::testing::normwise_error(fused.*member, exact) / unit;
        const double book = d2l::testing::normwise_error(composite.*member, exact) / unit;
        EXPECT_LT(ours, 8) << name << " " << c10::toString(dtype) << " " << part;
        EXPECT_LT(ours, 2 * book + 2) << name << " " << c10::toString(dtype) << " " << part;
        EXPECT_EQ((fused.*member).scalar_type(), dtype);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, SdpaParity, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

std::string path_of(const std::string& name, torch::Dtype dtype = torch::kFloat,
                    AttentionBackend backend = AttentionBackend::kAuto, double dropout = 0) {
  const auto f = d2l::testing::load_fixture(name + "_float32");
  return d2l::nn::explain_path(f.tensor("query").to(dtype), f.tensor("key").to(dtype),
                               f.tensor("value").to(dtype),
                               options_of(f, dtype).backend(backend).dropout_p(dropout))
      .path;
}

// The decision table: masks that are lengths (none, causal, boolean or
// 0/-inf prefixes), windows (bands) and grouped heads run the flash kernel;
// other masks, zero sizes and E = 0 the composite path; dropout the fused
// softmax, or with a window the composite path.
TEST(Sdpa, RunsTheKernelsWhereTheMaskIsLengths) {
  for (const auto& [name, kernels] : kCases) {
    if (!kernels) {
      EXPECT_EQ(path_of(name), "composite") << name;
      continue;
    }
    EXPECT_EQ(path_of(name), "flash") << name;
    EXPECT_EQ(path_of(name, torch::kDouble), "flash") << name;
    EXPECT_EQ(path_of(name, torch::kHalf), "flash") << name;
    EXPECT_EQ(path_of(name, torch::kFloat, AttentionBackend::kComposite), "composite") << name;
    // Dropout with a window: the composite path (the fused softmax masks by lengths only).
    const bool window = std::string(name).rfind("sdpa_window", 0) == 0;
    EXPECT_EQ(path_of(name, torch::kFloat, AttentionBackend::kAuto, 0.1),
              window ? "composite" : "fused_softmax")
        << name;
  }
  const auto f = d2l::testing::load_fixture("sdpa_float_bias_float32");
  const auto explained = d2l::nn::explain_path(f.tensor("query"), f.tensor("key"),
                                               f.tensor("value"), options_of(f, torch::kFloat));
  EXPECT_NE(explained.to_string().find("flash: a float attn_mask with biases"), std::string::npos)
      << explained.to_string();
  // bfloat16 takes its own kernel where the instruction set has it.
  const auto bf16 = path_of("sdpa_long", torch::kBFloat16);
  EXPECT_EQ(bf16, d2l::cpu_isa() >= d2l::CpuIsa::kAvx512Bf16 ? "flash_bf16" : "flash");
}

// Grouped heads at sizes where the flash kernel runs several key blocks and
// blocks of queries that span two heads of a group, forward and backward, in
// float and bfloat16, against the composite path (which repeats K and V).
TEST_P(SdpaParity, GroupedHeadsMatchRepeatedKeys) {
  torch::manual_seed(11);
  for (const int64_t g : {2, 4, 8}) {
    const int64_t B = 2, Hkv = 2, L = 37, S = 300, E = 32;
    const auto q0 = torch::randn({B, Hkv * g, L, E});
    const auto k0 = torch::randn({B, Hkv, S, E});
    const auto v0 = torch::randn({B, Hkv, S, E});
    const auto G = torch::randn({B, Hkv * g, L, E});
    for (const bool causal : {false, true}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        std::vector<Result> results;
        for (const auto backend : {AttentionBackend::kComposite, AttentionBackend::kFused}) {
          auto q = q0.to(dtype).clone().requires_grad_(), k = k0.to(dtype).clone().requires_grad_(),
               v = v0.to(dtype).clone().requires_grad_();
          const auto out = F::scaled_dot_product_attention(
              q, k, v,
              F::ScaledDotProductAttentionFuncOptions().enable_gqa(true).is_causal(causal).backend(
                  backend));
          (out.to(torch::kFloat) * G).sum().backward();
          results.push_back({out.detach(), q.grad(), k.grad(), v.grad()});
        }
        const double tol = dtype == torch::kFloat ? 1e-5 : 3e-2;
        const auto what = fmt::format("g {} causal {} {}", g, causal, c10::toString(dtype));
        EXPECT_LT(d2l::testing::normwise_error(results[1].out, results[0].out), tol) << what;
        EXPECT_LT(d2l::testing::normwise_error(results[1].dq, results[0].dq), tol) << what;
        EXPECT_LT(d2l::testing::normwise_error(results[1].dk, results[0].dk), tol) << what;
        EXPECT_LT(d2l::testing::normwise_error(results[1].dv, results[0].dv), tol) << what;
      }
    }
  }
}

// Queries laid out (B, L, H, E) and transposed, as models make them, give
// what contiguous ones give.
TEST(Sdpa, TransposedInputsGiveTheSameResult) {
  torch::manual_seed(2);
  const auto q = torch::randn({2, 9, 4, 16}).transpose(1, 2);
  const auto k = torch::randn({2, 12, 2, 16}).transpose(1, 2);
  const auto v = torch::randn({2, 12, 2, 8}).transpose(1, 2);
  const auto options = F::ScaledDotProductAttentionFuncOptions().enable_gqa(true).is_causal(true);
  const auto strided = F::scaled_dot_product_attention(q, k, v, options);
  const auto dense =
      F::scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(), options);
  EXPECT_TRUE(torch::equal(strided, dense));
}

// Dropout is drawn whenever dropout_p > 0, as Python draws it: with one key
// every weight is 1, kept with probability 1 - p and scaled by 1 / (1 - p).
// The kept fraction passes a binomial test at five standard deviations, on
// every path.
TEST(Sdpa, DropoutKeepsWeightsWithProbabilityOneMinusP) {
  torch::manual_seed(4);
  const int64_t rows = 20000;
  const double p = 0.3;
  const auto q = torch::randn({1, 1, rows, 4});
  const auto k = torch::randn({1, 1, 1, 4});
  const auto v = torch::ones({1, 1, 1, 1});
  for (const auto backend : {AttentionBackend::kComposite, AttentionBackend::kAuto}) {
    const auto out = F::scaled_dot_product_attention(
        q, k, v, F::ScaledDotProductAttentionFuncOptions().dropout_p(p).backend(backend));
    const auto kept = (out != 0).to(torch::kDouble);
    EXPECT_TRUE(torch::allclose(out.masked_select(out != 0), torch::full({1}, 1.0 / (1.0 - p)),
                                1e-6, 1e-6));
    const double fraction = kept.mean().item<double>();
    const double sigma = std::sqrt(p * (1 - p) / rows);
    EXPECT_NEAR(fraction, 1 - p, 5 * sigma) << d2l::to_string(backend);
  }
}

// Each bad argument is a c10::Error naming the function and the argument,
// before anything is computed or changed.
TEST(Sdpa, RefusesBadArgumentsByName) {
  const auto q = torch::randn({2, 4, 5, 8}), k = torch::randn({2, 4, 7, 8}),
             v = torch::randn({2, 4, 7, 6});
  const auto q_before = q.clone();
  using Options = F::ScaledDotProductAttentionFuncOptions;
  const auto expect_error = [&](const torch::Tensor& qq, const torch::Tensor& kk,
                                const torch::Tensor& vv, const Options& options,
                                const std::string& words) {
    try {
      F::scaled_dot_product_attention(qq, kk, vv, options);
      ADD_FAILURE() << "no error; expected one saying: " << words;
    } catch (const c10::Error& e) {
      const std::string message = e.what_without_backtrace();
      EXPECT_NE(message.find("d2l::nn::functional::scaled_dot_product_attention"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(words), std::string::npos) << message;
    }
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_error(q[0][0][0], k, v, {}, "query must have at least 2 dimensions");
  expect_error(q.to(torch::kLong), k, v, {}, "query must have a floating-point dtype");
  expect_error(q, k.to(torch::kDouble), v, {}, "key");
  expect_error(q, k.narrow(-1, 0, 4), v, {}, "query and key must have the same feature size E");
  expect_error(q, k, v.narrow(-2, 0, 3), {}, "key and value must have the same number of keys S");
  expect_error(q, k.narrow(1, 0, 2), v.narrow(1, 0, 2), {}, "need enable_gqa");
  expect_error(q.narrow(1, 0, 3), k.narrow(1, 0, 2), v.narrow(1, 0, 2), Options().enable_gqa(true),
               "must be a multiple of the key and value heads");
  expect_error(q, k, v, Options().attn_mask(torch::ones({5, 7}, torch::kLong)),
               "attn_mask must be boolean");
  expect_error(q, k, v, Options().attn_mask(torch::ones({4, 7}, torch::kBool)),
               "attn_mask [4, 7] must broadcast to the scores' shape [2, 4, 5, 7]");
  expect_error(q, k, v, Options().attn_mask(torch::ones({1, 2, 4, 5, 7}, torch::kBool)),
               "must broadcast");
  expect_error(q, k, v, Options().attn_mask(torch::full({5, 7}, nan)), "holds NaN");
  expect_error(q, k, v, Options().attn_mask(torch::full({5, 7}, inf)), "holds +inf");
  expect_error(q, k, v, Options().dropout_p(-0.1), "dropout_p must be in [0, 1), got -0.1");
  expect_error(q, k, v, Options().dropout_p(1.0), "dropout_p must be in [0, 1), got 1");
  expect_error(q, k, v, Options().is_causal(true).attn_mask(torch::ones({5, 7}, torch::kBool)),
               "is_causal and attn_mask are exclusive");
  expect_error(q, k, v, Options().scale(nan), "scale must be finite");
  EXPECT_TRUE(torch::equal(q, q_before));
  // explain_path checks the same.
  EXPECT_THROW(d2l::nn::explain_path(q, k, v, Options().dropout_p(2)), c10::Error);
}

// A row that sees no key gets zeros and zero gradients on every path, as in
// Python 2.5 and later, never NaN, in every dtype.
TEST(Sdpa, RowsThatSeeNoKeyGiveZerosInEveryDtype) {
  torch::manual_seed(9);
  auto mask = torch::ones({3, 40}, torch::kBool);
  mask[1].fill_(false);
  for (const auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const auto backend : {AttentionBackend::kComposite, AttentionBackend::kFused}) {
      for (const bool as_float : {false, true}) {
        auto q = torch::randn({2, 3, 8}).to(dtype).requires_grad_();
        const auto k = torch::randn({2, 40, 8}).to(dtype), v = torch::randn({2, 40, 8}).to(dtype);
        const auto m = as_float ? torch::zeros({3, 40}, dtype)
                                      .masked_fill(mask.logical_not(),
                                                   -std::numeric_limits<double>::infinity())
                                : mask;
        const auto out = F::scaled_dot_product_attention(
            q, k, v, F::ScaledDotProductAttentionFuncOptions().attn_mask(m).backend(backend));
        out.sum().backward();
        const auto what = fmt::format("{} {} float mask {}", c10::toString(dtype),
                                      d2l::to_string(backend), as_float);
        EXPECT_TRUE(out.select(1, 1).eq(0).all().item<bool>()) << what;
        EXPECT_TRUE(q.grad().select(1, 1).eq(0).all().item<bool>()) << what;
        EXPECT_FALSE(out.isnan().any().item<bool>()) << what;
        EXPECT_FALSE(q.grad().isnan().any().item<bool>()) << what;
      }
    }
  }
}

}  // namespace sdpa_tests
