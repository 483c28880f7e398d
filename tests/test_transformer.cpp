// The book's Transformer (d2l 0.17): parameter names, and parity with the
// book's Python code forward, backward and step by step
// (tests/fixtures/generate_fixtures_transformer.py), in float32 and float64.

#include <d2l/state_dict.h>
#include <d2l/transformer.h>

#include <fmt/format.h>

#include "fixture.h"
#include "module_parity.h"
#include "test_utils.h"
#include "transformer_models.h"

namespace {

using d2l::testing::decoder_of;
using d2l::testing::encoder_of;
using d2l::testing::expect_matches;
using d2l::testing::load_fixture;
using d2l::testing::parameter_names;
using d2l::testing::transformer_from_fixture;

TEST(Transformer, SubmodulesAreNamedAsInTheBook) {
  d2l::TransformerEncoder encoder(200, 24, 24, 24, 24, {24}, 24, 48, 8, 2, 0.5);
  const auto names = parameter_names(*encoder);
  ASSERT_EQ(names.size(), 1u + 2 * 12);
  EXPECT_EQ(names[0], "embedding.weight");
  EXPECT_EQ(names[1], "blks.block0.attention.W_q.weight");
  EXPECT_EQ(names[5], "blks.block0.addnorm1.ln.weight");
  EXPECT_EQ(names[7], "blks.block0.ffn.dense1.weight");
  EXPECT_EQ(names.back(), "blks.block1.addnorm2.ln.bias");
  // The positional table is neither a parameter nor a buffer, as in the book.
  EXPECT_TRUE(encoder->named_buffers().is_empty());

  d2l::TransformerDecoder decoder(200, 24, 24, 24, 24, {24}, 24, 48, 8, 2, 0.5);
  const auto dec = parameter_names(*decoder);
  EXPECT_EQ(dec[1], "blks.block0.attention1.W_q.weight");
  EXPECT_EQ(dec[7], "blks.block0.attention2.W_q.weight");
  EXPECT_EQ(dec[17], "blks.block0.addnorm3.ln.weight");
  EXPECT_EQ(dec[dec.size() - 2], "dense.weight");
  EXPECT_EQ(decoder->block(1)->i, 1);
}

TEST(Transformer, ShapesOfTheBooksExamples) {
  // The book's "Transformer" section: the encoder on (2, 100) tokens, the
  // decoder block on (2, 100, 24) inputs.
  d2l::TransformerEncoder encoder(200, 24, 24, 24, 24, {24}, 24, 48, 8, 2, 0.5);
  encoder->eval();
  const auto valid_lens = torch::tensor({3, 2});
  const auto out = encoder(torch::ones({2, 100}, torch::kLong), valid_lens);
  EXPECT_FALSE(out.hidden_state.defined());
  EXPECT_EQ(out.outputs.sizes(), (std::vector<int64_t>{2, 100, 24}));
  EXPECT_EQ(encoder->attention_weights()[1].sizes(), (std::vector<int64_t>{16, 100, 100}));

  d2l::EncoderBlock encoder_blk(24, 24, 24, 24, {100, 24}, 24, 48, 8, 0.5);
  encoder_blk->eval();
  const auto X = torch::ones({2, 100, 24});
  EXPECT_EQ(encoder_blk(X, valid_lens).sizes(), X.sizes());

  d2l::DecoderBlock decoder_blk(24, 24, 24, 24, {100, 24}, 24, 48, 8, 0.5, 0);
  decoder_blk->eval();
  d2l::DecoderState state;
  state.enc_outputs = encoder_blk(X, valid_lens);
  state.enc_valid_lens = valid_lens;
  state.key_values.resize(1);
  const auto [Y, next] = decoder_blk(X, state);
  EXPECT_EQ(Y.sizes(), X.sizes());
  EXPECT_EQ(next.key_values[0].sizes(), X.sizes());

  d2l::PositionWiseFFN ffn(4, 4, 8);
  EXPECT_EQ(ffn(torch::ones({2, 3, 4})).sizes(), (std::vector<int64_t>{2, 3, 8}));
  d2l::AddNorm add_norm({3, 4}, 0.5);
  add_norm->eval();
  EXPECT_EQ(add_norm(torch::ones({2, 3, 4}), torch::ones({2, 3, 4})).sizes(),
            (std::vector<int64_t>{2, 3, 4}));
}

TEST(Transformer, PositionalTableIsTheBooks) {
  const auto f = load_fixture("positional_encoding_float32");
  for (const int64_t h : {16, 10}) {
    d2l::PositionalEncoding pe(h, 0.0);
    EXPECT_EQ(pe->P.sizes(), (std::vector<int64_t>{1, 1000, h}));
    EXPECT_EQ(pe->P.scalar_type(), torch::kFloat);
    expect_matches(pe->P[0].slice(0, 0, 60), f, fmt::format("P.{}", h));
    // forward adds the table in the input's dtype.
    pe->eval();
    const auto X = torch::zeros({2, 7, h}, torch::kDouble);
    const auto Y = pe(X);
    EXPECT_EQ(Y.scalar_type(), torch::kDouble);
    EXPECT_TRUE(torch::equal(Y[1], pe->P[0].slice(0, 0, 7).to(torch::kDouble)));
  }
  // An odd width has one cosine column fewer.
  d2l::PositionalEncoding odd(5, 0.0, 10);
  EXPECT_EQ(odd->P.sizes(), (std::vector<int64_t>{1, 10, 5}));
  EXPECT_FLOAT_EQ(odd->P[0][0][4].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(odd->P[0][0][3].item<float>(), 1.0f);
}

// Fixture case and dtype.
class TransformerParity
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(TransformerParity, ForwardAndBackwardMatchThePythonReference) {
  const auto& [name, dtype_name] = GetParam();
  const auto f = load_fixture(name + "_" + dtype_name);
  const auto dtype = dtype_name == "float32" ? torch::kFloat : torch::kDouble;
  auto model = transformer_from_fixture(f, dtype);
  const auto enc_X = f.tensor("enc_X"), dec_X = f.tensor("dec_X"),
             lens = f.tensor("enc_valid_lens");
  const auto [output, state] = model(enc_X, dec_X, lens);
  expect_matches(output, f, "output");
  expect_matches(state.enc_outputs, f, "enc_outputs");
  const auto enc_weights = encoder_of(model)->attention_weights();
  const auto dec_weights = decoder_of(model)->block_attention_weights();
  const auto layers = static_cast<int64_t>(f.scalar("num_layers"));
  for (int64_t i = 0; i < layers; ++i) {
    expect_matches(enc_weights[i], f, fmt::format("enc_weights.{}", i));
    expect_matches(dec_weights[0][i], f, fmt::format("dec_self_weights.{}", i));
    expect_matches(dec_weights[1][i], f, fmt::format("dec_cross_weights.{}", i));
    EXPECT_EQ(state.key_values[i].sizes(),
              (std::vector<int64_t>{dec_X.size(0), dec_X.size(1), state.enc_outputs.size(2)}));
  }
  // attention_weights(): every block's and head's encoder-decoder weights, example first.
  const auto heads = static_cast<int64_t>(f.scalar("num_heads"));
  const auto all = decoder_of(model)->attention_weights();
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{dec_X.size(0), layers * heads, dec_X.size(1),
                                               enc_X.size(1)}));
  EXPECT_TRUE(torch::equal(all[2][heads + 1], dec_weights[1][1][2 * heads + 1]));
  (output * f.tensor("G")).sum().backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    expect_matches(p.value().grad(), f, "grad." + p.key());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, TransformerParity,
    ::testing::Combine(::testing::Values("transformer_train", "transformer_eval"),
                       ::testing::Values("float32", "float64")),
    [](const auto& info) {
      return std::get<0>(info.param).substr(12) + "_" + std::get<1>(info.param);
    });

// The evaluation case, one token a call (dtype).
class TransformerStepParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TransformerStepParity, StepByStepDecodingMatchesThePythonReference) {
  const auto& dtype_name = GetParam();
  const auto f = load_fixture("transformer_eval_" + dtype_name);
  auto model = transformer_from_fixture(f, dtype_name == "float32" ? torch::kFloat : torch::kDouble);
  const auto enc_X = f.tensor("enc_X"), dec_X = f.tensor("dec_X"),
             lens = f.tensor("enc_valid_lens");
  const auto layers = static_cast<int64_t>(f.scalar("num_layers"));
  auto decoder = decoder_of(model);
  // Without autograd the decoder runs from its step cache; with it, the
  // book's concatenation: both must give the book's numbers.
  for (const bool cached : {true, false}) {
    SCOPED_TRACE(cached ? "step cache" : "the book's concatenation");
    torch::AutoGradMode grad_mode(!cached);
    auto state = decoder->init_state(model->encoder->forward(enc_X, lens), lens);
    std::vector<torch::Tensor> outputs;
    std::vector<std::vector<torch::Tensor>> cross(layers);
    for (int64_t t = 0; t < dec_X.size(1); ++t) {
      torch::Tensor Y;
      std::tie(Y, state) = decoder->forward(dec_X.slice(1, t, t + 1), state);
      EXPECT_EQ(state.cache != nullptr, cached);
      outputs.push_back(Y);
      const auto weights = decoder->block_attention_weights();
      for (int64_t i = 0; i < layers; ++i) {
        expect_matches(weights[0][i], f, fmt::format("stepwise.dec_self_weights.{}.{}", t, i));
        cross[i].push_back(weights[1][i]);
      }
    }
    expect_matches(torch::cat(outputs, 1), f, "stepwise.output");
    for (int64_t i = 0; i < layers; ++i) {
      expect_matches(state.key_values[i], f, fmt::format("stepwise.key_values.{}", i));
      expect_matches(torch::cat(cross[i], 1), f, fmt::format("stepwise.dec_cross_weights.{}", i));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformerStepParity, ::testing::Values("float32", "float64"));

// A state dict saved by the book's Python model (torch.save(model.state_dict()),
// tests/fixtures/generate_state_dicts.py) loads key for key and gives Python's outputs.
TEST(Transformer, AStateDictSavedByPythonLoadsAndGivesPythonsOutputs) {
  for (const char* version : {"torch113", "torch211"}) {
    const std::string name = std::string("state_transformer_") + version;
    SCOPED_TRACE(name);
    const auto f = load_fixture(name);
    d2l::EncoderDecoder model{d2l::TransformerEncoder(7, 8, 8, 8, 8, {8}, 8, 12, 2, 2, 0.1),
                              d2l::TransformerDecoder(7, 8, 8, 8, 8, {8}, 8, 12, 2, 2, 0.1)};
    d2l::load_state_dict(*model, std::string(D2L_FIXTURE_DIR) + "/" + name + ".pt");
    model->eval();
    torch::NoGradGuard no_grad;
    const auto enc_X = f.tensor("enc_X"), dec_X = f.tensor("dec_X"),
               lens = f.tensor("enc_valid_lens");
    expect_matches(std::get<0>(model(enc_X, dec_X, lens)), f, "output");
    auto state = model->decoder->init_state(model->encoder->forward(enc_X, lens), lens);
    std::vector<torch::Tensor> steps;
    for (int64_t t = 0; t < dec_X.size(1); ++t) {
      torch::Tensor Y;
      std::tie(Y, state) = model->decoder->forward(dec_X.slice(1, t, t + 1), state);
      steps.push_back(Y);
    }
    expect_matches(torch::cat(steps, 1), f, "stepwise_output");
  }
}

}  // namespace
