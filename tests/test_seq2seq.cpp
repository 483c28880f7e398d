// The book's RNN sequence-to-sequence modules (Seq2SeqEncoder, Seq2SeqDecoder,
// Seq2SeqAttentionDecoder): shapes and parameter names, parity with the Python
// code, errors, and CUDA. The once-per-sequence key projection:
// test_seq2seq_attention.cpp.

#include <d2l/backend.h>
#include <d2l/seq2seq.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <set>

#include "fixture.h"
#include "seq2seq_models.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::kEmbed;
using d2l::testing::kHiddens;
using d2l::testing::kLayers;
using d2l::testing::kVocab;
using d2l::testing::make_model;
using d2l::testing::max_rel_error;
using d2l::testing::parameter_names;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// Shapes and names

TEST(Seq2Seq, ShapesOfTheBooksExamples) {
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  encoder->eval();
  const auto X = torch::zeros({4, 7}, torch::kLong);
  const auto [output, state] = encoder(X);
  EXPECT_EQ(output.sizes(), (std::vector<int64_t>{7, 4, 16}));
  EXPECT_EQ(state.sizes(), (std::vector<int64_t>{2, 4, 16}));

  d2l::Seq2SeqDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  const auto [dec_output, dec_state] = decoder(X, decoder->init_state(encoder(X)));
  EXPECT_EQ(dec_output.sizes(), (std::vector<int64_t>{4, 7, 10}));
  EXPECT_EQ(dec_state.hidden_state.sizes(), (std::vector<int64_t>{2, 4, 16}));

  d2l::Seq2SeqAttentionDecoder attention(kVocab, kEmbed, kHiddens, kLayers);
  const auto lens = torch::tensor({7, 2, 3, 1});
  const auto [att_output, att_state] = attention(X, attention->init_state(encoder(X), lens));
  EXPECT_EQ(att_output.sizes(), (std::vector<int64_t>{4, 7, 10}));
  EXPECT_EQ(att_state.enc_outputs.sizes(), (std::vector<int64_t>{4, 7, 16}));
  EXPECT_EQ(att_state.hidden_state[0].sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_TRUE(torch::equal(att_state.enc_valid_lens, lens));
  EXPECT_EQ(attention->attention_weights().sizes(), (std::vector<int64_t>{4, 7, 7}));
  // Masked source positions get no weight.
  EXPECT_EQ(attention->attention_weights()[1].slice(1, 2).abs().max().item<double>(), 0.0);
}

TEST(Seq2Seq, ParametersAreNamedAsInThePythonStateDict) {
  const std::vector<std::string> gru = {"rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0",
                                        "rnn.bias_hh_l0",   "rnn.weight_ih_l1", "rnn.weight_hh_l1",
                                        "rnn.bias_ih_l1",   "rnn.bias_hh_l1"};
  std::vector<std::string> encoder = {"embedding.weight"};
  encoder.insert(encoder.end(), gru.begin(), gru.end());
  std::vector<std::string> attention = {"attention.W_k.weight", "attention.W_q.weight",
                                        "attention.w_v.weight", "embedding.weight"};
  attention.insert(attention.end(), gru.begin(), gru.end());
  attention.insert(attention.end(), {"dense.weight", "dense.bias"});

  EXPECT_EQ(parameter_names(*d2l::Seq2SeqEncoder(kVocab, kEmbed, kHiddens, kLayers)), encoder);
  EXPECT_EQ(parameter_names(*d2l::Seq2SeqAttentionDecoder(kVocab, kEmbed, kHiddens, kLayers)),
            attention);
  auto model = make_model(true, d2l::Seq2SeqOptions(kVocab, kEmbed, kHiddens, kLayers));
  const auto names = parameter_names(*model);
  EXPECT_EQ(names.front(), "encoder.embedding.weight");
  EXPECT_EQ(names[9], "decoder.attention.W_k.weight");
  EXPECT_EQ(names.back(), "decoder.dense.bias");
  const auto params = model->named_parameters();
  EXPECT_EQ(params["decoder.rnn.weight_ih_l0"].sizes(), (std::vector<int64_t>{48, 24}));
}

// ---------------------------------------------------------------------------
// Parity with the book's PyTorch code (tests/fixtures/generate_fixtures_seq2seq.py)

// Fixture name and the implementation of the decoder's attention scores.
class Seq2SeqParity
    : public ::testing::TestWithParam<std::tuple<std::string, d2l::AttentionBackend>> {};

TEST_P(Seq2SeqParity, MatchesThePythonReference) {
  const auto& [name, path] = GetParam();
  const auto f = d2l::testing::load_fixture(name);
  const bool attention = name.find("attention") != std::string::npos;
  const bool is_double = name.find("float64") != std::string::npos;
  const double tol = is_double ? 1e-12 : 1e-5;
  auto model =
      make_model(attention, d2l::Seq2SeqOptions(static_cast<int64_t>(f.scalar("vocab_size")),
                                                static_cast<int64_t>(f.scalar("embed_size")),
                                                static_cast<int64_t>(f.scalar("num_hiddens")),
                                                static_cast<int64_t>(f.scalar("num_layers")))
                                .dropout(f.scalar("dropout")));
  if (attention) {
    std::dynamic_pointer_cast<d2l::Seq2SeqAttentionDecoderImpl>(model->decoder)
        ->attention->options.backend(path);
  }
  model->to(is_double ? torch::kDouble : torch::kFloat);
  model->eval();

  const std::set<std::string> not_parameters = {
      "enc_X",   "dec_X",  "enc_valid_lens", "G",
      "G_state", "output", "hidden_state",   "attention_weights"};
  std::vector<std::string> fixture_parameters;
  for (const auto& name : f.tensor_names()) {
    if (not_parameters.count(name) == 0 && name.rfind("grad.", 0) != 0 &&
        name.rfind("stepwise.", 0) != 0) {
      fixture_parameters.push_back(name);
    }
  }
  auto names = parameter_names(*model);
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names, fixture_parameters);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) p.value().copy_(f.tensor(p.key()));
  }

  const auto enc_X = f.tensor("enc_X"), dec_X = f.tensor("dec_X"),
             lens = f.tensor("enc_valid_lens");
  const auto [output, state] = model(enc_X, dec_X, lens);
  double worst = 0;
  auto expect_close = [&](const torch::Tensor& actual, const std::string& name) {
    const double err = max_rel_error(actual, f.tensor(name));
    worst = std::max(worst, err);
    EXPECT_LT(err, tol) << name;
  };
  expect_close(output, "output");
  expect_close(state.hidden_state, "hidden_state");
  auto* decoder = dynamic_cast<d2l::AttentionDecoder*>(model->decoder.get());
  ASSERT_EQ(decoder != nullptr, attention);
  if (attention) expect_close(decoder->attention_weights(), "attention_weights");

  ((output * f.tensor("G")).sum() + (state.hidden_state * f.tensor("G_state")).sum()).backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    expect_close(p.value().grad(), "grad." + p.key());
  }

  torch::NoGradGuard no_grad;
  auto step_state = model->decoder->init_state(model->encoder->forward(enc_X, lens), lens);
  std::vector<torch::Tensor> outputs, weights;
  for (int64_t t = 0; t < dec_X.size(1); ++t) {
    torch::Tensor Y;
    std::tie(Y, step_state) = model->decoder->forward(dec_X.slice(1, t, t + 1), step_state);
    outputs.push_back(Y);
    if (attention) weights.push_back(decoder->attention_weights());
  }
  expect_close(torch::cat(outputs, 1), "stepwise.output");
  expect_close(step_state.hidden_state, "stepwise.hidden_state");
  if (attention) expect_close(torch::cat(weights, 1), "stepwise.attention_weights");
  RecordProperty("max_rel_error", std::to_string(worst));
  std::cout << "[ parity   ] " << name
            << (path == d2l::AttentionBackend::kComposite ? " (composite)" : "")
            << ": max relative error " << worst << '\n';
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, Seq2SeqParity,
    ::testing::Values(
        std::make_tuple("seq2seq_attention_float32", d2l::AttentionBackend::kAuto),
        std::make_tuple("seq2seq_attention_float64", d2l::AttentionBackend::kAuto),
        std::make_tuple("seq2seq_attention_float32", d2l::AttentionBackend::kComposite),
        std::make_tuple("seq2seq_attention_float64", d2l::AttentionBackend::kComposite),
        std::make_tuple("seq2seq_plain_float32", d2l::AttentionBackend::kAuto),
        std::make_tuple("seq2seq_plain_float64", d2l::AttentionBackend::kAuto)));

// ---------------------------------------------------------------------------
// Errors

TEST(Seq2Seq, RejectsBadTokenIds) {
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  EXPECT_THAT(error_message([&] { encoder(torch::zeros({4}, torch::kLong)); }),
              HasSubstr("d2l::Seq2SeqEncoder: X must be a 2-D tensor (batch_size, num_steps) of "
                        "token ids with at least one example and one step, got [4]"));
  EXPECT_THAT(error_message([&] {
                encoder(torch::zeros({4, 0}, torch::kLong));
              }),
              HasSubstr("got [4, 0]"));
  EXPECT_THAT(error_message([&] {
                encoder(torch::zeros({4, 7}));
              }),
              HasSubstr("d2l::Seq2SeqEncoder: X must hold integer token ids, got dtype Float"));
  EXPECT_THAT(error_message([&] {
                encoder(torch::tensor({{1, 2, 10}}));
              }),
              HasSubstr("d2l::Seq2SeqEncoder: X must hold token ids in [0, vocab_size=10), got ids "
                        "from 1 to 10"));
  EXPECT_THAT(error_message([&] {
                encoder(torch::tensor({{-1, 2, 3}}));
              }),
              HasSubstr("got ids from -1 to 3"));
  EXPECT_THAT(error_message([&] {
                encoder(torch::ones({2, 3}, torch::kInt), torch::tensor({1}));
              }),
              HasSubstr("d2l::Seq2SeqEncoder: valid_lens must have shape [batch_size=2], got [1]"));

  d2l::Seq2SeqDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  const auto state = decoder->init_state(encoder(torch::ones({2, 3}, torch::kLong)));
  EXPECT_THAT(error_message([&] {
                decoder(torch::full({2, 1}, 12), state);
              }),
              HasSubstr("d2l::Seq2SeqDecoder: X must hold token ids in [0, vocab_size=10), got "
                        "ids from 12 to 12"));
}

TEST(Seq2Seq, RejectsBadStatesAndLengths) {
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqAttentionDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  const auto enc = encoder(torch::ones({2, 3}, torch::kLong));
  EXPECT_THAT(error_message([&] {
                decoder->init_state(enc, torch::tensor({{1, 2}}));
              }),
              HasSubstr("d2l::Seq2SeqAttentionDecoder::init_state: enc_valid_lens must have "
                        "shape [batch_size=2], got [1, 2]"));
  EXPECT_THAT(error_message([&] {
                decoder->init_state(enc, torch::tensor({1, -2}));
              }),
              HasSubstr("enc_valid_lens must hold non-negative lengths, got -2"));
  EXPECT_THAT(error_message([&] {
                decoder->init_state({enc.outputs, enc.hidden_state[0]});
              }),
              HasSubstr("d2l::Seq2SeqAttentionDecoder::init_state: enc_outputs.hidden_state must "
                        "have shape [num_layers=2, batch_size=2, num_hiddens=16], got [2, 16]"));
  EXPECT_THAT(error_message([&] {
                decoder->init_state({enc.outputs.to(torch::kDouble), enc.hidden_state});
              }),
              HasSubstr("enc_outputs.outputs must have the same dtype as enc_outputs.hidden_state "
                        "(Float), got Double"));

  const auto state = decoder->init_state(enc, torch::tensor({3, 1}));
  EXPECT_THAT(error_message([&] {
                decoder(torch::ones({3, 1}, torch::kLong), state);
              }),
              HasSubstr("d2l::Seq2SeqAttentionDecoder: state.hidden_state must have shape "
                        "[num_layers=2, batch_size=3, num_hiddens=16], got [2, 2, 16]"));
  d2l::DecoderState hand_made;
  hand_made.hidden_state = enc.hidden_state;
  hand_made.enc_outputs = enc.outputs.permute({1, 0, 2});
  EXPECT_THAT(error_message([&] {
                decoder(torch::ones({2, 1}, torch::kLong), hand_made);
              }),
              HasSubstr("d2l::Seq2SeqAttentionDecoder: state must come from init_state"));

  d2l::Seq2SeqDecoder plain(kVocab, kEmbed, kHiddens, kLayers);
  EXPECT_THAT(error_message([&] {
                plain(torch::ones({2, 1}, torch::kLong), d2l::DecoderState{});
              }),
              HasSubstr("d2l::Seq2SeqDecoder: state.hidden_state must have shape [num_layers=2, "
                        "batch_size=2, num_hiddens=16], got undefined"));

  d2l::EncoderDecoder model(encoder, decoder);
  EXPECT_THAT(error_message([&] {
                model(torch::ones({2, 3}, torch::kLong), torch::ones({3, 3}, torch::kLong));
              }),
              HasSubstr("d2l::EncoderDecoder: enc_X and dec_X must be (batch_size, num_steps) with "
                        "the same batch size, got enc_X [2, 3] and dec_X [3, 3]"));
}

TEST(Seq2Seq, RejectsBadOptions) {
  EXPECT_THAT(error_message([] { d2l::Seq2SeqEncoder(10, 8, 0, 2); }),
              HasSubstr("d2l::Seq2SeqEncoder: vocab_size, embed_size, num_hiddens and num_layers "
                        "must be positive, got vocab_size=10, embed_size=8, num_hiddens=0, "
                        "num_layers=2"));
  EXPECT_THAT(error_message([] { d2l::Seq2SeqAttentionDecoder(10, 8, 16, 2, 1.5); }),
              HasSubstr("d2l::Seq2SeqAttentionDecoder: dropout must be a probability in [0, 1], "
                        "got 1.5"));
  EXPECT_THAT(error_message([] {
                d2l::EncoderDecoder(
                    std::shared_ptr<d2l::Encoder>(),
                    std::shared_ptr<d2l::Decoder>(d2l::Seq2SeqDecoder(10, 8, 16, 2).ptr()));
              }),
              HasSubstr("d2l::EncoderDecoder: encoder must be a module, got nullptr"));
}

TEST(Seq2Seq, CudaMatchesCpuWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(9);
  auto model = make_model(true, d2l::Seq2SeqOptions(kVocab, kEmbed, kHiddens, kLayers));
  model->to(torch::kDouble);
  model->eval();
  const auto X = torch::randint(kVocab, {3, 6}), Y = torch::randint(kVocab, {3, 4});
  const auto lens = torch::tensor({6, 2, 4});
  const auto [cpu_output, cpu_state] = model(X, Y, lens);
  model->to(torch::Device(torch::kCUDA));
  const auto [cuda_output, cuda_state] = model(X.cuda(), Y.cuda(), lens.cuda());
  EXPECT_LT(max_rel_error(cuda_output, cpu_output), 1e-10);
  EXPECT_LT(max_rel_error(cuda_state.hidden_state, cpu_state.hidden_state), 1e-10);
  // Each input left on the CPU is named, against the model's device.
  constexpr const char* kModel = "d2l::EncoderDecoder: ";
  EXPECT_THAT(error_message([&] { model(X, Y.cuda(), lens.cuda()); }),
              HasSubstr(std::string(kModel) + "enc_X must be on the same device as the model's "
                                              "parameters (cuda:0), got cpu"));
  EXPECT_THAT(error_message([&] { model(X.cuda(), Y, lens.cuda()); }),
              HasSubstr(std::string(kModel) + "dec_X must be on the same device as the model's "
                                              "parameters (cuda:0), got cpu"));
  EXPECT_THAT(error_message([&] { model(X.cuda(), Y.cuda(), lens); }),
              HasSubstr(std::string(kModel) + "enc_valid_lens must be on the same device as the "
                                              "model's parameters (cuda:0), got cpu"));
  // The encoder alone names its own parameter.
  EXPECT_THAT(error_message([&] { model->encoder->forward(X, lens.cuda()); }),
              HasSubstr("X must be on the same device as embedding.weight (cuda:0), got cpu"));
}

}  // namespace
