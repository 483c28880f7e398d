// Module behaviour shared with LibTorch's own modules: printing, cloning,
// modes, conversion, serialisation and use inside containers.

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>

#include <sstream>

#include "test_utils.h"

namespace {

using d2l::testing::printed;

TEST(Modules, PrettyPrint) {
  EXPECT_EQ(printed(*d2l::AdditiveAttention(2, 20, 8, 0.1)),
            "d2l::AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)");
  EXPECT_EQ(printed(*d2l::DotProductAttention(0.5)), "d2l::DotProductAttention(dropout=0.5)");
  EXPECT_EQ(printed(*d2l::AdditiveAttention(d2l::AdditiveAttentionOptions(3, 4, 5).dropout(0.25))),
            "d2l::AdditiveAttention(key_size=3, query_size=4, num_hiddens=5, dropout=0.25)");
  EXPECT_EQ(printed(*d2l::DotProductAttention(d2l::DotProductAttentionOptions().dropout(0.2))),
            "d2l::DotProductAttention(dropout=0.2)");
}

TEST(Modules, CloneIsADeepCopy) {
  d2l::AdditiveAttention original(2, 3, 4, 0.1);
  auto copy = std::dynamic_pointer_cast<d2l::AdditiveAttentionImpl>(original->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->options.num_hiddens(), 4);
  EXPECT_TRUE(torch::equal(copy->W_q->weight, original->W_q->weight));
  {
    torch::NoGradGuard no_grad;
    copy->W_q->weight.add_(1);
  }
  EXPECT_FALSE(torch::equal(copy->W_q->weight, original->W_q->weight));
  EXPECT_EQ(copy->named_parameters().size(), 3u);
  auto dot_copy = std::dynamic_pointer_cast<d2l::DotProductAttentionImpl>(
      d2l::DotProductAttention(0.3)->clone());
  ASSERT_TRUE(dot_copy);
  EXPECT_DOUBLE_EQ(dot_copy->options.dropout(), 0.3);
}

TEST(Modules, TrainAndEvalSwitchDropout) {
  d2l::AdditiveAttention attention(2, 2, 4, 0.5);
  const auto q = torch::randn({4, 8, 2}), k = torch::randn({4, 16, 2}),
             v = torch::randn({4, 16, 3});
  attention->eval();
  EXPECT_FALSE(attention->dropout->is_training());
  const auto a = attention(q, k, v), b = attention(q, k, v);
  EXPECT_TRUE(torch::equal(a, b));
  attention->train();
  EXPECT_TRUE(attention->dropout->is_training());
  EXPECT_FALSE(torch::equal(attention(q, k, v), a));
}

TEST(Modules, ToDtypeConvertsParameters) {
  d2l::AdditiveAttention attention(2, 3, 4, 0.0);
  attention->to(torch::kDouble);
  for (const auto& p : attention->parameters()) EXPECT_EQ(p.scalar_type(), torch::kDouble);
  const auto out =
      attention(torch::randn({1, 2, 3}, torch::kDouble), torch::randn({1, 4, 2}, torch::kDouble),
                torch::randn({1, 4, 5}, torch::kDouble));
  EXPECT_EQ(out.scalar_type(), torch::kDouble);
}

TEST(Modules, SaveAndLoadRoundTrip) {
  d2l::AdditiveAttention saved(2, 3, 4, 0.1);
  std::stringstream buffer;
  torch::save(saved, buffer);
  d2l::AdditiveAttention loaded(2, 3, 4, 0.1);
  torch::load(loaded, buffer);
  for (const auto& p : saved->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), loaded->named_parameters()[p.key()])) << p.key();
  }
  saved->eval();
  loaded->eval();
  const auto q = torch::randn({2, 1, 3}), k = torch::randn({2, 5, 2}), v = torch::randn({2, 5, 2});
  EXPECT_TRUE(torch::equal(saved(q, k, v), loaded(q, k, v)));

  // No tensors to carry: the loaded module keeps its own dropout submodule
  // and probability, and computes what the saved one does.
  d2l::DotProductAttention dot(0.2), dot_loaded(0.7);
  const auto* dropout_before = dot_loaded->dropout.get();
  std::stringstream dot_buffer;
  torch::save(dot, dot_buffer);
  torch::load(dot_loaded, dot_buffer);
  EXPECT_EQ(dot_loaded->dropout.get(), dropout_before);
  EXPECT_DOUBLE_EQ(dot_loaded->dropout->options.p(), 0.7);
  dot->eval();
  dot_loaded->eval();
  const auto dq = torch::randn({2, 3, 2}), lens = torch::tensor({1, 4});
  EXPECT_TRUE(torch::equal(dot_loaded(dq, k, v, lens), dot(dq, k, v, lens)));
  EXPECT_FALSE(torch::equal(dot_loaded(dq, k, v, lens), dot_loaded(dq, k, v)));
}

TEST(Modules, DefaultArgumentsWorkInsideContainers) {
  torch::nn::AnyModule any_dot(d2l::DotProductAttention(0.0));
  const auto q = torch::randn({2, 1, 2}), k = torch::randn({2, 5, 2}), v = torch::randn({2, 5, 3});
  EXPECT_EQ(any_dot.forward(q, k, v).sizes(), (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(any_dot.forward(q, k, v, d2l::AttentionMask(torch::tensor({1, 2}))).sizes(),
            (std::vector<int64_t>{2, 1, 3}));

  torch::nn::ModuleList list;
  list->push_back(d2l::AdditiveAttention(2, 2, 4, 0.0));
  list->push_back(d2l::DotProductAttention(0.0));
  EXPECT_EQ(list->size(), 2u);
  EXPECT_EQ(list->named_parameters().size(), 3u);
  EXPECT_TRUE(list->named_parameters().contains("0.W_k.weight"));
  torch::nn::AnyModule any_additive(d2l::AdditiveAttention(2, 2, 4, 0.0));
  EXPECT_EQ(any_additive.forward(q, k, v).sizes(), (std::vector<int64_t>{2, 1, 3}));
}

TEST(Modules, CudaRoundTripWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  d2l::AdditiveAttention attention(2, 2, 4, 0.0);
  const auto q = torch::randn({2, 1, 2}), k = torch::randn({2, 5, 2}), v = torch::randn({2, 5, 3});
  const auto cpu_out = attention(q, k, v, torch::tensor({2, 4}));
  attention->to(torch::Device(torch::kCUDA), torch::kDouble);
  const auto cuda_out = attention(q.cuda().to(torch::kDouble), k.cuda().to(torch::kDouble),
                                  v.cuda().to(torch::kDouble), torch::tensor({2, 4}).cuda());
  EXPECT_TRUE(torch::allclose(cuda_out.cpu().to(torch::kFloat), cpu_out, 1e-5, 1e-6));
}

}  // namespace
