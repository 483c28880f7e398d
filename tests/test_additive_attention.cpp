#include <d2l/additive_attention.h>
#include <d2l/masked_softmax.h>

#include <cmath>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using d2l::testing::reference_masked_softmax;
using ::testing::HasSubstr;

// w_vᵀ tanh(W_q q_i + W_k k_j), one (i, j) pair at a time, in double.
torch::Tensor reference_scores(const torch::Tensor& qp, const torch::Tensor& kp,
                               const torch::Tensor& w_v) {
  const auto q = qp.to(torch::kDouble), k = kp.to(torch::kDouble), w = w_v.to(torch::kDouble);
  auto scores = torch::empty({q.size(0), q.size(1), k.size(1)}, torch::kDouble);
  for (int64_t b = 0; b < q.size(0); ++b)
    for (int64_t i = 0; i < q.size(1); ++i)
      for (int64_t j = 0; j < k.size(1); ++j)
        scores[b][i][j] = (torch::tanh(q[b][i] + k[b][j]) * w[0]).sum();
  return scores;
}

torch::Tensor reference_additive(d2l::AdditiveAttention& a, const torch::Tensor& q,
                                 const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& lens) {
  torch::NoGradGuard no_grad;
  const auto qp = torch::matmul(q.to(torch::kDouble), a->W_q->weight.to(torch::kDouble).t());
  const auto kp = torch::matmul(k.to(torch::kDouble), a->W_k->weight.to(torch::kDouble).t());
  const auto weights = reference_masked_softmax(reference_scores(qp, kp, a->w_v->weight), lens);
  return torch::matmul(weights, v.to(torch::kDouble));
}

TEST(AdditiveAttention, BookToyExample) {
  torch::manual_seed(0);
  const auto keys = torch::ones({2, 10, 2});
  const auto values = torch::arange(40, torch::kFloat).reshape({1, 10, 4}).repeat({2, 1, 1});
  d2l::AdditiveAttention attention(2, 20, 8, 0.1);
  attention->eval();
  const auto out = attention(torch::normal(0, 1, {2, 1, 20}), keys, values, torch::tensor({2, 6}));
  EXPECT_TRUE(
      torch::allclose(out, torch::tensor({{{2.f, 3.f, 4.f, 5.f}}, {{10.f, 11.f, 12.f, 13.f}}})));
  EXPECT_EQ(attention->attention_weights.sizes(), (std::vector<int64_t>{2, 1, 10}));
}

TEST(AdditiveAttention, ParametersAreNamedAsInThePythonStateDict) {
  d2l::AdditiveAttention attention(2, 20, 8, 0.1);
  const auto params = attention->named_parameters();
  std::vector<std::string> keys;
  for (const auto& p : params) keys.push_back(p.key());
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre("W_k.weight", "W_q.weight", "w_v.weight"));
  EXPECT_EQ(params["W_k.weight"].sizes(), (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(params["W_q.weight"].sizes(), (std::vector<int64_t>{8, 20}));
  EXPECT_EQ(params["w_v.weight"].sizes(), (std::vector<int64_t>{1, 8}));
}

TEST(AdditiveAttention, ScoresMatchAPairByPairReference) {
  torch::manual_seed(6);
  const auto qp = torch::randn({2, 3, 9}, torch::kDouble),
             kp = torch::randn({2, 5, 9}, torch::kDouble);
  const auto w = torch::randn({1, 9}, torch::kDouble);
  EXPECT_LT(max_rel_error(d2l::functional::additive_scores(qp, kp, w), reference_scores(qp, kp, w)),
            1e-14);
}

TEST(AdditiveAttention, MatchesADoubleReference) {
  torch::manual_seed(7);
  d2l::AdditiveAttention attention(6, 5, 9, 0.0);
  const auto q = torch::randn({3, 4, 5}), k = torch::randn({3, 7, 6}), v = torch::randn({3, 7, 3});
  for (const auto& lens : {torch::Tensor(), torch::tensor({1, 7, 3}),
                           torch::tensor({{1, 2, 3, 4}, {7, 7, 9, 0}, {5, 1, 1, 2}})}) {
    EXPECT_LT(max_rel_error(attention(q, k, v, lens), reference_additive(attention, q, k, v, lens)),
              2e-6);
  }
  attention->to(torch::kDouble);
  const auto lens = torch::tensor({1, 7, 3});
  EXPECT_LT(max_rel_error(
                attention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), lens),
                reference_additive(attention, q, k, v, lens)),
            1e-13);
}

TEST(AdditiveAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(8);
  const auto lens = torch::tensor({{1, 3}, {0, 2}});
  // Inputs and all three weights, through the functional form the module uses.
  d2l::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) {
        const auto qp = torch::matmul(in[0], in[3].t()), kp = torch::matmul(in[1], in[4].t());
        const auto weights =
            d2l::masked_softmax(d2l::functional::additive_scores(qp, kp, in[5]), lens);
        return torch::bmm(weights, in[2]);
      },
      {torch::randn({2, 2, 2}, torch::kDouble), torch::randn({2, 3, 3}, torch::kDouble),
       torch::randn({2, 3, 2}, torch::kDouble), torch::randn({4, 2}, torch::kDouble),
       torch::randn({4, 3}, torch::kDouble), torch::randn({1, 4}, torch::kDouble)});
}

TEST(AdditiveAttention, ModuleGradientsEqualTheFunctionalForm) {
  torch::manual_seed(9);
  d2l::AdditiveAttention attention(3, 2, 4, 0.0);
  const auto q = torch::randn({2, 2, 2}), k = torch::randn({2, 3, 3}), v = torch::randn({2, 3, 2});
  const auto lens = torch::tensor({1, 3});
  attention(q, k, v, lens).sum().backward();
  const auto Wq = attention->W_q->weight.detach().clone().requires_grad_();
  const auto Wk = attention->W_k->weight.detach().clone().requires_grad_();
  const auto wv = attention->w_v->weight.detach().clone().requires_grad_();
  const auto scores =
      d2l::functional::additive_scores(torch::matmul(q, Wq.t()), torch::matmul(k, Wk.t()), wv);
  torch::bmm(d2l::masked_softmax(scores, lens), v).sum().backward();
  EXPECT_TRUE(torch::allclose(attention->W_q->weight.grad(), Wq.grad(), 1e-5, 1e-7));
  EXPECT_TRUE(torch::allclose(attention->W_k->weight.grad(), Wk.grad(), 1e-5, 1e-7));
  EXPECT_TRUE(torch::allclose(attention->w_v->weight.grad(), wv.grad(), 1e-5, 1e-7));
}

TEST(AdditiveAttention, NonContiguousInputsAndEmptyShapes) {
  d2l::AdditiveAttention attention(3, 2, 4, 0.0);
  const auto q = torch::randn({2, 4, 2}).transpose(0, 1);     // (4, 2, 2)
  const auto k = torch::randn({3, 5, 4}).permute({2, 1, 0});  // (4, 5, 3)
  const auto v = torch::randn({1, 5, 6}).expand({4, 5, 6});
  const auto lens = torch::tensor({1, 2, 5, 0});
  EXPECT_TRUE(torch::allclose(attention(q, k, v, lens),
                              attention(q.contiguous(), k.contiguous(), v.contiguous(), lens)));
  EXPECT_EQ(
      attention(torch::randn({0, 3, 2}), torch::randn({0, 5, 3}), torch::randn({0, 5, 6})).sizes(),
      (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(attention(torch::randn({2, 3, 2}), torch::randn({2, 0, 3}), torch::randn({2, 0, 6}),
                      torch::tensor({0, 0}))
                .abs()
                .sum()
                .item<float>(),
            0);
}

TEST(AdditiveAttention, RejectsBadArguments) {
  d2l::AdditiveAttention attention(2, 20, 8, 0.0);
  const auto q = torch::randn({2, 1, 20}), k = torch::randn({2, 10, 2}),
             v = torch::randn({2, 10, 4});
  const std::string fn = "d2l::AdditiveAttention: ";
  EXPECT_THAT(error_message([&] {
                attention(torch::randn({2, 1, 19}), k, v);
              }),
              HasSubstr(fn + "queries must have query_size=20 features, got queries [2, 1, 19]"));
  EXPECT_THAT(error_message([&] {
                attention(q, torch::randn({2, 10, 3}), v);
              }),
              HasSubstr(fn + "keys must have key_size=2 features, got keys [2, 10, 3]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, torch::randn({2, 11, 4}));
              }),
              HasSubstr(fn + "keys and values must have the same number of key-value pairs, got "
                             "keys [2, 10, 2] and values [2, 11, 4]"));
  EXPECT_THAT(error_message([&] {
                attention(q, torch::randn({1, 10, 2}), v);
              }),
              HasSubstr(fn + "queries, keys and values must have the same batch size"));
  EXPECT_THAT(
      error_message([&] {
        attention(q, k, v, torch::tensor({1, 2, 3}));
      }),
      HasSubstr(fn + "valid_lens must have shape [2] or [2, 1] for queries [2, 1, 20], got [3]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, v, torch::tensor({0.5, 2.0}));
              }),
              HasSubstr(fn + "valid_lens must hold whole numbers, got 0.5 at flat index 0"));
  EXPECT_THAT(error_message([&] {
                attention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble));
              }),
              HasSubstr(fn + "queries must have the same dtype as W_q.weight (Float), got Double"));
  EXPECT_THAT(error_message([] { d2l::AdditiveAttention bad(2, 0, 8, 0.1); }),
              HasSubstr("d2l::AdditiveAttention: key_size, query_size and num_hiddens must be "
                        "positive, got key_size=2, query_size=0, num_hiddens=8"));
  EXPECT_THAT(error_message([] {
                d2l::functional::additive_scores(torch::randn({2, 3, 4}), torch::randn({2, 5, 4}),
                                                 torch::randn({4}));
              }),
              HasSubstr("d2l::additive_scores: w_v must be a 2-D tensor, got [4]"));
}

TEST(AdditiveAttention, ForwardIsTheFunctionalFormWithTheModuleWeights) {
  torch::manual_seed(21);
  d2l::AdditiveAttention a(d2l::AdditiveAttentionOptions(5, 3, 7).dropout(0.3));
  const auto q = torch::randn({2, 4, 3}), k = torch::randn({2, 6, 5}), v = torch::randn({2, 6, 2});
  const auto lens = torch::tensor({{1, 6, 0, 3}, {2, 9, 4, 5}});
  for (bool training : {false, true}) {
    a->train(training);
    torch::manual_seed(5);
    const auto out = a(q, k, v, lens);
    torch::manual_seed(5);
    const auto [f_out, f_weights] =
        d2l::functional::additive_attention(q, k, v,
                                            d2l::functional::AdditiveAttentionFuncOptions(
                                                a->W_q->weight, a->W_k->weight, a->w_v->weight)
                                                .valid_lens(lens)
                                                .dropout(0.3)
                                                .training(training));
    EXPECT_TRUE(torch::equal(out, f_out)) << "training=" << training;
    EXPECT_TRUE(torch::equal(a->attention_weights, f_weights)) << "training=" << training;
  }
  const auto [no_weights_out, none] = d2l::functional::additive_attention(
      q, k, v,
      d2l::functional::AdditiveAttentionFuncOptions(a->W_q->weight, a->W_k->weight, a->w_v->weight)
          .valid_lens(lens)
          .dropout(0.0)
          .training(false)
          .backend(d2l::AttentionBackend::kComposite)
          .need_weights(false));
  EXPECT_FALSE(none.defined());
  a->eval();
  EXPECT_LT(max_rel_error(no_weights_out, a(q, k, v, lens)), 1e-5);
}

TEST(AdditiveAttention, FunctionalFormRejectsBadWeightsAndDropout) {
  const auto q = torch::randn({2, 4, 3}), k = torch::randn({2, 6, 5}), v = torch::randn({2, 6, 2});
  const auto W_q = torch::randn({7, 3}), W_k = torch::randn({7, 5}), w_v = torch::randn({1, 7});
  const std::string fn = "d2l::additive_attention: ";
  auto run = [&](const torch::Tensor& wq, const torch::Tensor& wk, const torch::Tensor& wv,
                 double dropout = 0.0) {
    d2l::functional::additive_attention(
        q, k, v,
        d2l::functional::AdditiveAttentionFuncOptions(wq, wk, wv).dropout(dropout).training(true));
  };
  EXPECT_THAT(error_message([&] {
                run(torch::randn({7, 4}), W_k, w_v);
              }),
              HasSubstr(fn + "W_q must have shape [7, 3], got [7, 4]"));
  EXPECT_THAT(error_message([&] {
                run(W_q, torch::randn({6, 5}), w_v);
              }),
              HasSubstr(fn + "W_k must have shape [7, 5], got [6, 5]"));
  EXPECT_THAT(error_message([&] { run(W_q, W_k, torch::randn({7})); }),
              HasSubstr(fn + "w_v must be a 2-D tensor, got [7]"));
  EXPECT_THAT(error_message([&] { run(W_q, W_k, w_v.to(torch::kDouble)); }),
              HasSubstr(fn + "w_v must have the same dtype as queries (Float), got Double"));
  EXPECT_THAT(error_message([&] { run(W_q, W_k, w_v, -0.1); }),
              HasSubstr(fn + "dropout must be a probability in [0, 1], got -0.1"));
  EXPECT_THAT(error_message([&] { run(W_q, W_k, w_v, std::nan("")); }),
              HasSubstr(fn + "dropout must be a probability in [0, 1], got nan"));
}

TEST(AdditiveAttention, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(10);
  d2l::AdditiveAttention attention(3, 2, 4, 0.0);
  const auto q = torch::randn({2, 3, 2}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 2});
  const auto lens = torch::tensor({{1, 0, 5}, {2, 3, 4}});
  const auto expected = reference_additive(attention, q, k, v, lens);
  attention->to(torch::kCUDA);
  const auto out = attention(q.cuda(), k.cuda(), v.cuda(), lens.cuda());
  EXPECT_TRUE(out.is_cuda());
  EXPECT_LT(max_rel_error(out.cpu(), expected), 1e-5);
  EXPECT_THAT(error_message([&] { attention(q, k, v); }),
              HasSubstr("queries must be on the same device as W_q.weight (cuda:0), got cpu"));
}

// forward_with_weights returns what forward records, with the graph, and
// leaves the recorded weights alone, recording on or off.
TEST(AdditiveAttention, ForwardWithWeightsLeavesTheRecordedWeightsAlone) {
  const auto q = torch::randn({2, 4, 3}), k = torch::randn({2, 6, 5}), v = torch::randn({2, 6, 2});
  const auto lens = torch::tensor({1, 6});
  for (bool record : {true, false}) {
    d2l::AdditiveAttention a(
        d2l::AdditiveAttentionOptions(5, 3, 7).record_attention_weights(record));
    const auto [out, weights] = a->forward_with_weights(q, k, v, lens);
    EXPECT_FALSE(a->attention_weights.defined()) << record;
    EXPECT_TRUE(weights.requires_grad()) << record;
    EXPECT_TRUE(torch::equal(a(q, k, v, lens), out)) << record;
    if (record) EXPECT_TRUE(torch::equal(a->attention_weights, weights));
  }
}

}  // namespace
