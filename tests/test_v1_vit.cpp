// d2l 1.0's Vision Transformer (d2l/v1/vit.h): the book's lines build the
// book's shapes and state_dict keys; a state dict saved by the book's Python
// code (tests/fixtures/generate_fixtures_v1_vit.py) loads strictly and gives
// its outputs, per-block attention weights and every gradient in float32 and
// float64; ours loads in Python; bad input is a c10::Error naming the
// function, the argument and the shapes.

#include <d2l/state_dict.h>
#include <d2l/v1.h>

#include <fmt/format.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "module_parity.h"
#include "test_utils.h"

// A namespace of its own: the unity build compiles this file with others.
namespace v1_vit_tests {

using d2l::testing::expect_matches;
using d2l::testing::load_fixture;

std::string fixture_path(const std::string& name) {
  return std::string(D2L_FIXTURE_DIR) + "/" + name;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

std::vector<std::string> keys_of(const torch::nn::Module& module) {
  std::vector<std::string> keys;
  for (const auto& p : module.named_parameters()) keys.push_back(p.key());
  return keys;
}

TEST(V1ViT, BookLinesGiveTheBooksShapes) {
  // The section's checks: patch_emb(X) is (4, (96 // 16) ** 2, 512), and a
  // ViTBlock keeps its input's shape.
  d2l::v1::PatchEmbedding patch_emb(96, 16, 512);
  const auto X = torch::zeros({4, 3, 96, 96});
  EXPECT_EQ(patch_emb(X).sizes(), (std::vector<int64_t>{4, 36, 512}));
  EXPECT_EQ(patch_emb->num_patches, 36);
  EXPECT_EQ(patch_emb->conv->weight.sizes(), (std::vector<int64_t>{512, 3, 16, 16}));

  d2l::v1::ViTBlock encoder_blk(24, 24, 48, 8, 0.5);
  encoder_blk->eval();
  const auto Y = torch::ones({2, 100, 24});
  EXPECT_EQ(encoder_blk(Y).sizes(), Y.sizes());
  EXPECT_EQ(encoder_blk->attention->attention->attention_weights.sizes(),
            (std::vector<int64_t>{16, 100, 100}));

  d2l::v1::ViT model(96, 16, 512, 2048, 8, 2, 0.1, 0.1, 0.1);
  EXPECT_DOUBLE_EQ(model->lr, 0.1);
  EXPECT_EQ(model->pos_embedding.sizes(), (std::vector<int64_t>{1, 37, 512}));
  EXPECT_TRUE(torch::equal(model->cls_token, torch::zeros({1, 1, 512})));
  model->eval();
  EXPECT_EQ(model(torch::zeros({2, 1, 96, 96})).sizes(), (std::vector<int64_t>{2, 10}));
  const auto weights = model->attention_weights();
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_EQ(weights[1].sizes(), (std::vector<int64_t>{16, 37, 37}));
  EXPECT_TRUE(weights[0].is_same(model->block(0)->attention->attention->attention_weights));
}

TEST(V1ViT, KeysAreThoseOfTheBooksStateDictFromConstruction) {
  d2l::v1::ViT model(16, 4, 24, 48, 4, 2, 0.1, 0.1);
  std::vector<std::string> python;
  for (const auto& entry : d2l::read_state_dict(fixture_path("v1_vit_vit_float32.pt"))) {
    python.push_back(entry.first);
  }
  EXPECT_EQ(keys_of(*model), python);
  EXPECT_EQ(python[2], "patch_embedding.conv.weight");
  EXPECT_EQ(python[6], "blks.0.attention.W_q.weight");
  EXPECT_EQ(python.back(), "head.1.bias");
  EXPECT_TRUE(d2l::has_uninitialized_params(*model));
  EXPECT_EQ(keys_of(*d2l::v1::ViTMLP(12, 7)),
            (std::vector<std::string>{"dense1.weight", "dense1.bias", "dense2.weight",
                                      "dense2.bias"}));
  EXPECT_EQ(d2l::testing::printed(*d2l::v1::PatchEmbedding(std::vector<int64_t>{16, 24}, {8, 4}, 20)),
            "d2l::v1::PatchEmbedding(img_size=(16, 24), patch_size=(8, 4), num_hiddens=20)");
}

// Each case's module, built with the book's line (as in the generator).
std::shared_ptr<torch::nn::Module> book_module(const std::string& c) {
  if (c == "vit") return d2l::v1::ViT(16, 4, 24, 48, 4, 2, 0.1, 0.1).ptr();
  if (c == "vit_bias") {
    return d2l::v1::ViT({16, 12}, {4, 6}, 24, 48, 3, 2, 0.0, 0.0, 0.1, true, 7).ptr();
  }
  if (c == "block") return d2l::v1::ViTBlock(24, 24, 48, 4, 0.0, true).ptr();
  if (c == "patch") return d2l::v1::PatchEmbedding({16, 24}, {8, 4}, 20).ptr();
  return d2l::v1::ViTMLP(12, 7, 0.5).ptr();
}

struct V1ViTParity : ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(V1ViTParity, PythonStateDictLoadsStrictlyAndGivesPythonsNumbers) {
  const std::string c = std::get<0>(GetParam()), dtype = std::get<1>(GetParam());
  const auto name = fmt::format("v1_vit_{}_{}", c, dtype);
  const auto f = load_fixture(name);
  auto module = book_module(c);
  module->to(dtype == "float32" ? torch::kFloat32 : torch::kFloat64);
  d2l::load_state_dict(*module, fixture_path(name + ".pt"));
  EXPECT_FALSE(d2l::has_uninitialized_params(*module));
  module->train(f.scalar("training") != 0);

  const auto X = f.tensor("X").requires_grad_(true);
  torch::Tensor output, loss;
  std::vector<torch::Tensor> weights;
  if (auto vit = std::dynamic_pointer_cast<d2l::v1::ViTImpl>(module)) {
    output = vit->forward(X);
    loss = vit->loss(output, f.tensor("y"));
    expect_matches(loss, f, "loss");
    expect_matches(vit->accuracy(output, f.tensor("y")).to(X.scalar_type()), f, "accuracy");
    weights = vit->attention_weights();
  } else if (auto blk = std::dynamic_pointer_cast<d2l::v1::ViTBlockImpl>(module)) {
    output = blk->forward(X, f.tensor("valid_lens"));
    weights = {blk->attention_weights()};
  } else if (auto patch = std::dynamic_pointer_cast<d2l::v1::PatchEmbeddingImpl>(module)) {
    output = patch->forward(X);
  } else {
    output = std::dynamic_pointer_cast<d2l::v1::ViTMLPImpl>(module)->forward(X);
  }
  if (!loss.defined()) loss = (output * f.tensor("G")).sum();
  loss.backward();
  expect_matches(output, f, "output");
  for (size_t i = 0; i < weights.size(); ++i) {
    expect_matches(weights[i], f, fmt::format("attention_weights.{}", i));
  }
  EXPECT_FALSE(f.has_tensor(fmt::format("attention_weights.{}", weights.size())));
  expect_matches(X.grad(), f, "grad.X");
  size_t compared = 0;
  for (const auto& p : module->named_parameters()) {
    expect_matches(p.value().grad(), f, "grad." + p.key());
    ++compared;
  }
  size_t in_fixture = 0;
  for (const auto& n : f.tensor_names()) in_fixture += n.rfind("grad.", 0) == 0 ? 1 : 0;
  EXPECT_EQ(compared + 1, in_fixture) << "every parameter's gradient, and X's";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V1ViTParity,
                         ::testing::Combine(::testing::Values("vit", "vit_bias", "block", "patch",
                                                              "mlp"),
                                            ::testing::Values("float32", "float64")));

// What save_state_dict writes of the vit case is what the generator's
// --verify-cpp loaded in Python (torch.load, strict load_state_dict).
TEST(V1ViT, SavedStateDictIsTheOnePythonLoaded) {
  d2l::v1::ViT model(16, 4, 24, 48, 4, 2, 0.1, 0.1);
  d2l::load_state_dict(*model, fixture_path("v1_vit_vit_float32.pt"));
  std::ostringstream bytes;
  d2l::save_state_dict(*model, bytes);
  const auto committed = fixture_path("v1_vit_cpp_float32.pt");
  if (std::getenv("D2L_WRITE_STATE_FIXTURES") != nullptr) {
    std::ofstream(committed, std::ios::binary) << bytes.str();
    GTEST_SKIP() << "rewrote v1_vit_cpp_float32.pt: verify it with "
                    "generate_fixtures_v1_vit.py --verify-cpp";
  }
  std::ifstream in(committed, std::ios::binary);
  std::stringstream file;
  file << in.rdbuf();
  EXPECT_TRUE(file.str() == bytes.str()) << "v1_vit_cpp_float32.pt is no longer what we write";
  std::istringstream again(bytes.str());
  d2l::v1::ViT copy(16, 4, 24, 48, 4, 2, 0.1, 0.1);
  d2l::load_state_dict(*copy, again);
  model->eval();
  copy->eval();
  const auto X = torch::randn({2, 2, 16, 16});
  EXPECT_TRUE(torch::equal(model(X), copy(X)));
}

TEST(V1ViT, OptimizerFromConfigureOptimizersTrainsTheLazyParameters) {
  torch::manual_seed(3);
  d2l::v1::ViT model(16, 4, 24, 48, 4, 1, 0.0, 0.0, 0.5);
  auto optim = model->configure_optimizers();
  const auto X = torch::randn({4, 1, 16, 16});
  const auto y = torch::tensor({1, 2, 3, 4});
  auto loss = model->loss(model(X), y);
  const auto conv_before = model->patch_embedding->conv->weight.detach().clone();
  const auto dense_before = model->block(0)->mlp->dense1->weight.detach().clone();
  optim.zero_grad();
  loss.backward();
  optim.step();
  const auto& conv = model->patch_embedding->conv->weight;
  EXPECT_TRUE(torch::allclose(conv.detach(), conv_before - 0.5 * conv.grad()));
  EXPECT_FALSE(torch::equal(conv.detach(), conv_before));
  EXPECT_FALSE(torch::equal(model->block(0)->mlp->dense1->weight.detach(), dense_before));
  EXPECT_LT(model->loss(model(X), y).item<double>(), loss.item<double>());
}

TEST(V1ViT, DropoutActsInTrainingOnly) {
  torch::manual_seed(4);
  d2l::v1::ViT model(8, 4, 8, 16, 2, 1, 0.5, 0.5);
  const auto X = torch::randn({3, 1, 8, 8});
  model->eval();
  const auto a = model(X), b = model(X);
  EXPECT_TRUE(torch::equal(a, b));
  model->train();
  EXPECT_FALSE(torch::allclose(model(X), a));
  auto copy = std::dynamic_pointer_cast<d2l::v1::ViTImpl>(model->clone());
  copy->eval();
  EXPECT_TRUE(torch::equal(copy->forward(X), a));
}

TEST(V1ViT, BadImagesNameTheFunctionTheArgumentAndTheShape) {
  d2l::v1::ViT model(16, 4, 24, 48, 4, 1, 0.1, 0.1);
  auto message = error_of([&] { model(torch::randn({1, 16, 16})); });
  EXPECT_NE(message.find("d2l::v1::ViT: X must be a batch of images"), std::string::npos)
      << message;
  EXPECT_NE(message.find("[1, 16, 16]"), std::string::npos) << message;
  EXPECT_TRUE(d2l::has_uninitialized_params(*model));

  message = error_of([&] { model(torch::randn({2, 1, 28, 28})); });
  EXPECT_NE(message.find("img_size (16, 16)"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 1, 28, 28]"), std::string::npos) << message;

  model(torch::randn({2, 1, 16, 16}));
  message = error_of([&] { model(torch::randn({2, 3, 16, 16})); });
  EXPECT_NE(message.find("d2l::v1::PatchEmbedding: X has 3 channels"), std::string::npos)
      << message;
  EXPECT_NE(message.find("fixed at 1"), std::string::npos) << message;

  message = error_of([&] { model(torch::randint(0, 255, {2, 1, 16, 16})); });
  EXPECT_NE(message.find("floating-point"), std::string::npos) << message;

  d2l::v1::PatchEmbedding patch(96, 16, 8);
  message = error_of([&] { patch(torch::randn({2, 1, 28, 28})); });
  EXPECT_NE(message.find("d2l::v1::PatchEmbedding: X's height and width must be whole numbers "
                         "of patches of patch_size (16, 16), got X [2, 1, 28, 28]"),
            std::string::npos)
      << message;
  EXPECT_TRUE(patch->conv->has_uninitialized_params());
  EXPECT_NE(error_of([] { d2l::v1::PatchEmbedding(28, 16); }).find("whole number of patches"),
            std::string::npos);

  d2l::v1::ViTBlock blk(24, 24, 48, 4, 0.1);
  message = error_of([&] { blk(torch::randn({2, 5, 20})); });
  EXPECT_NE(message.find("d2l::v1::ViTBlock: X must be (batch, steps, num_hiddens=24)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("[2, 5, 20]"), std::string::npos) << message;
  message = error_of([&] { blk(torch::randn({5, 24})); });
  EXPECT_NE(message.find("d2l::v1::ViTBlock: X must be a 3-D tensor, got [5, 24]"),
            std::string::npos)
      << message;

  message = error_of([&] { model->loss(torch::randn({4, 10}), torch::tensor({1, 2})); });
  EXPECT_NE(message.find("d2l::v1::ViT::loss"), std::string::npos) << message;
  // Labels outside the classes, or of a floating dtype, are named before
  // cross entropy sees them.
  message = error_of([&] { model->loss(torch::randn({4, 10}), torch::tensor({1, 2, 10, 3})); });
  EXPECT_NE(message.find("d2l::v1::ViT::loss: Y holds 10 at flat index 2, outside the 10 classes "
                         "0..9"),
            std::string::npos)
      << message;
  message = error_of([&] { model->loss(torch::randn({4, 10}), torch::tensor({1, -1, 0, 3})); });
  EXPECT_NE(message.find("Y holds -1 at flat index 1"), std::string::npos) << message;
  message = error_of([&] { model->loss(torch::randn({4, 10}), torch::tensor({1., 2., 0., 3.})); });
  EXPECT_NE(message.find("d2l::v1::ViT::loss: Y must hold class labels of an integer dtype, got "
                         "Float [4]"),
            std::string::npos)
      << message;
  EXPECT_NO_THROW(model->loss(torch::randn({4, 10}), torch::tensor({9, 0, 0, 3}, torch::kInt)));
}

}  // namespace v1_vit_tests
