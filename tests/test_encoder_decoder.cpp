// The book's EncoderDecoder interface and composition: user-defined encoders
// and decoders, printing, cloning and modes of a composed model, and training
// and serialisation on a toy task.

#include <d2l/seq2seq.h>

#include <algorithm>
#include <memory>
#include <sstream>

#include "seq2seq_models.h"
#include "serialization_helpers.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::kEmbed;
using d2l::testing::kHiddens;
using d2l::testing::kLayers;
using d2l::testing::kVocab;
using d2l::testing::make_model;
using d2l::testing::parameter_names;
using d2l::testing::printed;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// User-defined encoders and decoders

// An encoder written by a user, as the README shows: a module that also
// implements d2l::Encoder. It embeds the tokens and uses their running mean
// as the state of every layer.
struct MeanEncoderImpl : torch::nn::Cloneable<MeanEncoderImpl>, d2l::Encoder {
  MeanEncoderImpl(int64_t vocab_size, int64_t num_hiddens, int64_t num_layers)
      : vocab_size(vocab_size), num_hiddens(num_hiddens), num_layers(num_layers) {
    reset();
  }
  void reset() override {
    embedding = register_module("embedding", torch::nn::Embedding(vocab_size, num_hiddens));
  }
  d2l::EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& = {}) override {
    const auto outputs = embedding(X).permute({1, 0, 2});  // (num_steps, B, num_hiddens)
    const auto mean = outputs.cumsum(0) / torch::arange(1, X.size(1) + 1).view({-1, 1, 1});
    return {torch::tanh(mean), torch::tanh(mean[-1]).unsqueeze(0).repeat({num_layers, 1, 1})};
  }
  int64_t vocab_size, num_hiddens, num_layers;
  torch::nn::Embedding embedding{nullptr};
};
TORCH_MODULE(MeanEncoder);

// A decoder written by a user: logits from the embedding and the mean of the
// encoder outputs.
struct BagDecoderImpl : torch::nn::Cloneable<BagDecoderImpl>, d2l::Decoder {
  BagDecoderImpl(int64_t vocab_size, int64_t num_hiddens)
      : vocab_size(vocab_size), num_hiddens(num_hiddens) {
    reset();
  }
  void reset() override {
    embedding = register_module("embedding", torch::nn::Embedding(vocab_size, num_hiddens));
    dense = register_module("dense", torch::nn::Linear(2 * num_hiddens, vocab_size));
  }
  d2l::DecoderState init_state(const d2l::EncoderOutput& enc, const torch::Tensor&) override {
    d2l::DecoderState state;
    state.enc_outputs = enc.outputs.permute({1, 0, 2});
    return state;
  }
  std::tuple<torch::Tensor, d2l::DecoderState> forward(const torch::Tensor& X,
                                                       const d2l::DecoderState& state) override {
    const auto context = state.enc_outputs.mean(1, /*keepdim=*/true).expand({-1, X.size(1), -1});
    return {dense(torch::cat({embedding(X), context}, -1)), state};
  }
  int64_t vocab_size, num_hiddens;
  torch::nn::Embedding embedding{nullptr};
  torch::nn::Linear dense{nullptr};
};
TORCH_MODULE(BagDecoder);

TEST(EncoderDecoder, TakesAUserDefinedEncoderAndDecoder) {
  torch::manual_seed(21);
  const auto enc_X = torch::randint(0, kVocab, {3, 5}), dec_X = torch::randint(0, kVocab, {3, 4});
  const auto lens = torch::tensor({5, 2, 3});
  // A user encoder with the library's attention decoder.
  d2l::EncoderDecoder model(MeanEncoder(kVocab, kHiddens, kLayers),
                            d2l::Seq2SeqAttentionDecoder(kVocab, kEmbed, kHiddens, kLayers));
  auto [logits, state] = model(enc_X, dec_X, lens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 4, kVocab}));
  const auto names = parameter_names(*model);
  EXPECT_EQ(names.front(), "encoder.embedding.weight");
  EXPECT_EQ(
      std::count_if(names.begin(), names.end(),
                    [](const std::string& n) { return n.rfind("decoder.attention.", 0) == 0; }),
      3);  // W_k, W_q, w_v
  // Gradients reach the user's parameters through the interface.
  logits.sum().backward();
  EXPECT_GT(model->named_parameters()["encoder.embedding.weight"].grad().abs().sum().item<float>(),
            0);
  // The modules are reachable through the interfaces.
  EXPECT_EQ(&model->encoder->as_module(), model->named_children()["encoder"].get());
  EXPECT_EQ(&model->decoder->as_module(), model->named_children()["decoder"].get());

  // clone() is deep and keeps the user's class and its numbers.
  auto copy = std::dynamic_pointer_cast<d2l::EncoderDecoderImpl>(model->clone());
  ASSERT_TRUE(copy);
  ASSERT_TRUE(std::dynamic_pointer_cast<MeanEncoderImpl>(copy->encoder));
  EXPECT_NE(copy->encoder.get(), model->encoder.get());
  EXPECT_EQ(copy->named_children()["encoder"].get(), &copy->encoder->as_module());
  {
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::equal(std::get<0>(copy->forward(enc_X, dec_X, lens)), logits));
    copy->named_parameters()["encoder.embedding.weight"].zero_();
    EXPECT_FALSE(torch::equal(std::get<0>(copy->forward(enc_X, dec_X, lens)), logits));
    EXPECT_TRUE(torch::equal(std::get<0>(model->forward(enc_X, dec_X, lens)), logits));
  }

  // A user decoder with the library's encoder, and both user-written.
  d2l::EncoderDecoder mixed(d2l::Seq2SeqEncoder(kVocab, kEmbed, kHiddens, kLayers),
                            BagDecoder(kVocab, kHiddens));
  EXPECT_EQ(std::get<0>(mixed(enc_X, dec_X, lens)).sizes(), (std::vector<int64_t>{3, 4, kVocab}));
  d2l::EncoderDecoder both(MeanEncoder(kVocab, kHiddens, kLayers), BagDecoder(kVocab, kHiddens));
  EXPECT_EQ(std::get<0>(both(enc_X, dec_X, lens)).sizes(), (std::vector<int64_t>{3, 4, kVocab}));
  EXPECT_EQ(parameter_names(*both),
            (std::vector<std::string>{"encoder.embedding.weight", "decoder.embedding.weight",
                                      "decoder.dense.weight", "decoder.dense.bias"}));
}

// A user's encoder with running statistics (a BatchNorm1d's buffers) inside
// EncoderDecoder: torch::save and torch::load carry the buffers, which no
// gradient or parameter check would notice missing.
struct NormEncoderImpl : torch::nn::Cloneable<NormEncoderImpl>, d2l::Encoder {
  NormEncoderImpl(int64_t vocab_size, int64_t num_hiddens)
      : vocab_size(vocab_size), num_hiddens(num_hiddens) {
    reset();
  }
  void reset() override {
    embedding = register_module("embedding", torch::nn::Embedding(vocab_size, num_hiddens));
    norm = register_module("norm", torch::nn::BatchNorm1d(num_hiddens));
  }
  d2l::EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& = {}) override {
    const auto e = embedding(X);  // (B, num_steps, num_hiddens)
    const auto normed = norm(e.reshape({-1, num_hiddens})).view(e.sizes());
    return {normed.permute({1, 0, 2}), normed.mean(1).unsqueeze(0)};
  }
  int64_t vocab_size, num_hiddens;
  torch::nn::Embedding embedding{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(NormEncoder);

TEST(EncoderDecoder, TorchSaveAndLoadCarryAUserEncodersBuffers) {
  torch::manual_seed(5);
  d2l::EncoderDecoder trained(NormEncoder(kVocab, kHiddens), BagDecoder(kVocab, kHiddens));
  const auto enc_X = torch::randint(0, kVocab, {4, 6}), dec_X = torch::randint(0, kVocab, {4, 3});
  const auto lens = torch::tensor({6, 3, 5, 1});
  for (int step = 0; step < 3; ++step) trained(enc_X * (step + 1) % kVocab, dec_X, lens);
  const auto buffers = trained->named_buffers();
  ASSERT_EQ(buffers.size(), 3u);  // running_mean, running_var, num_batches_tracked
  EXPECT_EQ(buffers["encoder.norm.num_batches_tracked"].item<int64_t>(), 3);

  d2l::EncoderDecoder loaded(NormEncoder(kVocab, kHiddens), BagDecoder(kVocab, kHiddens));
  EXPECT_FALSE(torch::equal(loaded->named_buffers()["encoder.norm.running_mean"],
                            buffers["encoder.norm.running_mean"]));
  d2l::testing::load_bytes(loaded, d2l::testing::archive_bytes(trained));
  for (const auto& b : buffers) {
    EXPECT_TRUE(torch::equal(loaded->named_buffers()[b.key()], b.value())) << b.key();
  }
  trained->eval();
  loaded->eval();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(std::get<0>(loaded(enc_X, dec_X, lens)),
                           std::get<0>(trained(enc_X, dec_X, lens))));
}

// The interfaces alone are not modules: an encoder must also be one.
struct NotAModuleEncoder : d2l::Encoder {
  d2l::EncoderOutput forward(const torch::Tensor& X, const torch::Tensor&) override {
    return {X, X};
  }
};

TEST(EncoderDecoder, RejectsAnEncoderThatIsNotAModule) {
  auto encoder = std::make_shared<NotAModuleEncoder>();
  EXPECT_THAT(
      error_message([&] {
        d2l::EncoderDecoder(encoder,
                            std::shared_ptr<d2l::Decoder>(d2l::Seq2SeqDecoder(10, 8, 16, 2).ptr()));
      }),
      HasSubstr(
          "d2l::EncoderDecoder: encoder must be a torch::nn::Module that implements "
          "d2l::Encoder, got a d2l::Encoder of class (anonymous namespace)::NotAModuleEncoder "
          "that is not a module"));
  EXPECT_THAT(error_message([&] { encoder->as_module(); }),
              HasSubstr("d2l::Encoder::as_module: this d2l::Encoder (class "
                        "(anonymous namespace)::NotAModuleEncoder) is not a torch::nn::Module"));
}

// ---------------------------------------------------------------------------
// Module behaviour

TEST(Seq2Seq, PrettyPrint) {
  EXPECT_EQ(printed(*d2l::Seq2SeqEncoder(10, 8, 16, 2)),
            "d2l::Seq2SeqEncoder(vocab_size=10, embed_size=8, num_hiddens=16, num_layers=2, "
            "dropout=0)");
  EXPECT_EQ(printed(*d2l::Seq2SeqAttentionDecoder(d2l::Seq2SeqOptions(10, 8, 16, 2).dropout(0.1))),
            "d2l::Seq2SeqAttentionDecoder(vocab_size=10, embed_size=8, num_hiddens=16, "
            "num_layers=2, dropout=0.1)");
  std::ostringstream tree;
  tree << *make_model(false, d2l::Seq2SeqOptions(10, 8, 16, 2));
  EXPECT_THAT(tree.str(), HasSubstr("d2l::EncoderDecoder(\n  (encoder): d2l::Seq2SeqEncoder("));
  EXPECT_THAT(tree.str(), HasSubstr("(decoder): d2l::Seq2SeqDecoder("));
}

TEST(Seq2Seq, CloneIsADeepCopy) {
  torch::manual_seed(5);
  auto model =
      make_model(true, d2l::Seq2SeqOptions(kVocab, kEmbed, kHiddens, kLayers).dropout(0.1));
  model->eval();
  auto copy = std::dynamic_pointer_cast<d2l::EncoderDecoderImpl>(model->clone());
  ASSERT_TRUE(copy);
  EXPECT_FALSE(copy->is_training());
  ASSERT_TRUE(std::dynamic_pointer_cast<d2l::Seq2SeqAttentionDecoderImpl>(copy->decoder));
  EXPECT_EQ(parameter_names(*copy), parameter_names(*model));
  const auto X = torch::randint(kVocab, {2, 4}), Y = torch::randint(kVocab, {2, 3});
  const auto lens = torch::tensor({4, 2});
  EXPECT_TRUE(torch::equal(std::get<0>(model(X, Y, lens)), std::get<0>(copy->forward(X, Y, lens))));
  {
    torch::NoGradGuard no_grad;
    for (auto& p : copy->parameters()) p.add_(1);
  }
  for (const auto& p : model->named_parameters()) {
    EXPECT_FALSE(torch::equal(p.value(), copy->named_parameters()[p.key()])) << p.key();
  }
  // The submodule holders of the copy point at the copy's own modules.
  auto decoder = std::dynamic_pointer_cast<d2l::Seq2SeqAttentionDecoderImpl>(copy->decoder);
  EXPECT_TRUE(decoder->attention->W_k->weight.is_same(
      copy->named_parameters()["decoder.attention.W_k.weight"]));
}

TEST(Seq2Seq, TrainingModeTurnsOnDropout) {
  torch::manual_seed(6);
  auto model =
      make_model(true, d2l::Seq2SeqOptions(kVocab, kEmbed, kHiddens, kLayers).dropout(0.5));
  const auto X = torch::randint(kVocab, {2, 4}), Y = torch::randint(kVocab, {2, 3});
  model->eval();
  EXPECT_TRUE(torch::equal(std::get<0>(model(X, Y)), std::get<0>(model(X, Y))));
  model->train();
  EXPECT_FALSE(torch::equal(std::get<0>(model(X, Y)), std::get<0>(model(X, Y))));
}

// ---------------------------------------------------------------------------
// Training and serialisation on a toy task: reverse five tokens.

constexpr int64_t kPad = 0, kBos = 1, kSteps = 5;

std::pair<torch::Tensor, torch::Tensor> reversal_batch(int64_t batch) {
  const auto source = torch::randint(2, kVocab, {batch, kSteps});
  return {source, source.flip(1)};
}

// Teacher forcing: the decoder reads <bos> then the target shifted right.
torch::Tensor reversal_loss(d2l::EncoderDecoder& model, const torch::Tensor& source,
                            const torch::Tensor& target) {
  const auto bos = torch::full({target.size(0), 1}, kBos, torch::kLong);
  const auto dec_input = torch::cat({bos, target.slice(1, 0, -1)}, 1);
  const auto logits = std::get<0>(model(source, dec_input));
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), target.reshape(-1));
}

d2l::EncoderDecoder train_reverser(int iterations, std::vector<double>* losses = nullptr) {
  auto model = make_model(true, d2l::Seq2SeqOptions(kVocab, 16, 32, 1));
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  for (int i = 0; i < iterations; ++i) {
    const auto [source, target] = reversal_batch(64);
    const auto loss = reversal_loss(model, source, target);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    if (losses) losses->push_back(loss.item<double>());
  }
  model->eval();
  return model;
}

torch::Tensor greedy_translate(d2l::EncoderDecoder& model, const torch::Tensor& source) {
  torch::NoGradGuard no_grad;
  auto state = model->decoder->init_state(model->encoder->forward(source));
  auto token = torch::full({source.size(0), 1}, kBos, torch::kLong);
  std::vector<torch::Tensor> tokens;
  for (int64_t t = 0; t < kSteps; ++t) {
    torch::Tensor logits;
    std::tie(logits, state) = model->decoder->forward(token, state);
    token = logits.argmax(2);
    tokens.push_back(token);
  }
  return torch::cat(tokens, 1);
}

TEST(Seq2SeqTraining, LossFalls) {
  torch::manual_seed(7);
  std::vector<double> losses;
  train_reverser(150, &losses);
  const double first = (losses[0] + losses[1] + losses[2]) / 3;
  const double last = (losses[147] + losses[148] + losses[149]) / 3;
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
}

TEST(Seq2SeqTraining, SavedModelTranslatesTheSameAfterLoading) {
  torch::manual_seed(8);
  auto trained = train_reverser(60);
  std::stringstream buffer;
  torch::save(trained, buffer);
  auto loaded = make_model(true, d2l::Seq2SeqOptions(kVocab, 16, 32, 1));
  torch::load(loaded, buffer);
  loaded->eval();
  const auto source = reversal_batch(16).first;
  const auto expected = greedy_translate(trained, source);
  EXPECT_TRUE(torch::equal(greedy_translate(loaded, source), expected));
  const auto fresh = make_model(true, d2l::Seq2SeqOptions(kVocab, 16, 32, 1));
  EXPECT_FALSE(torch::equal(fresh->named_parameters()["decoder.dense.weight"],
                            loaded->named_parameters()["decoder.dense.weight"]));
}

}  // namespace
