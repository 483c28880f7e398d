// Packed sequences (d2l::nn::functional::scaled_dot_product_attention_varlen)
// against PyTorch 2.11 running each sequence on its own (fixtures from
// tests/fixtures/generate_fixtures_sdpa.py), on every instruction set; packed
// equal to padded row by row; its path; its refusals and the window's; threads.
// The windows' own parity cases are in test_sdpa.cpp's table.

#include <d2l/backend.h>
#include <d2l/scaled_dot_product_attention.h>

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "fixture.h"
#include "fused_helpers.h"
#include "golden_compare.h"
#include "test_utils.h"

namespace sdpa_window_tests {

namespace F = d2l::nn::functional;
using d2l::AttentionBackend;
using d2l::testing::error_message;
using d2l::testing::Fixture;
using d2l::testing::golden::close_to;
using d2l::testing::golden::Tolerance;
using ::testing::HasSubstr;

const char* const kVarlenCases[] = {"sdpa_varlen_causal", "sdpa_varlen_cross", "sdpa_varlen_window",
                                    "sdpa_varlen_lower_right", "sdpa_varlen_long"};

F::ScaledDotProductAttentionFuncOptions options_of(const Fixture& f) {
  F::ScaledDotProductAttentionFuncOptions options;
  options.is_causal(f.scalar("is_causal") != 0);
  if (f.scalar("causal_lower_right") != 0) options.causal_variant(F::CausalVariant::kLowerRight);
  if (f.scalar("window_left") >= 0)
    options.window_left(static_cast<int64_t>(f.scalar("window_left")));
  if (f.scalar("window_right") >= 0) {
    options.window_right(static_cast<int64_t>(f.scalar("window_right")));
  }
  return options;
}

struct Result {
  torch::Tensor out, dq, dk, dv;
};

Result run_varlen(const Fixture& f, torch::Dtype dtype, AttentionBackend backend) {
  auto q = f.tensor("query").to(dtype).clone().requires_grad_();
  auto k = f.tensor("key").to(dtype).clone().requires_grad_();
  auto v = f.tensor("value").to(dtype).clone().requires_grad_();
  const auto out = F::scaled_dot_product_attention_varlen(
      q, k, v, f.tensor("cu_seqlens_q").to(torch::kLong), f.tensor("cu_seqlens_k").to(torch::kInt),
      options_of(f).backend(backend));
  (out.to(torch::kDouble) * f.tensor("G").to(torch::kDouble)).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

class VarlenParity : public d2l::testing::Fused {};

TEST_P(VarlenParity, MatchesPythonSequenceBySequence) {
  for (const std::string name : kVarlenCases) {
    for (const std::string dname : {"float64", "float32"}) {
      const auto f = d2l::testing::load_fixture(name + "_" + dname);
      const auto dtype = d2l::testing::golden::dtype_of(dname);
      const Tolerance tol = dname == "float64" ? Tolerance{1e-9, 1e-11} : Tolerance{2e-5, 2e-6};
      for (const auto backend : {AttentionBackend::kAuto, AttentionBackend::kComposite}) {
        const auto what = fmt::format("{} {} {}", name, dname, d2l::to_string(backend));
        const auto r = run_varlen(f, dtype, backend);
        EXPECT_TRUE(close_to(r.out, f.tensor("output"), tol, what + " output"));
        EXPECT_TRUE(close_to(r.dq, f.tensor("grad.query"), tol, what + " grad.query"));
        EXPECT_TRUE(close_to(r.dk, f.tensor("grad.key"), tol, what + " grad.key"));
        EXPECT_TRUE(close_to(r.dv, f.tensor("grad.value"), tol, what + " grad.value"));
      }
    }
    // bfloat16 and float16 within a few of their roundings of Python's float64.
    const auto f = d2l::testing::load_fixture(name + "_float64");
    for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
      const double unit = dtype == torch::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      const auto r = run_varlen(f, dtype, AttentionBackend::kAuto);
      EXPECT_EQ(r.out.scalar_type(), dtype);
      EXPECT_LT(d2l::testing::normwise_error(r.out, f.tensor("output")) / unit, 8) << name;
      EXPECT_LT(d2l::testing::normwise_error(r.dq, f.tensor("grad.query")) / unit, 8) << name;
      EXPECT_LT(d2l::testing::normwise_error(r.dk, f.tensor("grad.key")) / unit, 8) << name;
      EXPECT_LT(d2l::testing::normwise_error(r.dv, f.tensor("grad.value")) / unit, 8) << name;
    }
  }
}

// Packed, each row equals the same row padded: sequences of random lengths in
// a (B, H, Lmax, E) batch with their keys' padding as a boolean mask joined
// with the causal one and the window, against the packed call.
TEST_P(VarlenParity, PackedEqualsPaddedRowByRow) {
  const std::vector<int64_t> lengths = {17, 1, 64, 40, 3};
  const int64_t B = lengths.size(), H = 4, Hk = 2, E = 32, Lmax = 64;
  torch::manual_seed(5);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto opts = torch::TensorOptions().dtype(dtype);
    const auto qp = torch::randn({B, H, Lmax, E}).to(opts),
               kp = torch::randn({B, Hk, Lmax, E}).to(opts),
               vp = torch::randn({B, Hk, Lmax, E}).to(opts);
    std::vector<torch::Tensor> qs, ks, vs;
    std::vector<int64_t> cu = {0};
    for (int64_t b = 0; b < B; ++b) {
      qs.push_back(qp[b].narrow(1, 0, lengths[b]).transpose(0, 1));
      ks.push_back(kp[b].narrow(1, 0, lengths[b]).transpose(0, 1));
      vs.push_back(vp[b].narrow(1, 0, lengths[b]).transpose(0, 1));
      cu.push_back(cu.back() + lengths[b]);
    }
    const auto cu_t = torch::tensor(cu, torch::kLong);
    const auto packed = F::scaled_dot_product_attention_varlen(
        torch::cat(qs), torch::cat(ks), torch::cat(vs), cu_t, cu_t,
        F::ScaledDotProductAttentionFuncOptions().is_causal(true).window_left(9));
    const auto len = torch::tensor(lengths, torch::kLong).view({B, 1, 1, 1});
    const auto j = torch::arange(Lmax).view({1, 1, 1, Lmax});
    const auto i = torch::arange(Lmax).view({1, 1, Lmax, 1});
    const auto keep = (j < len).logical_and(j <= i).logical_and(j >= i - 9);
    const auto padded = F::scaled_dot_product_attention(
        qp, kp, vp, F::ScaledDotProductAttentionFuncOptions().attn_mask(keep).enable_gqa(true));
    for (int64_t b = 0; b < B; ++b) {
      const auto rows = packed.narrow(0, cu[b], lengths[b]).transpose(0, 1);
      const auto want = padded[b].narrow(1, 0, lengths[b]);
      EXPECT_TRUE(torch::allclose(rows.to(torch::kFloat), want.to(torch::kFloat),
                                  dtype == torch::kFloat ? 1e-5 : 2e-2,
                                  dtype == torch::kFloat ? 1e-5 : 2e-2))
          << "sequence " << b << " " << c10::toString(dtype);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, VarlenParity, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

TEST(Varlen, ExplainsItsPath) {
  const auto q = torch::randn({10, 4, 8}), k = torch::randn({12, 2, 8}),
             v = torch::randn({12, 2, 8});
  const auto cu_q = torch::tensor({0, 4, 10}), cu_k = torch::tensor({0, 7, 12});
  const F::ScaledDotProductAttentionFuncOptions causal =
      F::ScaledDotProductAttentionFuncOptions().is_causal(true);
  EXPECT_EQ(d2l::nn::explain_path(q, k, v, cu_q, cu_k, causal).path, "flash");
  EXPECT_EQ(d2l::nn::explain_path(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble),
                                  cu_q, cu_k, causal)
                .path,
            "flash");
  auto with_dropout = causal;
  with_dropout.dropout_p(0.2);
  const auto dropped = d2l::nn::explain_path(q, k, v, cu_q, cu_k, with_dropout);
  EXPECT_EQ(dropped.path, "per_sequence");
  EXPECT_THAT(dropped.to_string(), HasSubstr("dropout"));
  auto composite = causal;
  composite.backend(AttentionBackend::kComposite);
  EXPECT_EQ(d2l::nn::explain_path(q, k, v, cu_q, cu_k, composite).path, "per_sequence");
}

TEST(Varlen, RefusesBadArgumentsByName) {
  const auto q = torch::randn({10, 4, 8}), k = torch::randn({12, 2, 8}),
             v = torch::randn({12, 2, 8});
  const auto cu_q = torch::tensor({0, 4, 10}), cu_k = torch::tensor({0, 7, 12});
  const auto call = [&](const torch::Tensor& q_, const torch::Tensor& k_, const torch::Tensor& cq,
                        const torch::Tensor& ck, F::ScaledDotProductAttentionFuncOptions o = {}) {
    return error_message([&] { F::scaled_dot_product_attention_varlen(q_, k_, v, cq, ck, o); });
  };
  EXPECT_THAT(call(q, k, torch::tensor({1, 4, 10}), cu_k),
              HasSubstr("cu_seqlens_q must start at 0, got 1"));
  EXPECT_THAT(call(q, k, torch::tensor({0, 6, 4, 10}), torch::tensor({0, 1, 2, 12})),
              HasSubstr("cu_seqlens_q must be non-decreasing, got 6 then 4 at index 2"));
  EXPECT_THAT(call(q, k, cu_q, torch::tensor({0, 7, 11})),
              HasSubstr("cu_seqlens_k must end at the number of key rows, 12, got 11"));
  EXPECT_THAT(call(q, k, cu_q, torch::tensor({0, 12})),
              HasSubstr("must hold the same number of sequences, got [3] and [2]"));
  EXPECT_THAT(call(q, k, cu_q.to(torch::kFloat), cu_k),
              HasSubstr("cu_seqlens_q must be 1-D int32 or int64 offsets (B + 1), got Float"));
  EXPECT_THAT(call(q.view({10, 32}), k, cu_q, cu_k),
              HasSubstr("query must be (total tokens, heads, features), got [10, 32]"));
  EXPECT_THAT(call(torch::randn({10, 3, 8}), k, cu_q, cu_k),
              HasSubstr("query heads must be a multiple of the key and value heads"));
  EXPECT_THAT(call(q, k, cu_q, cu_k,
                   F::ScaledDotProductAttentionFuncOptions().attn_mask(torch::ones({10, 12}))),
              HasSubstr("attn_mask is not taken"));
  EXPECT_THAT(call(q, k, cu_q, cu_k, F::ScaledDotProductAttentionFuncOptions().window_left(-1)),
              HasSubstr("window_left must be at least 0 (or unset: unbounded), got -1"));
  EXPECT_THAT(call(q, k, cu_q, cu_k, F::ScaledDotProductAttentionFuncOptions().dropout_p(1.0)),
              HasSubstr("dropout_p must be in [0, 1), got 1"));
  // The window's refusals in the padded form too.
  EXPECT_THAT(error_message([&] {
                F::scaled_dot_product_attention(
                    torch::randn({2, 5, 8}), torch::randn({2, 5, 8}), torch::randn({2, 5, 8}),
                    F::ScaledDotProductAttentionFuncOptions().window_right(-3));
              }),
              HasSubstr("scaled_dot_product_attention: window_right must be at least 0"));
}

// Threads that pack their own batches and share nothing but the library
// get what one thread gets, forward and backward.
TEST(Varlen, ThreadsCallItAtOnce) {
  torch::manual_seed(11);
  const auto q = torch::randn({150, 4, 16}), k = torch::randn({150, 2, 16}),
             v = torch::randn({150, 2, 16});
  const auto cu = torch::tensor({0, 30, 31, 100, 150});
  const auto opts = F::ScaledDotProductAttentionFuncOptions().is_causal(true).window_left(20);
  const auto once = [&] {
    auto qq = q.clone().requires_grad_();
    auto out = F::scaled_dot_product_attention_varlen(qq, k, v, cu, cu, opts);
    out.sum().backward();
    return std::vector<torch::Tensor>{out.detach(), qq.grad()};
  };
  const auto expected = once();
  std::vector<std::vector<torch::Tensor>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 10; ++r) got[t] = once();
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& g : got) {
    EXPECT_TRUE(torch::allclose(g[0], expected[0], 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(g[1], expected[1], 1e-6, 1e-6));
  }
}

// Inputs of 32 MiB and more that are not laid out heads first are copied
// into memory mapped ahead of the kernels (detail::contiguous_input):
// packed rows (T, H, E) and (B, L, H, E) views give, output and every
// gradient to the bit, what the same numbers laid out heads first give.
TEST(Varlen, LargeTransposedInputsGiveWhatHeadsFirstGives) {
  torch::manual_seed(12);
  // 128 sequences of 64 tokens, 8 heads of 128 features: 33.5 MB of float a tensor.
  constexpr int64_t kSeqs = 128, kLen = 64, kHeads = 8, kFeatures = 128;
  const auto cu = torch::arange(0, kSeqs * kLen + 1, kLen);
  const auto opts = F::ScaledDotProductAttentionFuncOptions().is_causal(true);
  std::vector<torch::Tensor> data;  // (B, H, L, E)
  for (int i = 0; i < 3; ++i) data.push_back(torch::randn({kSeqs, kHeads, kLen, kFeatures}));
  const auto upstream = torch::randn({kSeqs, kHeads, kLen, kFeatures});
  // The packed rows (T, H, E) of (B, H, L, E).
  const auto packed = [&](const torch::Tensor& t) {
    return t.transpose(1, 2).reshape({kSeqs * kLen, kHeads, kFeatures});
  };
  // The call on (T, H, E) rows (varlen) or (B, H, L, E), given as leaves of
  // that layout or as views of leaves with two dimensions swapped (heads
  // first for packed rows, heads inside each token's row for the padded
  // form); its output and the gradients in the call's layout.
  const auto run = [&](bool swapped, bool varlen) {
    const int64_t a = varlen ? 0 : 1;
    std::vector<torch::Tensor> leaves, args;
    for (const auto& t : data) {
      const auto x = varlen ? packed(t) : t;
      leaves.push_back((swapped ? x.transpose(a, a + 1).contiguous() : x.clone()).requires_grad_());
      args.push_back(swapped ? leaves.back().transpose(a, a + 1) : leaves.back());
    }
    const auto out =
        varlen ? F::scaled_dot_product_attention_varlen(args[0], args[1], args[2], cu, cu, opts)
               : F::scaled_dot_product_attention(args[0], args[1], args[2], opts);
    (out * (varlen ? packed(upstream) : upstream)).sum().backward();
    std::vector<torch::Tensor> got{out.detach()};
    for (auto& leaf : leaves)
      got.push_back(swapped ? leaf.grad().transpose(a, a + 1) : leaf.grad());
    return got;
  };
  for (const bool varlen : {true, false}) {
    SCOPED_TRACE(varlen ? "varlen" : "padded");
    // Packed rows heads inside are copied, heads first not; the padded form
    // the other way round.
    const auto copied = run(/*swapped=*/!varlen, varlen);
    const auto in_place = run(/*swapped=*/varlen, varlen);
    for (size_t i = 0; i < copied.size(); ++i) {
      ASSERT_TRUE(copied[i].defined() && in_place[i].defined()) << i;
      EXPECT_TRUE(torch::equal(copied[i], in_place[i])) << i;
    }
  }
}

}  // namespace sdpa_window_tests
