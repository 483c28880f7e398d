// The names of 0.2 kept for one minor version as deprecated aliases
// (docs/api.md, "Deprecated names"): they still compile and do what they did.

// This file uses them on purpose.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>

#include <type_traits>

#include "test_utils.h"

namespace {

TEST(Deprecated, PathIsAttentionBackend) {
  static_assert(std::is_same_v<d2l::Path, d2l::AttentionBackend>);
  EXPECT_EQ(d2l::to_string(d2l::Path::kFused), "fused");
  torch::manual_seed(3);
  const auto X = torch::randn({2, 3, 5});
  const auto lens = torch::tensor({{1, 5, 0}, {3, 2, 9}});
  EXPECT_TRUE(torch::equal(d2l::masked_softmax(X, lens, d2l::Path::kComposite),
                           d2l::masked_softmax(X, lens, d2l::AttentionBackend::kComposite)));
}

TEST(Deprecated, PathOptionsSetAndReadTheBackend) {
  auto dot = d2l::DotProductAttentionOptions().path(d2l::Path::kComposite);
  EXPECT_EQ(dot.backend(), d2l::AttentionBackend::kComposite);
  EXPECT_EQ(dot.path(), d2l::AttentionBackend::kComposite);
  auto additive = d2l::AdditiveAttentionOptions(2, 3, 4).path(d2l::AttentionBackend::kFused);
  EXPECT_EQ(additive.backend(), d2l::AttentionBackend::kFused);
  EXPECT_EQ(additive.path(), d2l::AttentionBackend::kFused);
  auto mha = d2l::MultiHeadAttentionOptions(2, 3, 4, 8, 2).path(d2l::Path::kComposite);
  EXPECT_EQ(mha.backend(), d2l::AttentionBackend::kComposite);
  d2l::MultiHeadAttention module(mha);
  EXPECT_EQ(module->attention->options.backend(), d2l::AttentionBackend::kComposite);
  const auto func = d2l::functional::MultiHeadAttentionFuncOptions(2, {}, {}, {}, {}).path(
      d2l::AttentionBackend::kFused);
  EXPECT_EQ(func.backend(), d2l::AttentionBackend::kFused);
  EXPECT_EQ(func.path(), d2l::AttentionBackend::kFused);
}

TEST(Deprecated, PositionalFunctionalFormsMatchTheFuncOptions) {
  namespace F = d2l::functional;
  torch::manual_seed(4);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 3});
  const auto lens = torch::tensor({2, 5});
  for (auto backend : {d2l::AttentionBackend::kComposite, d2l::AttentionBackend::kFused}) {
    const auto [out, weights] = F::dot_product_attention(q, k, v, lens, 0.0, false, backend, true);
    const auto [want, want_weights] = F::dot_product_attention(
        q, k, v, F::DotProductAttentionFuncOptions().valid_lens(lens).backend(backend));
    EXPECT_TRUE(torch::equal(out, want) && torch::equal(weights, want_weights));

    const auto W_q = torch::randn({6, 4}), W_k = torch::randn({6, 4}), w_v = torch::randn({1, 6});
    const auto [a_out, a_weights] =
        F::additive_attention(q, k, v, W_q, W_k, w_v, lens, 0.0, false, backend, true);
    const auto [a_want, a_want_weights] = F::additive_attention(
        q, k, v, F::AdditiveAttentionFuncOptions(W_q, W_k, w_v).valid_lens(lens).backend(backend));
    EXPECT_TRUE(torch::equal(a_out, a_want) && torch::equal(a_weights, a_want_weights));

    const auto pq = torch::randn({2, 3, 6}), pk = torch::randn({2, 5, 6});
    EXPECT_TRUE(torch::equal(F::additive_scores(pq, pk, w_v, backend),
                             F::additive_scores(pq, pk, w_v,
                                                F::AdditiveScoresFuncOptions().backend(backend))));
  }
}

}  // namespace
