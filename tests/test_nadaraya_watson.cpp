// Nadaraya–Watson pooling (non-parametric and NWKernelRegression): behaviour,
// errors, gradients, training and parity with the book's PyTorch code
// (fixtures from tests/fixtures/generate_fixtures.py).

#include <d2l/nadaraya_watson.h>

#include <set>
#include <sstream>

#include "fixture.h"
#include "module_parity.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::expect_input_gradients;
using d2l::testing::expect_matches;
using d2l::testing::kParityDtypes;
using d2l::testing::leaf_inputs;
using d2l::testing::load_parameters;
using d2l::testing::max_rel_error;
using d2l::testing::parameter_name_set;
using d2l::testing::printed;
using ::testing::HasSubstr;

TEST(NWKernelRegression, HasTheBookParameter) {
  torch::manual_seed(0);
  d2l::NWKernelRegression net;
  EXPECT_EQ(parameter_name_set(*net), (std::set<std::string>{"w"}));
  EXPECT_EQ(net->w.sizes(), (std::vector<int64_t>{1}));
  EXPECT_TRUE(net->w.requires_grad());
  EXPECT_GE(net->w.item<float>(), 0);
  EXPECT_LT(net->w.item<float>(), 1);
  EXPECT_EQ(printed(*net), "d2l::NWKernelRegression()");
}

TEST(NWKernelRegression, ForwardKeepsWeightsAndMatchesFunctional) {
  const auto q = torch::rand({5}) * 5, k = torch::rand({5, 7}) * 5, v = torch::randn({5, 7});
  d2l::NWKernelRegression net;
  const auto out = net(q, k, v);
  auto [expected, weights] = d2l::functional::nw_kernel_regression(q, k, v, net->w);
  EXPECT_TRUE(torch::equal(out, expected));
  EXPECT_TRUE(torch::equal(net->attention_weights, weights));
  EXPECT_EQ(weights.sizes(), (std::vector<int64_t>{5, 7}));
  EXPECT_TRUE(torch::allclose(weights.sum(1), torch::ones({5})));
}

TEST(NWKernelRegression, MatchesAScalarReference) {
  const auto q = torch::rand({4}, torch::kDouble) * 5;
  const auto k = torch::rand({4, 6}, torch::kDouble) * 5, v = torch::randn({4, 6}, torch::kDouble);
  const auto w = torch::tensor({1.7}, torch::kDouble);
  const auto out = std::get<0>(d2l::functional::nw_kernel_regression(q, k, v, w));
  for (int64_t i = 0; i < 4; ++i) {
    double numerator = 0, denominator = 0;
    for (int64_t j = 0; j < 6; ++j) {
      const double d = (q[i].item<double>() - k[i][j].item<double>()) * 1.7;
      numerator += std::exp(-d * d / 2) * v[i][j].item<double>();
      denominator += std::exp(-d * d / 2);
    }
    EXPECT_NEAR(out[i].item<double>(), numerator / denominator, 1e-12) << "query " << i;
  }
}

TEST(NadarayaWatson, IsTheParametricPoolingWithUnitWidth) {
  const auto q = torch::arange(0, 5, 0.1, torch::kDouble);
  const auto k = torch::rand({9}, torch::kDouble) * 5, v = torch::randn({9}, torch::kDouble);
  auto [out, weights] = d2l::functional::nadaraya_watson(q, k, v);
  auto [param_out, param_weights] = d2l::functional::nw_kernel_regression(
      q, k.expand({q.size(0), 9}), v.expand({q.size(0), 9}), torch::ones({1}, torch::kDouble));
  EXPECT_LT(max_rel_error(out, param_out), 1e-14);
  EXPECT_LT(max_rel_error(weights, param_weights), 1e-14);
  EXPECT_EQ(weights.sizes(), (std::vector<int64_t>{50, 9}));
}

TEST(NadarayaWatson, GradientsMatchFiniteDifferences) {
  torch::manual_seed(7);
  d2l::testing::expect_gradients_match_finite_differences(
      [](const std::vector<torch::Tensor>& in) {
        return std::get<0>(d2l::functional::nw_kernel_regression(in[0], in[1], in[2], in[3]));
      },
      {torch::rand({3}, torch::kDouble) * 3, torch::rand({3, 4}, torch::kDouble) * 3,
       torch::randn({3, 4}, torch::kDouble), torch::tensor({1.3}, torch::kDouble)});
  d2l::testing::expect_gradients_match_finite_differences(
      [](const std::vector<torch::Tensor>& in) {
        return std::get<0>(d2l::functional::nadaraya_watson(in[0], in[1], in[2]));
      },
      {torch::rand({3}, torch::kDouble) * 3, torch::rand({5}, torch::kDouble) * 3,
       torch::randn({5}, torch::kDouble)});
}

TEST(NadarayaWatson, RejectsBadArguments) {
  const auto q = torch::rand({3}), k = torch::rand({3, 4}), v = torch::rand({3, 4});
  const auto w = torch::ones({1});
  const std::string fn = "d2l::nw_kernel_regression: ";
  using d2l::functional::nw_kernel_regression;
  EXPECT_THAT(error_message([&] {
                nw_kernel_regression(q, torch::rand({2, 4}), v, w);
              }),
              HasSubstr(fn + "keys and values must both have shape (n_q, n_k) with n_q the number "
                             "of queries, got queries [3], keys [2, 4] and values [3, 4]"));
  EXPECT_THAT(error_message([&] {
                nw_kernel_regression(q, k, torch::rand({3, 5}), w);
              }),
              HasSubstr("got queries [3], keys [3, 4] and values [3, 5]"));
  EXPECT_THAT(error_message([&] { nw_kernel_regression(q.unsqueeze(1), k, v, w); }),
              HasSubstr(fn + "queries must be a 1-D tensor, got [3, 1]"));
  EXPECT_THAT(error_message([&] { nw_kernel_regression(q, k, v, torch::ones({2})); }),
              HasSubstr(fn + "w must have shape [1] or [], got [2]"));
  EXPECT_THAT(error_message([&] { nw_kernel_regression(q, k, v, torch::Tensor()); }),
              HasSubstr(fn + "w must have shape [1] or [], got undefined"));
  EXPECT_THAT(error_message([&] { nw_kernel_regression(q, k.to(torch::kDouble), v, w); }),
              HasSubstr(fn + "keys must have the same dtype as queries (Float), got Double"));
  EXPECT_THAT(error_message(
                  [&] { d2l::functional::nadaraya_watson(q, torch::rand({4}), torch::rand({5})); }),
              HasSubstr("d2l::nadaraya_watson: keys and values must have the same length, got "
                        "keys [4] and values [5]"));
  EXPECT_THAT(error_message([&] { d2l::functional::nadaraya_watson(q, k, v); }),
              HasSubstr("d2l::nadaraya_watson: keys must be a 1-D tensor, got [3, 4]"));
  d2l::NWKernelRegression net;
  EXPECT_THAT(
      error_message([&] { net(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble)); }),
      HasSubstr("d2l::NWKernelRegression: queries must have the same dtype as w (Float), "
                "got Double"));
}

TEST(NadarayaWatson, EmptyQueriesAndKeys) {
  d2l::NWKernelRegression net;
  EXPECT_EQ(net(torch::rand({0}), torch::rand({0, 4}), torch::rand({0, 4})).sizes(),
            (std::vector<int64_t>{0}));
  auto [out, weights] =
      d2l::functional::nadaraya_watson(torch::rand({3}), torch::rand({0}), torch::rand({0}));
  EXPECT_EQ(weights.sizes(), (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(out.abs().sum().item<float>(), 0);
}

TEST(NWKernelRegression, CloneAndSaveLoadKeepW) {
  d2l::NWKernelRegression net;
  auto copy = std::dynamic_pointer_cast<d2l::NWKernelRegressionImpl>(net->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(torch::equal(copy->w, net->w));
  {
    torch::NoGradGuard no_grad;
    copy->w.add_(1);
  }
  EXPECT_FALSE(torch::equal(copy->w, net->w));
  std::stringstream buffer;
  torch::save(net, buffer);
  d2l::NWKernelRegression loaded;
  torch::load(loaded, buffer);
  EXPECT_TRUE(torch::equal(loaded->w, net->w));
}

// The book's training set-up (n_train 50, leave-one-out keys, MSE, SGD lr 0.5,
// 5 epochs): the summed loss falls and the kernel narrows.
TEST(NWKernelRegression, TrainingLowersTheLoss) {
  torch::manual_seed(0);
  const int64_t n = 50;
  const auto x = std::get<0>(torch::sort(torch::rand({n}) * 5));
  const auto y = 2 * torch::sin(x) + x.pow(0.8) + torch::normal(0, 0.5, {n});
  const auto others = (1 - torch::eye(n)).to(torch::kBool);
  const auto keys = x.repeat({n, 1}).index({others}).reshape({n, -1});
  const auto values = y.repeat({n, 1}).index({others}).reshape({n, -1});
  d2l::NWKernelRegression net;
  const float w0 = net->w.item<float>();
  torch::optim::SGD trainer(net->parameters(), torch::optim::SGDOptions(0.5));
  std::vector<double> losses;
  for (int epoch = 0; epoch < 5; ++epoch) {
    trainer.zero_grad();
    const auto l = torch::nn::functional::mse_loss(
        net(x, keys, values), y, torch::nn::functional::MSELossFuncOptions(torch::kNone));
    l.sum().backward();
    trainer.step();
    losses.push_back(l.sum().item<double>());
  }
  EXPECT_LT(losses.back(), 0.9 * losses.front());
  EXPECT_GT(net->w.item<float>(), w0);
}

TEST(NWKernelRegression, MatchesTheBookFixtures) {
  for (const std::string case_name : {"nw_train", "nw_test"}) {
    for (const char* dtype : kParityDtypes) {
      const auto fixture = d2l::testing::load_fixture(case_name + "_" + dtype);
      d2l::NWKernelRegression net;
      net->to(fixture.tensor("queries").scalar_type());
      load_parameters(*net, fixture);
      const auto in = leaf_inputs(fixture);
      const auto out = net(in.queries, in.keys, in.values);
      (out * fixture.tensor("G")).sum().backward();
      expect_matches(out, fixture, "output");
      expect_matches(net->attention_weights, fixture, "attention_weights");
      expect_input_gradients(in, fixture);
      expect_matches(net->w.grad(), fixture, "grad.w");
    }
  }
}

TEST(NadarayaWatson, MatchesTheBookFixtures) {
  for (const char* dtype : kParityDtypes) {
    const auto fixture = d2l::testing::load_fixture(std::string("nw_nonparametric_") + dtype);
    const auto in = leaf_inputs(fixture);
    auto [out, weights] = d2l::functional::nadaraya_watson(in.queries, in.keys, in.values);
    (out * fixture.tensor("G")).sum().backward();
    expect_matches(out, fixture, "output");
    expect_matches(weights, fixture, "attention_weights");
    expect_input_gradients(in, fixture);
  }
}

TEST(NadarayaWatson, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto q = torch::rand({5}) * 5, k = torch::rand({5, 7}) * 5, v = torch::randn({5, 7});
  d2l::NWKernelRegression net;
  const auto cpu_out = net(q, k, v);
  net->to(torch::kCUDA);
  const auto out = net(q.cuda(), k.cuda(), v.cuda());
  EXPECT_TRUE(out.is_cuda());
  EXPECT_LT(max_rel_error(out.cpu(), cpu_out), 1e-5);
  EXPECT_THAT(error_message([&] { net(q, k, v); }),
              HasSubstr("d2l::NWKernelRegression: queries must be on the same device as w"));
}

}  // namespace
