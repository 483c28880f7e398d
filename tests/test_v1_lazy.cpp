// Lazy widths (d2l/lazy.h): the parameters exist from construction, are
// filled in place by the first forward or a load, keep their identity (an
// optimizer built before trains them), keep the dtype `to` gave them, and
// refuse other widths afterwards. d2l 1.0's MultiHeadAttention on them
// equals the 0.17 module with the same weights.

#include <d2l/attention.h>
#include <d2l/state_dict.h>
#include <d2l/v1.h>
#include <gtest/gtest.h>

#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <cmath>
#include <sstream>
#include <string>

namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(V1Lazy, LinearParametersExistEmptyAndFillInPlace) {
  d2l::LazyLinear layer(3);
  const auto params = layer->named_parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params.keys(), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(layer->weight.numel(), 0);
  EXPECT_TRUE(layer->has_uninitialized_params());
  const auto* impl = layer->weight.unsafeGetTensorImpl();
  const auto x = torch::randn({2, 5, 4});
  auto y = layer(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 5, 3}));
  EXPECT_EQ(layer->weight.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(layer->bias.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(layer->weight.unsafeGetTensorImpl(), impl);
  EXPECT_TRUE(layer->weight.requires_grad());
  EXPECT_EQ(*layer->in_features(), 4);
  // nn.Linear's initialisation: |W| <= 1/sqrt(in) (kaiming-uniform, a = sqrt(5)).
  EXPECT_LE(layer->weight.abs().max().item<double>(), 0.5 + 1e-6);
  EXPECT_GT(layer->weight.abs().max().item<double>(), 0.0);
  EXPECT_TRUE(torch::allclose(y, torch::matmul(x, layer->weight.t()) + layer->bias));
}

TEST(V1Lazy, OptimizerBuiltBeforeTheFirstBatchTrainsTheParameters) {
  torch::manual_seed(0);
  d2l::LazyLinear layer(2);
  torch::optim::SGD sgd(layer->parameters(), torch::optim::SGDOptions(0.1));
  const auto x = torch::randn({4, 3});
  auto loss = layer(x).pow(2).sum();
  const auto before = layer->weight.detach().clone();
  sgd.zero_grad();
  loss.backward();
  sgd.step();
  EXPECT_FALSE(torch::equal(before, layer->weight.detach()));
  EXPECT_TRUE(torch::allclose(layer->weight.detach(), before - 0.1 * layer->weight.grad()));
}

TEST(V1Lazy, OtherWidthAfterTheFirstCallIsAnError) {
  d2l::LazyLinear layer(2);
  layer(torch::randn({4, 3}));
  const auto message = error_of([&] { layer(torch::randn({4, 5})); });
  EXPECT_NE(message.find("d2l::LazyLinear::forward"), std::string::npos) << message;
  EXPECT_NE(message.find("[4, 5]"), std::string::npos) << message;
  EXPECT_NE(message.find("fixed at 3"), std::string::npos) << message;
}

TEST(V1Lazy, ToBeforeTheFirstCallMaterialisesInThatDtype) {
  d2l::LazyLinear layer(2);
  layer->to(torch::kFloat64);
  auto y = layer(torch::randn({4, 3}, torch::kFloat64));
  EXPECT_EQ(layer->weight.scalar_type(), torch::kFloat64);
  EXPECT_EQ(y.scalar_type(), torch::kFloat64);
}

TEST(V1Lazy, ExplicitWidthMakesParametersAtConstruction) {
  d2l::LazyLinear layer(d2l::LazyLinearOptions(2).in_features(7).bias(false));
  EXPECT_EQ(layer->weight.sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_FALSE(layer->bias.defined());
  EXPECT_EQ(layer->named_parameters().size(), 1u);
  d2l::LazyConv2d conv(d2l::LazyConv2dOptions(4, 3).in_channels(2));
  EXPECT_EQ(conv->weight.sizes(), (std::vector<int64_t>{4, 2, 3, 3}));
}

TEST(V1Lazy, LoadStateDictTakesTheWidthFromTheFile) {
  d2l::LazyLinear source(3);
  source(torch::randn({1, 6}));
  std::stringstream file;
  d2l::save_state_dict(*source, file);
  d2l::LazyLinear target(3);
  target->to(torch::kFloat64);
  d2l::load_state_dict(*target, file);
  EXPECT_EQ(target->weight.sizes(), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(target->weight.scalar_type(), torch::kFloat64);
  EXPECT_TRUE(torch::allclose(target->weight, source->weight.to(torch::kFloat64)));
  EXPECT_EQ(*target->in_features(), 6);
}

TEST(V1Lazy, FailedLoadLeavesTheLayerLazy) {
  d2l::LazyLinear source(4);  // out_features differ
  source(torch::randn({1, 6}));
  std::stringstream file;
  d2l::save_state_dict(*source, file);
  d2l::LazyLinear target(3);
  const auto message = error_of([&] { d2l::load_state_dict(*target, file); });
  EXPECT_NE(message.find("out_features=3"), std::string::npos) << message;
  EXPECT_TRUE(target->has_uninitialized_params());
  EXPECT_EQ(target->weight.numel(), 0);
}

TEST(V1Lazy, SavingBeforeTheWidthIsKnownIsAnError) {
  d2l::v1::MultiHeadAttention mha(8, 2, 0.0);
  std::stringstream file;
  const auto message = error_of([&] { d2l::save_state_dict(*mha, file); });
  EXPECT_NE(message.find("W_q."), std::string::npos) << message;
  EXPECT_NE(message.find("no input width yet"), std::string::npos) << message;
  EXPECT_TRUE(d2l::has_uninitialized_params(*mha));
}

TEST(V1Lazy, TorchSaveAndLoadRoundTripThroughLazyLayers) {
  d2l::v1::MultiHeadAttention source(8, 2, 0.0, /*bias=*/true);
  source(torch::randn({2, 3, 5}), torch::randn({2, 4, 6}), torch::randn({2, 4, 7}));
  std::stringstream archive;
  torch::save(source, archive);
  d2l::v1::MultiHeadAttention target(8, 2, 0.0, /*bias=*/true);
  torch::load(target, archive);
  EXPECT_EQ(target->W_v->weight.sizes(), (std::vector<int64_t>{8, 7}));
  EXPECT_FALSE(d2l::has_uninitialized_params(*target));
  const auto q = torch::randn({2, 3, 5}), k = torch::randn({2, 4, 6}), v = torch::randn({2, 4, 7});
  EXPECT_TRUE(torch::allclose(source(q, k, v), target(q, k, v)));
}

TEST(V1Lazy, ClonesKeepTheirWidthAndValues) {
  d2l::v1::MultiHeadAttention mha(8, 2, 0.0);
  const auto q = torch::randn({2, 3, 5});
  auto y = mha(q, q, q);
  auto copy = std::dynamic_pointer_cast<d2l::v1::MultiHeadAttentionImpl>(mha->clone());
  EXPECT_TRUE(torch::equal(copy->forward(q, q, q), y));
  EXPECT_NE(copy->W_q->weight.data_ptr(), mha->W_q->weight.data_ptr());
}

TEST(V1Lazy, Conv2dTakesItsChannelsFromTheFirstInput) {
  d2l::LazyConv2d conv(6, 4, 4);
  EXPECT_EQ(conv->weight.numel(), 0);
  const auto x = torch::randn({2, 3, 8, 12});
  auto y = conv(x);
  EXPECT_EQ(conv->weight.sizes(), (std::vector<int64_t>{6, 3, 4, 4}));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 6, 2, 3}));
  EXPECT_TRUE(torch::allclose(y, torch::conv2d(x, conv->weight, conv->bias, 4)));
  // fan_in = 3 * 4 * 4: the bias is uniform in +-1/sqrt(48).
  EXPECT_LE(conv->bias.abs().max().item<double>(), 1.0 / std::sqrt(48.0) + 1e-6);
  const auto message = error_of([&] { conv(torch::randn({2, 1, 8, 8})); });
  EXPECT_NE(message.find("d2l::LazyConv2d::forward"), std::string::npos) << message;
  EXPECT_NE(message.find("1 channels"), std::string::npos) << message;
  EXPECT_NE(message.find("fixed at 3"), std::string::npos) << message;
  const auto small = error_of([&] { d2l::LazyConv2d(6, 4, 4)(torch::randn({1, 3, 2, 8})); });
  EXPECT_NE(small.find("smaller than the kernel"), std::string::npos) << small;
  std::stringstream file;
  d2l::save_state_dict(*conv, file);
  d2l::LazyConv2d target(6, 4, 4);
  d2l::load_state_dict(*target, file);
  EXPECT_TRUE(torch::equal(target(x), y));
  d2l::LazyConv2d wrong_kernel(6, 3, 3);
  file.clear();
  file.seekg(0);
  const auto load_error = error_of([&] { d2l::load_state_dict(*wrong_kernel, file); });
  EXPECT_NE(load_error.find("kernel 3x3"), std::string::npos) << load_error;
  EXPECT_TRUE(wrong_kernel->has_uninitialized_params());
}

TEST(V1MultiHeadAttention, EqualsTheBookEditionWithTheSameWeights) {
  torch::manual_seed(1);
  d2l::v1::MultiHeadAttention v1(8, 2, 0.0, /*bias=*/true);
  const auto q = torch::randn({2, 3, 5}), k = torch::randn({2, 4, 6}), v = torch::randn({2, 4, 7});
  const auto lens = torch::tensor({2, 4});
  auto y1 = v1(q, k, v, lens);
  d2l::MultiHeadAttention v017(6, 5, 7, 8, 2, 0.0, /*bias=*/true);
  torch::NoGradGuard no_grad;
  for (auto& p : v017->named_parameters()) p.value().copy_(v1->named_parameters()[p.key()]);
  EXPECT_EQ(v1->named_parameters().keys(),
            (std::vector<std::string>{"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias",
                                      "W_v.weight", "W_v.bias", "W_o.weight", "W_o.bias"}));
  EXPECT_TRUE(torch::allclose(y1, v017(q, k, v, lens), 1e-6, 1e-6));
  EXPECT_EQ(v1->attention->attention_weights.sizes(), (std::vector<int64_t>{4, 3, 4}));
}

TEST(V1Lazy, NonStrictLoadWithoutTheBiasDrawsItAsTheFirstCallWould) {
  // The file holds the weight, not the bias: a non-strict load gives the
  // layer its width and draws the bias as nn.Linear's reset does (uniform in
  // ±1/sqrt(in_features)), never leaving it uninitialised memory.
  d2l::LazyLinear source(3);
  source(torch::randn({1, 400}));
  std::stringstream file;
  d2l::write_state_dict({{"weight", source->weight.detach()}}, file);
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    d2l::LazyLinear target(3);
    target->to(dtype);
    file.clear();
    file.seekg(0);
    torch::manual_seed(5);
    d2l::load_state_dict(*target, file, /*strict=*/false);
    EXPECT_TRUE(torch::equal(target->weight, source->weight.to(dtype)));
    // The bias the first forward would have drawn from the same generator.
    torch::manual_seed(5);
    d2l::LazyLinear drawn(3);
    drawn->to(dtype);
    drawn->materialize(400);
    ASSERT_EQ(target->bias.sizes(), (std::vector<int64_t>{3}));
    EXPECT_TRUE(torch::equal(target->bias, drawn->bias));
    EXPECT_LE(target->bias.abs().max().item<double>(), 1 / std::sqrt(400.0));
  }
  // A strict load refuses the file and leaves the layer lazy.
  file.clear();
  file.seekg(0);
  d2l::LazyLinear strict(3);
  EXPECT_NE(error_of([&] { d2l::load_state_dict(*strict, file); }).find("missing keys"),
            std::string::npos);
  EXPECT_TRUE(strict->has_uninitialized_params());
}

TEST(V1Lazy, TorchSaveBeforeTheWidthIsKnownIsRefused) {
  // The archive would hold empty parameters that no load takes back.
  d2l::v1::ViT vit(/*img_size=*/8, /*patch_size=*/4, /*num_hiddens=*/8, /*mlp_num_hiddens=*/16,
                   /*num_heads=*/2, /*num_blks=*/1, /*emb_dropout=*/0.0, /*blk_dropout=*/0.0);
  std::stringstream archive;
  const auto message = error_of([&] { torch::save(vit, archive); });
  EXPECT_NE(message.find("d2l::LazyConv2d::save"), std::string::npos) << message;
  EXPECT_NE(message.find("in_channels"), std::string::npos) << message;
  d2l::LazyLinear linear(3);
  EXPECT_NE(error_of([&] { torch::save(linear, archive); }).find("d2l::LazyLinear::save"),
            std::string::npos);
  // After the first batch it round-trips.
  vit->eval();
  const auto X = torch::randn({2, 1, 8, 8});
  const auto expected = vit(X);
  std::stringstream saved;
  torch::save(vit, saved);
  d2l::v1::ViT loaded(8, 4, 8, 16, 2, 1, 0.0, 0.0);
  torch::load(loaded, saved);
  loaded->eval();
  EXPECT_TRUE(torch::allclose(loaded(X), expected));
}

TEST(V1Lazy, ARefusedFirstCallFixesNoWidthAndDrawsNothing) {
  // Batch sizes that differ are refused after the widths are read: the
  // refusal undoes them, so the next valid call, of other widths, is taken.
  const std::vector<torch::Tensor> refused{torch::randn({2, 3, 5}), torch::randn({3, 4, 6}),
                                           torch::randn({3, 4, 7})};
  const std::vector<torch::Tensor> valid{torch::randn({2, 3, 9}), torch::randn({2, 4, 10}),
                                         torch::randn({2, 4, 11})};
  const auto bad = [&](auto& module) {
    return error_of([&] { module(refused[0], refused[1], refused[2]); });
  };
  {
    torch::manual_seed(1);
    d2l::v1::MultiHeadAttention mha(8, 2, 0.0);
    EXPECT_NE(bad(mha), "");
    EXPECT_TRUE(d2l::has_uninitialized_params(*mha));
    const auto out = mha(valid[0], valid[1], valid[2]);
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 8}));
    // Nothing was drawn: the weights are those of a module that never saw the
    // refused call.
    torch::manual_seed(1);
    d2l::v1::MultiHeadAttention fresh(8, 2, 0.0);
    fresh(valid[0], valid[1], valid[2]);
    EXPECT_TRUE(torch::equal(mha->W_q->weight, fresh->W_q->weight));
    EXPECT_TRUE(torch::equal(mha->W_o->weight, fresh->W_o->weight));
  }
  {
    d2l::v1::AdditiveAttention additive(8, 0.0);
    EXPECT_NE(bad(additive), "");
    EXPECT_TRUE(d2l::has_uninitialized_params(*additive));
    additive(valid[0], valid[1], valid[2]);
    EXPECT_EQ(*additive->W_q->in_features(), 9);
    EXPECT_EQ(*additive->W_k->in_features(), 10);
  }
  {
    // An input of another dtype than the layer's is refused before the
    // width is read.
    d2l::LazyLinear linear(3);
    EXPECT_NE(error_of([&] { linear(torch::randn({2, 5}, torch::kDouble)); }), "");
    EXPECT_TRUE(linear->has_uninitialized_params());
    d2l::LazyConv2d conv(d2l::LazyConv2dOptions(4, 3));
    EXPECT_NE(error_of([&] { conv(torch::randn({1, 2, 5, 5}, torch::kDouble)); }), "");
    EXPECT_TRUE(conv->has_uninitialized_params());
  }
  {
    // The FFN reads dense1's width from X before dense1 refuses X's dtype.
    d2l::v1::PositionWiseFFN ffn(16, 8);
    EXPECT_NE(error_of([&] { ffn(torch::randn({2, 3, 5}, torch::kDouble)); }), "");
    EXPECT_TRUE(d2l::has_uninitialized_params(*ffn));
    EXPECT_EQ(ffn(torch::randn({2, 3, 7})).sizes(), (std::vector<int64_t>{2, 3, 8}));
    EXPECT_EQ(*ffn->dense1->in_features(), 7);
  }
}

TEST(V1MultiHeadAttention, BadInputNamesTheArgumentBeforeFixingAWidth) {
  d2l::v1::MultiHeadAttention mha(8, 2, 0.0);
  const auto message =
      error_of([&] { mha(torch::randn({3, 5}), torch::randn({2, 4, 6}), torch::randn({2, 4, 6})); });
  EXPECT_NE(message.find("d2l::v1::MultiHeadAttention"), std::string::npos) << message;
  EXPECT_NE(message.find("queries"), std::string::npos) << message;
  EXPECT_TRUE(mha->W_q->has_uninitialized_params());
  EXPECT_NE(error_of([] { d2l::v1::MultiHeadAttention(10, 3, 0.0); }).find("multiple of num_heads"),
            std::string::npos);
}

TEST(V1AdditiveAttention, EqualsTheBookEditionWithTheSameWeights) {
  torch::manual_seed(2);
  d2l::v1::AdditiveAttention v1(8, 0.0);
  const auto q = torch::randn({2, 3, 5}), k = torch::randn({2, 4, 6}), v = torch::randn({2, 4, 7});
  const auto lens = torch::tensor({2, 3});
  auto y1 = v1(q, k, v, lens);
  EXPECT_EQ(v1->named_parameters().keys(),
            (std::vector<std::string>{"W_k.weight", "W_q.weight", "w_v.weight"}));
  d2l::AdditiveAttention v017(6, 5, 8, 0.0);
  torch::NoGradGuard no_grad;
  for (auto& p : v017->named_parameters()) p.value().copy_(v1->named_parameters()[p.key()]);
  EXPECT_TRUE(torch::allclose(y1, v017(q, k, v, lens), 1e-6, 1e-6));
  EXPECT_EQ(v1->attention_weights.sizes(), (std::vector<int64_t>{2, 3, 4}));
}

}  // namespace
