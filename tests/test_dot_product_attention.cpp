#include <d2l/dot_product_attention.h>

#include <fmt/format.h>

#include <cmath>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using d2l::testing::reference_masked_softmax;
using ::testing::HasSubstr;

torch::Tensor reference_dot(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& lens) {
  const auto qd = q.to(torch::kDouble), kd = k.to(torch::kDouble), vd = v.to(torch::kDouble);
  const auto scores = torch::einsum("bnd,bmd->bnm", {qd, kd}) / std::sqrt(double(q.size(2)));
  return torch::einsum("bnm,bmv->bnv", {reference_masked_softmax(scores, lens), vd});
}

TEST(DotProductAttention, BookToyExample) {
  const auto keys = torch::ones({2, 10, 2});
  const auto values = torch::arange(40, torch::kFloat).reshape({1, 10, 4}).repeat({2, 1, 1});
  d2l::DotProductAttention attention(0.5);
  attention->eval();
  const auto out = attention(torch::normal(0, 1, {2, 1, 2}), keys, values, torch::tensor({2, 6}));
  EXPECT_TRUE(
      torch::allclose(out, torch::tensor({{{2.f, 3.f, 4.f, 5.f}}, {{10.f, 11.f, 12.f, 13.f}}})));
  EXPECT_EQ(attention->attention_weights.sizes(), (std::vector<int64_t>{2, 1, 10}));
  EXPECT_NEAR(attention->attention_weights[1][0][5].item<float>(), 1.0 / 6, 1e-7);
}

TEST(DotProductAttention, MatchesADoubleReference) {
  torch::manual_seed(4);
  const auto q = torch::randn({3, 4, 5}), k = torch::randn({3, 7, 5}), v = torch::randn({3, 7, 6});
  d2l::DotProductAttention attention(0.0);
  for (const auto& lens : {torch::Tensor(), torch::tensor({1, 7, 3}),
                           torch::tensor({{1, 2, 3, 4}, {7, 7, 9, 0}, {5, 1, 1, 2}})}) {
    const auto out = attention(q, k, v, lens);
    EXPECT_LT(max_rel_error(out, reference_dot(q, k, v, lens)), 2e-6);
    const auto outd =
        attention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), lens);
    EXPECT_LT(max_rel_error(outd, reference_dot(q, k, v, lens)), 1e-13);
  }
}

TEST(DotProductAttention, FunctionalFormReturnsOutputAndWeights) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  const auto lens = torch::tensor({2, 5});
  auto [out, weights] = d2l::functional::dot_product_attention(
      q, k, v, d2l::functional::DotProductAttentionFuncOptions().valid_lens(lens));
  d2l::DotProductAttention attention(0.0);
  EXPECT_TRUE(torch::equal(attention(q, k, v, lens), out));
  EXPECT_TRUE(torch::equal(attention->attention_weights, weights));
}

// forward_with_weights returns what forward records, with the graph, and
// leaves the recorded weights alone, recording on or off.
TEST(DotProductAttention, ForwardWithWeightsLeavesTheRecordedWeightsAlone) {
  const auto q = torch::randn({2, 3, 4}).requires_grad_(), k = torch::randn({2, 5, 4});
  const auto v = torch::randn({2, 5, 2}), lens = torch::tensor({2, 5});
  for (bool record : {true, false}) {
    d2l::DotProductAttention attention(
        d2l::DotProductAttentionOptions().record_attention_weights(record));
    const auto [out, weights] = attention->forward_with_weights(q, k, v, lens);
    EXPECT_FALSE(attention->attention_weights.defined()) << record;
    EXPECT_TRUE(weights.requires_grad()) << record;
    EXPECT_TRUE(torch::equal(attention(q, k, v, lens), out)) << record;
    if (record) EXPECT_TRUE(torch::equal(attention->attention_weights, weights));
  }
}

TEST(DotProductAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(5);
  const auto lens = torch::tensor({{1, 4, 0}, {2, 3, 4}});
  d2l::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) {
        return std::get<0>(d2l::functional::dot_product_attention(
            in[0], in[1], in[2],
            d2l::functional::DotProductAttentionFuncOptions().valid_lens(lens)));
      },
      {torch::randn({2, 3, 3}, torch::kDouble), torch::randn({2, 4, 3}, torch::kDouble),
       torch::randn({2, 4, 2}, torch::kDouble)});
}

TEST(DotProductAttention, DropoutOnlyInTraining) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  d2l::DotProductAttention attention(1.0);
  attention->train();
  EXPECT_EQ(attention(q, k, v).abs().sum().item<float>(), 0);
  EXPECT_NEAR(attention->attention_weights.sum(-1).mean().item<float>(), 1, 1e-6);
  attention->eval();
  EXPECT_GT(attention(q, k, v).abs().sum().item<float>(), 0);
}

TEST(DotProductAttention, NonContiguousInputsAndEmptyBatch) {
  const auto q = torch::randn({4, 3, 2}).transpose(0, 1);     // (3, 4, 2)
  const auto k = torch::randn({2, 5, 3}).permute({2, 1, 0});  // (3, 5, 2)
  const auto v = torch::randn({1, 5, 6}).expand({3, 5, 6});
  const auto lens = torch::tensor({1, 2, 5});
  d2l::DotProductAttention attention(0.0);
  EXPECT_TRUE(torch::allclose(attention(q, k, v, lens),
                              attention(q.contiguous(), k.contiguous(), v.contiguous(), lens)));
  const auto empty = attention(torch::randn({0, 3, 2}), torch::randn({0, 5, 2}),
                               torch::randn({0, 5, 6}), torch::zeros({0}, torch::kLong));
  EXPECT_EQ(empty.sizes(), (std::vector<int64_t>{0, 3, 6}));
  const auto no_keys = attention(torch::randn({2, 3, 2}), torch::randn({2, 0, 2}),
                                 torch::randn({2, 0, 6}), torch::tensor({0, 0}));
  EXPECT_EQ(no_keys.abs().sum().item<float>(), 0);
}

// Lengths in float16 or bfloat16: compared exactly past 256 (bfloat16's
// integer spacing is 2 there), and on LibTorch 1.13 float16 lengths once hit
// ATen's missing CPU float16 clamp on the fused paths.
TEST(DotProductAttention, ReducedPrecisionLengthsOnEveryPath) {
  torch::manual_seed(23);
  const auto q = torch::randn({2, 3, 8}, torch::kDouble),
             k = torch::randn({2, 600, 8}, torch::kDouble),
             v = torch::randn({2, 600, 4}, torch::kDouble);
  for (const auto& lens :
       {torch::tensor({276, 596}), torch::tensor({{276, 0, 596}, {304, 512, 1}})}) {
    for (auto path : {d2l::AttentionBackend::kAuto, d2l::AttentionBackend::kComposite,
                      d2l::AttentionBackend::kFused}) {
      for (bool weights : {true, false}) {
        const auto expected =
            d2l::functional::dot_product_attention(q, k, v,
                                                   d2l::functional::DotProductAttentionFuncOptions()
                                                       .valid_lens(lens)
                                                       .dropout(0.0)
                                                       .training(false)
                                                       .backend(path)
                                                       .need_weights(weights));
        for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
          const auto got = d2l::functional::dot_product_attention(
              q, k, v,
              d2l::functional::DotProductAttentionFuncOptions()
                  .valid_lens(lens.to(dtype))
                  .dropout(0.0)
                  .training(false)
                  .backend(path)
                  .need_weights(weights));
          EXPECT_TRUE(torch::equal(std::get<0>(got), std::get<0>(expected)))
              << c10::toString(dtype) << " " << d2l::to_string(path) << " " << weights;
        }
      }
    }
  }
}

TEST(DotProductAttention, RejectsBadArguments) {
  d2l::DotProductAttention attention(0.0);
  const auto q = torch::randn({2, 1, 3}), k = torch::randn({2, 10, 3}),
             v = torch::randn({2, 10, 4});
  const std::string fn = "d2l::dot_product_attention: ";
  EXPECT_THAT(error_message([&] {
                attention(q, torch::randn({2, 10, 4}), v);
              }),
              HasSubstr(fn + "queries and keys must have the same feature size, got queries "
                             "[2, 1, 3] and keys [2, 10, 4]"));
  EXPECT_THAT(error_message([&] {
                attention(torch::randn({2, 1, 0}), torch::randn({2, 10, 0}), v);
              }),
              HasSubstr(fn + "queries and keys must have at least one feature (scores are scaled "
                             "by 1/sqrt(d)), got queries [2, 1, 0] and keys [2, 10, 0]"));
  EXPECT_THAT(error_message([&] {
                attention(torch::randn({2, 3}), k, v);
              }),
              HasSubstr(fn + "queries must be a 3-D tensor, got [2, 3]"));
  EXPECT_THAT(error_message([&] {
                attention(torch::randn({3, 1, 3}), k, v);
              }),
              HasSubstr(fn + "queries, keys and values must have the same batch size, got queries "
                             "[3, 1, 3], keys [2, 10, 3] and values [2, 10, 4]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, torch::randn({2, 9, 4}));
              }),
              HasSubstr(fn + "keys and values must have the same number of key-value pairs, got "
                             "keys [2, 10, 3] and values [2, 9, 4]"));
  EXPECT_THAT(error_message([&] { attention(q, k, v.to(torch::kDouble)); }),
              HasSubstr(fn + "values must have the same dtype as queries (Float), got Double"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, v, torch::tensor({{1, 2}, {3, 4}}));
              }),
              HasSubstr(fn + "valid_lens must have shape [2] or [2, 1] for queries [2, 1, 3], got "
                             "[2, 2]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, v, torch::tensor({-3, 4}));
              }),
              HasSubstr(fn + "valid_lens must hold non-negative lengths, got -3 at flat index 0"));
  EXPECT_THAT(error_message([&] { attention(q.to(torch::kInt), k, v); }),
              HasSubstr(fn + "queries must have a floating-point dtype, got Int"));
  EXPECT_THAT(
      error_message([] { d2l::DotProductAttention bad(1.5); }),
      HasSubstr("d2l::DotProductAttention: dropout must be a probability in [0, 1], got 1.5"));
  for (double p : {-0.5, 1.5, std::nan("")}) {
    EXPECT_THAT(error_message([&] {
                  d2l::functional::dot_product_attention(
                      q, k, v,
                      d2l::functional::DotProductAttentionFuncOptions().dropout(p).training(true));
                }),
                HasSubstr(fn + "dropout must be a probability in [0, 1], got " +
                          (std::isnan(p) ? std::string("nan") : fmt::format("{}", p))));
  }
}

TEST(DotProductAttention, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 2});
  const auto lens = torch::tensor({{1, 0, 5}, {2, 3, 4}});
  d2l::DotProductAttention attention(0.0);
  const auto out = attention(q.cuda(), k.cuda(), v.cuda(), lens.cuda());
  EXPECT_TRUE(out.is_cuda());
  EXPECT_TRUE(attention->attention_weights.is_cuda());
  EXPECT_LT(max_rel_error(out.cpu(), reference_dot(q, k, v, lens)), 1e-5);
  EXPECT_THAT(error_message([&] { attention(q.cuda(), k, v.cuda()); }),
              HasSubstr("keys must be on the same device as queries (cuda:0), got cpu"));
}

}  // namespace
