// Grouped-query heads in the book's MultiHeadAttention (num_kv_heads) and its
// functional form (W_k and W_v of fewer rows): equal to the same module with
// each key/value head's weights repeated for its query heads, forward and
// backward, on every path and dtype, with masks; the cache holds only the
// key/value heads and decodes as the whole sequence does; its path and its
// refusals.

#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include <sstream>
#include <string>

#include "test_utils.h"

namespace mha_gqa_tests {

using d2l::AttentionBackend;
using d2l::testing::error_message;
using ::testing::HasSubstr;

constexpr int64_t kHeads = 8, kKvHeads = 2, kHiddens = 64, kIn = 12;

d2l::MultiHeadAttentionOptions options(std::optional<int64_t> kv, AttentionBackend backend) {
  return d2l::MultiHeadAttentionOptions(kIn, kIn, kIn, kHiddens, kHeads)
      .bias(true)
      .num_kv_heads(kv)
      .backend(backend);
}

// W (g · d, in) with each key/value head's rows repeated for its group: (h, in).
torch::Tensor repeat_heads(const torch::Tensor& W) {
  const int64_t d = kHiddens / kHeads;
  const auto shape = W.dim() == 2 ? std::vector<int64_t>{kKvHeads, d, W.size(1)}
                                  : std::vector<int64_t>{kKvHeads, d};
  auto out = W.view(shape).repeat_interleave(kHeads / kKvHeads, 0);
  return W.dim() == 2 ? out.reshape({kHiddens, W.size(1)}) : out.reshape({kHiddens});
}

// The repeated module's gradient of a repeated weight, summed back per group.
torch::Tensor sum_groups(const torch::Tensor& G) {
  const int64_t d = kHiddens / kHeads, g = kHeads / kKvHeads;
  if (G.dim() == 2) return G.view({kKvHeads, g, d, G.size(1)}).sum(1).reshape({kKvHeads * d, -1});
  return G.view({kKvHeads, g, d}).sum(1).reshape({kKvHeads * d});
}

struct Pair {
  d2l::MultiHeadAttention grouped{nullptr}, repeated{nullptr};
};

Pair make_pair(torch::Dtype dtype, AttentionBackend backend) {
  torch::manual_seed(1);
  Pair p{d2l::MultiHeadAttention(options(kKvHeads, backend)),
         d2l::MultiHeadAttention(options(std::nullopt, backend))};
  p.grouped->to(dtype);
  p.repeated->to(dtype);
  torch::NoGradGuard no_grad;
  p.repeated->W_q->weight.copy_(p.grouped->W_q->weight);
  p.repeated->W_q->bias.copy_(p.grouped->W_q->bias);
  p.repeated->W_o->weight.copy_(p.grouped->W_o->weight);
  p.repeated->W_o->bias.copy_(p.grouped->W_o->bias);
  p.repeated->W_k->weight.copy_(repeat_heads(p.grouped->W_k->weight));
  p.repeated->W_k->bias.copy_(repeat_heads(p.grouped->W_k->bias));
  p.repeated->W_v->weight.copy_(repeat_heads(p.grouped->W_v->weight));
  p.repeated->W_v->bias.copy_(repeat_heads(p.grouped->W_v->bias));
  return p;
}

TEST(MultiHeadGqa, EqualsRepeatedKeyValueHeadsForwardAndBackward) {
  const int64_t B = 3, n = 37, m = 45;
  for (const auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16}) {
    for (const auto backend : {AttentionBackend::kAuto, AttentionBackend::kComposite}) {
      for (int mask_kind = 0; mask_kind < 4; ++mask_kind) {
        SCOPED_TRACE(
            fmt::format("{} {} mask {}", c10::toString(dtype), d2l::to_string(backend), mask_kind));
        auto p = make_pair(dtype, backend);
        torch::manual_seed(2);
        const auto q = torch::randn({B, n, kIn}).to(dtype), k = torch::randn({B, m, kIn}).to(dtype),
                   v = torch::randn({B, m, kIn}).to(dtype);
        d2l::AttentionMask mask;
        if (mask_kind == 1) mask.valid_lens(torch::tensor({45, 3, 0}));
        if (mask_kind == 2) mask.valid_lens(torch::randint(0, m + 1, {B, n}));
        if (mask_kind == 3) mask.is_causal(true);
        const auto [out_g, w_g] = p.grouped->forward_with_weights(q, k, v, mask);
        const auto [out_r, w_r] = p.repeated->forward_with_weights(q, k, v, mask);
        const double tol = dtype == torch::kDouble ? 1e-12 : dtype == torch::kFloat ? 2e-5 : 3e-2;
        EXPECT_TRUE(torch::allclose(out_g.to(torch::kDouble), out_r.to(torch::kDouble), tol, tol));
        EXPECT_EQ(w_g.sizes(), (std::vector<int64_t>{B * kHeads, n, m}));
        EXPECT_TRUE(torch::allclose(w_g.to(torch::kDouble), w_r.to(torch::kDouble), tol, tol));
        const auto G = torch::randn(out_g.sizes()).to(dtype);
        (out_g * G).sum().backward();
        (out_r * G).sum().backward();
        const auto close = [&](const torch::Tensor& a, const torch::Tensor& b) {
          return torch::allclose(a.to(torch::kDouble), b.to(torch::kDouble), 10 * tol, 10 * tol);
        };
        EXPECT_TRUE(close(p.grouped->W_q->weight.grad(), p.repeated->W_q->weight.grad()));
        EXPECT_TRUE(
            close(p.grouped->W_k->weight.grad(), sum_groups(p.repeated->W_k->weight.grad())));
        EXPECT_TRUE(
            close(p.grouped->W_v->weight.grad(), sum_groups(p.repeated->W_v->weight.grad())));
        EXPECT_TRUE(close(p.grouped->W_v->bias.grad(), sum_groups(p.repeated->W_v->bias.grad())));
      }
    }
  }
}

// Decoding step by step over the cache equals the causal whole sequence; the
// cache holds num_kv_heads heads of features.
TEST(MultiHeadGqa, CacheHoldsKeyValueHeadsAndDecodesAsTheWhole) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto p = make_pair(dtype, AttentionBackend::kAuto);
    p.grouped->eval();
    torch::NoGradGuard no_grad;
    const int64_t B = 2, steps = 9;
    const auto x = torch::randn({B, steps, kIn}).to(dtype);
    const auto whole = p.grouped->forward(x, x, x, d2l::AttentionMask().is_causal(true));
    d2l::MultiHeadAttentionCache cache;
    for (int64_t t = 0; t < steps; ++t) {
      const auto xt = x.narrow(1, t, 1);
      const auto out = p.grouped->forward_cached(xt, xt, xt, cache);
      EXPECT_TRUE(torch::allclose(out.to(torch::kFloat), whole.narrow(1, t, 1).to(torch::kFloat),
                                  dtype == torch::kFloat ? 1e-5 : 3e-2,
                                  dtype == torch::kFloat ? 1e-5 : 3e-2))
          << "step " << t << " " << c10::toString(dtype);
    }
    EXPECT_EQ(cache.keys().sizes(), (std::vector<int64_t>{B, steps, kHiddens / kHeads * kKvHeads}));
  }
}

TEST(MultiHeadGqa, RunsThePerHeadPathAndSaysWhy) {
  auto p = make_pair(torch::kFloat, AttentionBackend::kAuto);
  const auto x = torch::randn({2, 5, kIn});
  const auto explained = p.grouped->explain_path(x, x, x);
  EXPECT_EQ(explained.path, "flash");
  EXPECT_THAT(explained.to_string(),
              HasSubstr("small_heads: grouped-query heads (the per-head path folds them)"));
  std::ostringstream printed;
  p.grouped->pretty_print(printed);
  EXPECT_THAT(printed.str(), HasSubstr("num_heads=8, num_kv_heads=2, dropout="));
}

TEST(MultiHeadGqa, RefusesHeadsThatDoNotDivide) {
  EXPECT_THAT(
      error_message([] { auto m = d2l::MultiHeadAttention(options(3, AttentionBackend::kAuto)); }),
      HasSubstr("num_kv_heads must divide num_heads=8 (each key/value head serving a "
                "group of query heads), got num_kv_heads=3"));
  EXPECT_THAT(
      error_message([] { auto m = d2l::MultiHeadAttention(options(0, AttentionBackend::kAuto)); }),
      HasSubstr("got num_kv_heads=0"));
  const auto Wq = torch::randn({kHiddens, kIn}), Wk = torch::randn({24, kIn}),
             Wo = torch::randn({kHiddens, kHiddens});
  const auto x = torch::randn({2, 5, kIn});
  EXPECT_THAT(error_message([&] {
                d2l::functional::multi_head_attention(
                    x, x, x,
                    d2l::functional::MultiHeadAttentionFuncOptions(kHeads, Wq, Wk, Wk, Wo));
              }),
              HasSubstr("W_k and W_v must have num_hiddens=64 rows, or num_hiddens / num_heads = "
                        "8 times a number of key/value heads that divides num_heads=8"));
  EXPECT_THAT(error_message([&] {
                d2l::functional::multi_head_attention(
                    x, x, x,
                    d2l::functional::MultiHeadAttentionFuncOptions(kHeads, Wq, Wk.narrow(0, 0, 16),
                                                                   Wk, Wo));
              }),
              HasSubstr("W_v must have shape [16, 12], got [24, 12]"));
}

}  // namespace mha_gqa_tests
