// Reliability, unusual tensors: sparse (and other non-strided) arguments are
// refused by our checks, naming the function and the argument, before they
// reach ATen; float16 on a CPU without float16 matrix products (LibTorch
// 1.13) is refused with a message saying what to use instead; the inputs of
// a refused call are left as they were.

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/sequence_mask.h>

#include <functional>
#include <string>
#include <vector>

#include "checks.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::sparse;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Refusal {
  std::string what;
  std::function<void()> call;
  std::string function, argument;
};


std::vector<Refusal> sparse_refusals() {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  const auto lens = torch::tensor({1, 4}), lens2 = torch::tensor({{1, 2, 3}, {4, 5, 0}});
  const auto W_q = torch::randn({6, 4}), W_k = torch::randn({6, 4}), w_v = torch::randn({1, 6});
  const auto X = torch::randn({2, 3, 5});
  namespace F = d2l::functional;
  return {
      {"sequence_mask X", [=] { d2l::sequence_mask(sparse(X), lens); }, "d2l::sequence_mask", "X"},
      {"sequence_mask valid_len", [=] { d2l::sequence_mask(X, sparse(lens)); },
       "d2l::sequence_mask", "valid_len"},
      {"masked_softmax X", [=] { d2l::masked_softmax(sparse(X), lens); }, "d2l::masked_softmax",
       "X"},
      {"masked_softmax X, no lengths", [=] { d2l::masked_softmax(sparse(X)); },
       "d2l::masked_softmax", "X"},
      {"masked_softmax 1-D lengths", [=] { d2l::masked_softmax(X, sparse(lens)); },
       "d2l::masked_softmax", "valid_lens"},
      {"masked_softmax 2-D lengths", [=] { d2l::masked_softmax(X, sparse(lens2)); },
       "d2l::masked_softmax", "valid_lens"},
      {"dot_product_attention queries",
       [=] {
         F::dot_product_attention(sparse(q), k, v,
                                  F::DotProductAttentionFuncOptions().valid_lens(lens));
       },
       "d2l::dot_product_attention", "queries"},
      {"dot_product_attention keys",
       [=] {
         F::dot_product_attention(q, sparse(k), v,
                                  F::DotProductAttentionFuncOptions().valid_lens(lens));
       },
       "d2l::dot_product_attention", "keys"},
      {"dot_product_attention values",
       [=] {
         F::dot_product_attention(q, k, sparse(v),
                                  F::DotProductAttentionFuncOptions().valid_lens(lens));
       },
       "d2l::dot_product_attention", "values"},
      {"dot_product_attention lengths",
       [=] {
         F::dot_product_attention(q, k, v,
                                  F::DotProductAttentionFuncOptions().valid_lens(sparse(lens2)));
       },
       "d2l::dot_product_attention", "valid_lens"},
      {"DotProductAttention lengths", [=] { d2l::DotProductAttention(0.0)(q, k, v, sparse(lens)); },
       "d2l::dot_product_attention", "valid_lens"},  // forward is the functional form
      {"additive_attention W_q",
       [=] {
         F::additive_attention(
             q, k, v, F::AdditiveAttentionFuncOptions(sparse(W_q), W_k, w_v).valid_lens(lens));
       },
       "d2l::additive_attention", "W_q"},
      {"additive_attention w_v",
       [=] {
         F::additive_attention(
             q, k, v, F::AdditiveAttentionFuncOptions(W_q, W_k, sparse(w_v)).valid_lens(lens));
       },
       "d2l::additive_attention", "w_v"},
      {"additive_attention lengths",
       [=] {
         F::additive_attention(
             q, k, v, F::AdditiveAttentionFuncOptions(W_q, W_k, w_v).valid_lens(sparse(lens)));
       },
       "d2l::additive_attention", "valid_lens"},
      {"additive_scores projected_keys",
       [=] {
         F::additive_scores(torch::randn({2, 3, 6}), sparse(torch::randn({2, 5, 6})), w_v);
       },
       "d2l::additive_scores", "projected_keys"},
      {"AdditiveAttention queries",
       [=] { d2l::AdditiveAttention(4, 4, 6, 0.0)(sparse(q), k, v, lens); },
       "d2l::AdditiveAttention", "queries"},
  };
}

TEST(ReliabilityLayouts, SparseArgumentsAreRefusedByName) {
  for (const auto& r : sparse_refusals()) {
    EXPECT_THAT(error_message(r.call),
                AllOf(HasSubstr(r.function + ": "), HasSubstr(r.argument + " must be a dense"),
                      HasSubstr("Sparse")))
        << r.what;
  }
}

TEST(ReliabilityLayouts, Float16OnTheCpuWorksOrIsRefusedWithAdvice) {
  torch::manual_seed(3);
  const auto q = torch::randn({2, 3, 4}).to(torch::kHalf);
  const auto k = torch::randn({2, 5, 4}).to(torch::kHalf);
  const auto v = torch::randn({2, 5, 2}).to(torch::kHalf);
  const auto lens = torch::tensor({1, 4});
  const auto q_before = q.clone(), k_before = k.clone(), v_before = v.clone();
  const auto call = [&] {
    return d2l::functional::dot_product_attention(
        q, k, v, d2l::functional::DotProductAttentionFuncOptions().valid_lens(lens));
  };
  if (d2l::detail::cpu_float16_matmul_available()) {
    const auto [out, weights] = call();
    const auto [expected, expected_weights] = d2l::functional::dot_product_attention(
        q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat),
        d2l::functional::DotProductAttentionFuncOptions().valid_lens(lens));
    EXPECT_TRUE(torch::allclose(out.to(torch::kFloat), expected, 1e-2, 1e-2));
  } else {
    EXPECT_THAT(error_message(call),
                AllOf(HasSubstr("d2l::dot_product_attention: float16 on the CPU needs LibTorch "
                                "2.x"),
                      HasSubstr("[2, 3, 4]"), HasSubstr("use bfloat16 or float32")));
    const auto W = torch::randn({6, 4}).to(torch::kHalf);
    const auto w_v = torch::randn({1, 6}).to(torch::kHalf);
    EXPECT_THAT(error_message([&] {
                  d2l::functional::additive_attention(
                      q, k, v,
                      d2l::functional::AdditiveAttentionFuncOptions(W, W, w_v).valid_lens(lens));
                }),
                HasSubstr("d2l::additive_attention: float16 on the CPU needs LibTorch 2.x"));
  }
  EXPECT_TRUE(torch::equal(q, q_before) && torch::equal(k, k_before) && torch::equal(v, v_before));
}

}  // namespace
