// The names of 0.2 and 0.3 kept for one minor version as deprecated aliases
// (docs/api.md, "Deprecated names"): they still compile and do what they did,
// beside the call that replaces each.

// This file uses them on purpose.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>

#include <type_traits>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using ::testing::HasSubstr;

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

// 0.3's forward_masked and the positional valid_lens of the multi-head
// functional form, beside the one mask argument that replaces them.
TEST(Deprecated, OldAndNewMaskCallsCompileSideBySideAndAgree) {
  namespace F = d2l::functional;
  using d2l::AttentionMask;
  torch::manual_seed(6);
  const auto q = torch::randn({2, 3, 8}), kv = torch::randn({2, 5, 8});
  const auto lens = torch::tensor({2, 5});
  const auto kp = torch::tensor({{false, true, false, true, true}, {false, false, false, false, true}});
  const auto mask = AttentionMask().valid_lens(lens).key_padding_mask(kp);

  d2l::DotProductAttention dot(0.0);
  EXPECT_TRUE(torch::equal(dot->forward_masked(q, kv, kv, mask), dot->forward(q, kv, kv, mask)));
  // The book's call: a lengths tensor is the mask.
  EXPECT_TRUE(torch::equal(dot(q, kv, kv, lens), dot->forward(q, kv, kv, AttentionMask(lens))));

  d2l::MultiHeadAttention mha(8, 8, 8, 8, 2, 0.0);
  EXPECT_TRUE(torch::equal(mha->forward_masked(q, kv, kv, mask), mha->forward(q, kv, kv, mask)));
  EXPECT_TRUE(torch::equal(mha(q, kv, kv, lens), mha->forward(q, kv, kv, AttentionMask(lens))));

  const auto o = F::MultiHeadAttentionFuncOptions(2, mha->W_q->weight, mha->W_k->weight,
                                                  mha->W_v->weight, mha->W_o->weight)
                     .key_padding_mask(kp);
  const auto [old_out, old_weights] = F::multi_head_attention(q, kv, kv, lens, o);
  const auto [new_out, new_weights] =
      F::multi_head_attention(q, kv, kv, F::MultiHeadAttentionFuncOptions(o).valid_lens(lens));
  EXPECT_TRUE(torch::equal(old_out, new_out) && torch::equal(old_weights, new_weights));
  EXPECT_TRUE(torch::equal(new_out, mha->forward(q, kv, kv, mask)));
  EXPECT_EQ(d2l::explain_path(q, kv, kv, lens, o).to_string(),
            d2l::explain_path(q, kv, kv, F::MultiHeadAttentionFuncOptions(o).valid_lens(lens))
                .to_string());
  // Lengths in both places are refused, not silently chosen between.
  EXPECT_THAT(error_message([&] {
                F::multi_head_attention(q, kv, kv, lens,
                                        F::MultiHeadAttentionFuncOptions(o).valid_lens(lens));
              }),
              HasSubstr("d2l::multi_head_attention: valid lengths given twice"));
}

}  // namespace
