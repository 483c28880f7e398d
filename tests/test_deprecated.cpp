// The names before 0.2, kept for one release as deprecated aliases
// (README, "Deprecated names"): they still compile and do what they did.

// This file uses them on purpose.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masking.h>
#include <d2l/multi_head_attention.h>

#include <type_traits>

#include "test_utils.h"

namespace {

TEST(Deprecated, ImplIsPath) {
  static_assert(std::is_same_v<d2l::Impl, d2l::Path>);
  EXPECT_EQ(d2l::to_string(d2l::Impl::kFused), "fused");
}

TEST(Deprecated, ImplOptionsSetAndReadThePath) {
  auto dot = d2l::DotProductAttentionOptions().impl(d2l::Impl::kComposite);
  EXPECT_EQ(dot.path(), d2l::Path::kComposite);
  EXPECT_EQ(dot.impl(), d2l::Path::kComposite);
  auto additive = d2l::AdditiveAttentionOptions(2, 3, 4).impl(d2l::Path::kFused);
  EXPECT_EQ(additive.path(), d2l::Path::kFused);
  auto mha = d2l::MultiHeadAttentionOptions(2, 3, 4, 8, 2).impl(d2l::Path::kComposite);
  EXPECT_EQ(mha.path(), d2l::Path::kComposite);
  d2l::MultiHeadAttention module(mha);
  EXPECT_EQ(module->attention->options.path(), d2l::Path::kComposite);
}

TEST(Deprecated, MaskedSoftmaxNamespacesRunTheirPath) {
  torch::manual_seed(3);
  const auto X = torch::randn({2, 3, 5});
  const auto lens = torch::tensor({{1, 5, 0}, {3, 2, 9}});
  EXPECT_TRUE(torch::equal(d2l::composite::masked_softmax(X, lens),
                           d2l::masked_softmax(X, lens, d2l::Path::kComposite)));
  EXPECT_TRUE(torch::equal(d2l::fused::masked_softmax(X, lens),
                           d2l::masked_softmax(X, lens, d2l::Path::kFused)));
  EXPECT_TRUE(
      torch::equal(d2l::sequence_mask(X, torch::tensor({1, 2})),
                   X * (torch::arange(3) < torch::tensor({1, 2}).unsqueeze(1)).unsqueeze(-1)));
}

}  // namespace
