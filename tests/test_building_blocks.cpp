// Nadaraya–Watson pooling and multi-head attention: behaviour, errors,
// gradients, agreement with torch::nn::MultiheadAttention and parity with the
// book's PyTorch code (fixtures from tests/fixtures/generate_fixtures.py).

#include <d2l/multi_head_attention.h>
#include <d2l/nadaraya_watson.h>

#include <fmt/format.h>

#include <set>
#include <sstream>

#include "fixture.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

std::string printed(const torch::nn::Module& m) {
  std::ostringstream s;
  m.pretty_print(s);
  return s.str();
}

std::set<std::string> parameter_names(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& p : m.named_parameters()) names.insert(p.key());
  return names;
}

// Parity tolerance: both sides compute in the fixture's dtype, in different orders.
double tolerance(const torch::Tensor& t) { return t.scalar_type() == torch::kFloat ? 1e-5 : 1e-12; }

void expect_matches(const torch::Tensor& got, const d2l::testing::Fixture& fixture,
                    const std::string& name) {
  const auto want = fixture.tensor(name);
  ASSERT_EQ(got.sizes(), want.sizes()) << fixture.path() << ": " << name;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << fixture.path() << ": " << name;
  const double error = max_rel_error(got, want);
  EXPECT_LT(error, tolerance(want)) << fixture.path() << ": " << name;
  ::testing::Test::RecordProperty(fixture.path() + ":" + name, fmt::format("{:.3g}", error));
}

// Loads the fixture's parameters into `module`, after checking that the
// fixture's parameters are exactly the module's (by state_dict key).
void load_parameters(torch::nn::Module& module, const d2l::testing::Fixture& fixture) {
  static const std::set<std::string> reserved = {
      "queries", "keys", "values", "valid_lens", "G", "output", "attention_weights"};
  std::set<std::string> in_fixture;
  for (const auto& name : fixture.tensor_names()) {
    if (reserved.count(name) == 0 && name.rfind("grad.", 0) != 0) in_fixture.insert(name);
  }
  EXPECT_EQ(in_fixture, parameter_names(module)) << fixture.path();
  torch::NoGradGuard no_grad;
  for (auto& p : module.named_parameters()) p.value().copy_(fixture.tensor(p.key()));
}

struct Inputs {
  torch::Tensor queries, keys, values;
};

Inputs leaf_inputs(const d2l::testing::Fixture& fixture) {
  return {fixture.tensor("queries").requires_grad_(true),
          fixture.tensor("keys").requires_grad_(true),
          fixture.tensor("values").requires_grad_(true)};
}

void expect_input_gradients(const Inputs& in, const d2l::testing::Fixture& fixture) {
  expect_matches(in.queries.grad(), fixture, "grad.queries");
  expect_matches(in.keys.grad(), fixture, "grad.keys");
  expect_matches(in.values.grad(), fixture, "grad.values");
}

const char* const kDtypes[] = {"float32", "float64"};

// ---------------------------------------------------------------------------
// Nadaraya–Watson
// ---------------------------------------------------------------------------

TEST(NWKernelRegression, HasTheBookParameter) {
  torch::manual_seed(0);
  d2l::NWKernelRegression net;
  EXPECT_EQ(parameter_names(*net), (std::set<std::string>{"w"}));
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
    for (const char* dtype : kDtypes) {
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
  for (const char* dtype : kDtypes) {
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

// ---------------------------------------------------------------------------
// Multi-head attention
// ---------------------------------------------------------------------------

TEST(MultiHeadAttention, TransposeQkvSplitsFeaturesIntoHeads) {
  const auto X = torch::randn({2, 3, 8});
  const auto heads = d2l::transpose_qkv(X, 4);
  ASSERT_EQ(heads.sizes(), (std::vector<int64_t>{8, 3, 2}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_TRUE(torch::equal(heads[b * 4 + h], X[b].slice(1, 2 * h, 2 * h + 2)));
    }
  }
  EXPECT_TRUE(torch::equal(d2l::transpose_output(heads, 4), X));
  const auto empty = d2l::transpose_qkv(torch::randn({0, 3, 8}), 4);
  EXPECT_EQ(empty.sizes(), (std::vector<int64_t>{0, 3, 2}));
  EXPECT_EQ(d2l::transpose_output(empty, 4).sizes(), (std::vector<int64_t>{0, 3, 8}));
}

TEST(MultiHeadAttention, TransposeRejectsBadShapes) {
  EXPECT_THAT(error_message([] {
                d2l::transpose_qkv(torch::randn({2, 3, 10}), 4);
              }),
              HasSubstr("d2l::transpose_qkv: the feature size of X must be a multiple of "
                        "num_heads=4, got X [2, 3, 10]"));
  EXPECT_THAT(error_message([] {
                d2l::transpose_qkv(torch::randn({2, 3}), 1);
              }),
              HasSubstr("d2l::transpose_qkv: X must be a 3-D tensor (B, n, num_hiddens), got "
                        "[2, 3]"));
  EXPECT_THAT(error_message([] {
                d2l::transpose_qkv(torch::randn({2, 3, 4}), 0);
              }),
              HasSubstr("d2l::transpose_qkv: num_heads must be positive, got 0"));
  EXPECT_THAT(error_message([] {
                d2l::transpose_output(torch::randn({6, 3, 2}), 4);
              }),
              HasSubstr("d2l::transpose_output: the first size of X must be a multiple of "
                        "num_heads=4, got X [6, 3, 2]"));
}

TEST(MultiHeadAttention, MirrorsTheBookModule) {
  d2l::MultiHeadAttention attention(100, 100, 100, 100, 5, 0.5);
  EXPECT_EQ(printed(*attention),
            "d2l::MultiHeadAttention(key_size=100, query_size=100, value_size=100, "
            "num_hiddens=100, num_heads=5, dropout=0.5, bias=false)");
  EXPECT_EQ(parameter_names(*attention),
            (std::set<std::string>{"W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"}));
  std::vector<std::string> children;
  for (const auto& c : attention->named_children()) children.push_back(c.key());
  EXPECT_EQ(children, (std::vector<std::string>{"attention", "W_q", "W_k", "W_v", "W_o"}));
  attention->eval();
  const auto X = torch::ones({2, 4, 100}), Y = torch::ones({2, 6, 100});
  EXPECT_EQ(attention(X, Y, Y, torch::tensor({3, 2})).sizes(), (std::vector<int64_t>{2, 4, 100}));
  EXPECT_EQ(attention->attention->attention_weights.sizes(), (std::vector<int64_t>{10, 4, 6}));

  d2l::MultiHeadAttention biased(d2l::MultiHeadAttentionOptions(3, 5, 7, 12, 4).bias(true));
  EXPECT_EQ(parameter_names(*biased),
            (std::set<std::string>{"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight",
                                   "W_v.bias", "W_o.weight", "W_o.bias"}));
  EXPECT_EQ(biased->W_k->weight.sizes(), (std::vector<int64_t>{12, 3}));
  EXPECT_THAT(printed(*biased), HasSubstr("dropout=0, bias=true)"));
}

TEST(MultiHeadAttention, RejectsBadArguments) {
  EXPECT_THAT(error_message([] { d2l::MultiHeadAttention(4, 4, 4, 10, 3, 0.0); }),
              HasSubstr("d2l::MultiHeadAttention: num_hiddens must be divisible by num_heads, "
                        "got num_hiddens=10 and num_heads=3"));
  EXPECT_THAT(error_message([] { d2l::MultiHeadAttention(4, 0, 4, 10, 2, 0.0); }),
              HasSubstr("d2l::MultiHeadAttention: key_size, query_size, value_size, num_hiddens "
                        "and num_heads must be positive, got key_size=4, query_size=0"));
  EXPECT_THAT(error_message([] { d2l::MultiHeadAttention(4, 4, 4, 8, 2, -0.1); }),
              HasSubstr("d2l::MultiHeadAttention: dropout must be a probability in [0, 1], got "
                        "-0.1"));
  d2l::MultiHeadAttention attention(3, 5, 7, 8, 2, 0.0);
  const auto q = torch::randn({2, 4, 5}), k = torch::randn({2, 6, 3}), v = torch::randn({2, 6, 7});
  const std::string fn = "d2l::MultiHeadAttention: ";
  EXPECT_THAT(error_message([&] {
                attention(q, torch::randn({2, 6, 5}), v);
              }),
              HasSubstr(fn + "queries, keys and values must have query_size=5, key_size=3 and "
                             "value_size=7 features, got queries [2, 4, 5], keys [2, 6, 5] and "
                             "values [2, 6, 7]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, v, torch::tensor({1, 2, 3}));
              }),
              HasSubstr(fn + "valid_lens must have shape [2] or [2, 4] for queries [2, 4, 5], "
                             "got [3]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, torch::randn({2, 5, 7}));
              }),
              HasSubstr(fn + "keys and values must have the same number of key-value pairs"));
  EXPECT_THAT(error_message([&] {
                attention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble));
              }),
              HasSubstr(fn + "queries must have the same dtype as W_q.weight (Float), got Double"));
}

// torch::nn::MultiheadAttention holding the same weights as `ours`:
//  - in_proj_weight rows [0, E) = W_q, [E, 2E) = W_k, [2E, 3E) = W_v when
//    kdim == vdim == embed_dim; otherwise q/k/v_proj_weight hold them;
//  - in_proj_bias = [W_q.bias, W_k.bias, W_v.bias]; out_proj = W_o;
//  - its 1/sqrt(head_dim) scaling of q is DotProductAttention's 1/sqrt(d);
//  - its head layout (batch-major, head-minor) is transpose_qkv's.
// LibTorch 1.13 has no batch_first (it takes (L, N, E) inputs), and its C++
// forward asserts that keys and values have equal sizes, so kdim == vdim here.
torch::nn::MultiheadAttention torch_twin(const d2l::MultiHeadAttention& ours) {
  const auto& o = ours->options;
  TORCH_CHECK(o.query_size() == o.num_hiddens(), "torch's queries have embed_dim features");
  torch::nn::MultiheadAttention ref(
      torch::nn::MultiheadAttentionOptions(o.num_hiddens(), o.num_heads())
          .bias(o.bias())
          .kdim(o.key_size())
          .vdim(o.value_size()));
  ref->to(ours->W_q->weight.scalar_type());
  ref->eval();
  torch::NoGradGuard no_grad;
  if (ref->_qkv_same_embed_dim) {
    ref->in_proj_weight.copy_(
        torch::cat({ours->W_q->weight, ours->W_k->weight, ours->W_v->weight}));
  } else {
    ref->q_proj_weight.copy_(ours->W_q->weight);
    ref->k_proj_weight.copy_(ours->W_k->weight);
    ref->v_proj_weight.copy_(ours->W_v->weight);
  }
  ref->out_proj->weight.copy_(ours->W_o->weight);
  if (o.bias()) {
    ref->in_proj_bias.copy_(torch::cat({ours->W_q->bias, ours->W_k->bias, ours->W_v->bias}));
    ref->out_proj->bias.copy_(ours->W_o->bias);
  }
  return ref;
}

// Worst relative errors of (output, head-averaged weights) against torch's
// module. 1-D lengths become key_padding_mask[b, j] = j >= len[b]. LibTorch
// 1.13's C++ attn_mask is an additive (n, m) mask shared by the whole batch, so
// 2-D lengths must be equal across the batch: attn_mask[i, j] = -inf for j >= len[0, i].
std::pair<double, double> compare_with_torch(d2l::MultiHeadAttention& ours, const Inputs& in,
                                             const torch::Tensor& lens) {
  auto ref = torch_twin(ours);
  ours->eval();
  const auto out = ours(in.queries, in.keys, in.values, lens);
  const int64_t B = in.queries.size(0), n = in.queries.size(1), m = in.keys.size(1);
  const int64_t heads = ours->options.num_heads();
  const auto j = torch::arange(m);
  torch::Tensor padding, attn_mask;
  if (lens.defined() && lens.dim() == 1) padding = j.unsqueeze(0) >= lens.unsqueeze(1);
  if (lens.defined() && lens.dim() == 2) {
    TORCH_CHECK(torch::equal(lens, lens[0].expand_as(lens)), "lengths must repeat per batch");
    attn_mask = torch::zeros({n, m}, in.queries.options())
                    .masked_fill(j.unsqueeze(0) >= lens[0].unsqueeze(1),
                                 -std::numeric_limits<double>::infinity());
  }
  auto [ref_out, ref_weights] = ref(in.queries.transpose(0, 1), in.keys.transpose(0, 1),
                                    in.values.transpose(0, 1), padding, true, attn_mask);
  const auto averaged = ours->attention->attention_weights.view({B, heads, n, m}).mean(1);
  return {max_rel_error(out, ref_out.transpose(0, 1)), max_rel_error(averaged, ref_weights)};
}

TEST(MultiHeadAttention, EqualsTorchMultiheadAttention) {
  torch::manual_seed(3);
  struct Case {
    int64_t key_size, value_size;
    bool bias;
    torch::Tensor lens;
  };
  const std::vector<Case> cases = {{8, 8, false, torch::tensor({3, 2, 6})},
                                   {8, 8, true, torch::Tensor()},
                                   {6, 6, true, torch::tensor({1, 6, 4})},
                                   {8, 8, true, torch::tensor({{1, 5, 2, 6}}).expand({3, 4})}};
  for (const auto& c : cases) {
    for (const auto dtype : {torch::kFloat, torch::kDouble}) {
      d2l::MultiHeadAttention ours(c.key_size, 8, c.value_size, 8, 4, 0.3, c.bias);
      ours->to(dtype);
      const auto opts = torch::TensorOptions().dtype(dtype);
      const Inputs in{torch::randn({3, 4, 8}, opts), torch::randn({3, 6, c.key_size}, opts),
                      torch::randn({3, 6, c.value_size}, opts)};
      const auto [out_error, weights_error] = compare_with_torch(ours, in, c.lens);
      const double tol = dtype == torch::kFloat ? 1e-5 : 1e-10;
      EXPECT_LT(out_error, tol) << "key_size " << c.key_size << ", bias " << c.bias;
      EXPECT_LT(weights_error, tol) << "key_size " << c.key_size << ", bias " << c.bias;
      RecordProperty(fmt::format("torch_{}_{}_{}_{}", c.key_size, c.bias,
                                 c.lens.defined() ? c.lens.dim() : 0, c10::toString(dtype)),
                     fmt::format("{:.3g} {:.3g}", out_error, weights_error));
    }
  }
}

TEST(MultiHeadAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(11);
  d2l::MultiHeadAttention attention(3, 4, 5, 6, 3, 0.0, /*bias=*/true);
  attention->to(torch::kDouble);
  const auto lens = torch::tensor({{1, 3}, {2, 1}});
  std::vector<torch::nn::Linear> linears = {attention->W_q, attention->W_k, attention->W_v,
                                            attention->W_o};
  std::vector<torch::Tensor> inputs = {torch::randn({2, 2, 4}, torch::kDouble),
                                       torch::randn({2, 3, 3}, torch::kDouble),
                                       torch::randn({2, 3, 5}, torch::kDouble)};
  for (const auto& linear : linears) {
    inputs.push_back(linear->weight);
    inputs.push_back(linear->bias);
  }
  d2l::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) {
        // The helper differentiates with respect to its own copies of the
        // parameters; Linear::forward reads the members, so point them there.
        for (size_t i = 0; i < linears.size(); ++i) {
          linears[i]->weight = in[3 + 2 * i];
          linears[i]->bias = in[4 + 2 * i];
        }
        return attention(in[0], in[1], in[2], lens);
      },
      inputs);
}

TEST(MultiHeadAttention, MatchesTheBookFixtures) {
  for (const std::string case_name : {"mha_book", "mha_bias_odd"}) {
    for (const char* dtype : kDtypes) {
      const auto fixture = d2l::testing::load_fixture(case_name + "_" + dtype);
      const auto size = [&](const char* name) { return int64_t(fixture.scalar(name)); };
      d2l::MultiHeadAttention attention(size("key_size"), size("query_size"), size("value_size"),
                                        size("num_hiddens"), size("num_heads"),
                                        fixture.scalar("dropout"), fixture.scalar("bias") != 0);
      attention->to(fixture.tensor("queries").scalar_type());
      attention->eval();
      load_parameters(*attention, fixture);
      const auto in = leaf_inputs(fixture);
      const auto out = attention(in.queries, in.keys, in.values, fixture.tensor("valid_lens"));
      (out * fixture.tensor("G")).sum().backward();
      expect_matches(out, fixture, "output");
      expect_matches(attention->attention->attention_weights, fixture, "attention_weights");
      expect_input_gradients(in, fixture);
      for (const auto& p : attention->named_parameters()) {
        expect_matches(p.value().grad(), fixture, "grad." + p.key());
      }
    }
  }
}

TEST(MultiHeadAttention, EmptyBatchAndNoKeys) {
  d2l::MultiHeadAttention attention(3, 4, 5, 6, 3, 0.0);
  const auto empty = attention(torch::randn({0, 2, 4}), torch::randn({0, 3, 3}),
                               torch::randn({0, 3, 5}), torch::zeros({0}, torch::kLong));
  EXPECT_EQ(empty.sizes(), (std::vector<int64_t>{0, 2, 6}));
  const auto no_keys = attention(torch::randn({2, 2, 4}), torch::randn({2, 0, 3}),
                                 torch::randn({2, 0, 5}), torch::tensor({0, 0}));
  EXPECT_EQ(no_keys.sizes(), (std::vector<int64_t>{2, 2, 6}));
  EXPECT_EQ(no_keys.abs().sum().item<float>(), 0);
  EXPECT_EQ(attention->attention->attention_weights.sizes(), (std::vector<int64_t>{6, 2, 0}));
}

TEST(MultiHeadAttention, DropoutOnlyInTraining) {
  d2l::MultiHeadAttention attention(4, 4, 4, 8, 2, 0.5);
  const auto X = torch::randn({2, 5, 4});
  attention->eval();
  const auto a = attention(X, X, X);
  EXPECT_TRUE(torch::equal(a, attention(X, X, X)));
  attention->train();
  EXPECT_TRUE(attention->attention->dropout->is_training());
  EXPECT_FALSE(torch::equal(attention(X, X, X), a));
}

// impl and record_attention_weights reach the inner DotProductAttention (and
// survive clone()); every path gives the same numbers.
TEST(MultiHeadAttention, OptionsChooseThePathAndRecording) {
  torch::manual_seed(12);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 5});
  const auto lens = torch::tensor({2, 5});
  d2l::MultiHeadAttention reference(d2l::MultiHeadAttentionOptions(3, 4, 5, 6, 3));
  const auto expected = reference(q, k, v, lens);
  for (const auto impl : {d2l::Impl::kComposite, d2l::Impl::kFused}) {
    d2l::MultiHeadAttention attention(
        d2l::MultiHeadAttentionOptions(3, 4, 5, 6, 3).impl(impl).record_attention_weights(false));
    {
      torch::NoGradGuard no_grad;
      const auto from = reference->named_parameters();
      for (auto& p : attention->named_parameters()) p.value().copy_(from[p.key()]);
    }
    for (const auto& module :
         {attention.ptr(),
          std::dynamic_pointer_cast<d2l::MultiHeadAttentionImpl>(attention->clone())}) {
      EXPECT_EQ(module->attention->options.impl(), impl);
      EXPECT_FALSE(module->attention->options.record_attention_weights());
      EXPECT_LT(max_rel_error(module->forward(q, k, v, lens), expected), 1e-6);
      EXPECT_FALSE(module->attention->attention_weights.defined());
    }
  }
  EXPECT_EQ(reference->attention->attention_weights.sizes(), (std::vector<int64_t>{6, 3, 5}));
}

TEST(MultiHeadAttention, CloneSaveLoadAndContainers) {
  d2l::MultiHeadAttention original(3, 4, 5, 6, 3, 0.1, true);
  auto copy = std::dynamic_pointer_cast<d2l::MultiHeadAttentionImpl>(original->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(copy->options.bias());
  {
    torch::NoGradGuard no_grad;
    copy->W_o->bias.add_(1);
  }
  EXPECT_FALSE(torch::equal(copy->W_o->bias, original->W_o->bias));
  EXPECT_TRUE(torch::equal(copy->W_q->weight, original->W_q->weight));

  std::stringstream buffer;
  torch::save(original, buffer);
  d2l::MultiHeadAttention loaded(3, 4, 5, 6, 3, 0.1, true);
  torch::load(loaded, buffer);
  original->eval();
  loaded->eval();
  const auto q = torch::randn({2, 1, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 5});
  EXPECT_TRUE(torch::equal(original(q, k, v), loaded(q, k, v)));

  torch::nn::AnyModule any(loaded);
  EXPECT_EQ(any.forward(q, k, v).sizes(), (std::vector<int64_t>{2, 1, 6}));
  EXPECT_EQ(any.forward(q, k, v, torch::tensor({1, 4})).sizes(), (std::vector<int64_t>{2, 1, 6}));
}

TEST(MultiHeadAttention, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  d2l::MultiHeadAttention attention(3, 4, 5, 6, 3, 0.0, true);
  const auto q = torch::randn({2, 2, 4}), k = torch::randn({2, 3, 3}), v = torch::randn({2, 3, 5});
  const auto lens = torch::tensor({{1, 3}, {2, 1}});
  const auto cpu_out = attention(q, k, v, lens);
  attention->to(torch::kCUDA);
  const auto out = attention(q.cuda(), k.cuda(), v.cuda(), lens.cuda());
  EXPECT_TRUE(out.is_cuda());
  EXPECT_TRUE(attention->attention->attention_weights.is_cuda());
  EXPECT_LT(max_rel_error(out.cpu(), cpu_out), 1e-5);
}

}  // namespace
