// d2l 1.0's RNN encoder-decoders against d2l 1.0's own code
// (tests/fixtures/generate_fixtures_v1.py): the book's lines, its state dict
// loaded strictly, outputs, states, attention weights, gradients and the
// masked loss in float32 and float64, decoding one token per call; and a
// state dict of the other edition refused with keys that say so.

#include <d2l/seq2seq.h>
#include <d2l/state_dict.h>
#include <d2l/v1.h>

#include <gmock/gmock.h>

#include <sstream>
#include <string>

#include "test_utils.h"
#include "v1_fixture_helpers.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::fixture_path;
using d2l::testing::v1::both_dtypes;
using d2l::testing::v1::Case;
using d2l::testing::v1::file_keys;
using d2l::testing::v1::parameter_keys;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The case's Seq2Seq(Seq2SeqEncoder(10, 8, 16, 2, 0.1), <decoder>(...),
// tgt_pad=1, lr=0.005), its state dict loaded, in evaluation mode.
d2l::v1::Seq2Seq seq2seq_of(const Case& c, bool attention) {
  const auto n = [&](const char* s) { return static_cast<int64_t>(c.f.scalar(s)); };
  const double dropout = c.f.scalar("dropout");
  d2l::v1::Seq2SeqEncoder encoder(n("vocab_size"), n("embed_size"), n("num_hiddens"),
                                  n("num_layers"), dropout);
  auto model =
      attention
          ? d2l::v1::Seq2Seq(
                encoder,
                d2l::v1::Seq2SeqAttentionDecoder(n("vocab_size"), n("embed_size"), n("num_hiddens"),
                                                 n("num_layers"), dropout),
                n("tgt_pad"), 0.005)
          : d2l::v1::Seq2Seq(encoder,
                             d2l::v1::Seq2SeqDecoder(n("vocab_size"), n("embed_size"),
                                                     n("num_hiddens"), n("num_layers"), dropout),
                             n("tgt_pad"), 0.005);
  EXPECT_EQ(parameter_keys(*model), file_keys(c.pt()));
  c.load_into(*model);
  model->eval();
  return model;
}

torch::Tensor attention_weights_of(const d2l::v1::Seq2Seq& model) {
  auto decoder = std::dynamic_pointer_cast<d2l::v1::Seq2SeqAttentionDecoderImpl>(model->decoder);
  return torch::cat(decoder->attention_weights(), 1);
}

void expect_seq2seq_case(const Case& c, bool attention) {
  auto model = seq2seq_of(c, attention);
  const auto enc_X = c["enc_X"], dec_X = c["dec_X"], lens = c["enc_valid_lens"];
  const auto enc = model->encoder->forward(enc_X, lens);
  auto [output, state] = model->decoder->forward(dec_X, model->decoder->init_state(enc, lens));
  EXPECT_TRUE(c.close(enc.outputs, "enc_outputs"));
  EXPECT_TRUE(c.close(output, "output", 4));
  EXPECT_TRUE(c.close(state.hidden_state, "hidden_state", 4));
  if (attention) EXPECT_TRUE(c.close(attention_weights_of(model), "attention_weights", 4));
  ((output * c["G"]).sum() + (state.hidden_state * c["G_state"]).sum()).backward();
  c.expect_parameter_grads(*model, 16);

  torch::NoGradGuard no_grad;
  const auto logits = model(enc_X, dec_X, lens);  // the logits only, as 1.0's EncoderDecoder
  EXPECT_TRUE(c.close(logits, "output", 4));
  EXPECT_TRUE(c.close(model->loss(logits, c["Y"]), "seq2seq_loss", 4));

  // One target token per call, each fed the previous call's state.
  auto step_state = model->decoder->init_state(model->encoder->forward(enc_X, lens), lens);
  std::vector<torch::Tensor> outputs, weights;
  for (int64_t t = 0; t < dec_X.size(1); ++t) {
    torch::Tensor Y;
    std::tie(Y, step_state) = model->decoder->forward(dec_X.slice(1, t, t + 1), step_state);
    outputs.push_back(Y);
    if (attention) weights.push_back(attention_weights_of(model));
  }
  EXPECT_TRUE(c.close(torch::cat(outputs, 1), "stepwise.output", 4));
  EXPECT_TRUE(c.close(step_state.hidden_state, "stepwise.hidden_state", 4));
  if (attention) EXPECT_TRUE(c.close(torch::cat(weights, 1), "stepwise.attention_weights", 4));
}

TEST(V1Fixtures, BahdanauSeq2SeqIsTheBooks) {
  for (const auto& c : both_dtypes("v1_seq2seq_attention")) {
    SCOPED_TRACE(c.dtype);
    expect_seq2seq_case(c, /*attention=*/true);
  }
}

TEST(V1Fixtures, PlainSeq2SeqIsTheBooks) {
  for (const auto& c : both_dtypes("v1_seq2seq_plain")) {
    SCOPED_TRACE(c.dtype);
    expect_seq2seq_case(c, /*attention=*/false);
  }
}

TEST(V1Seq2Seq, TheBooksLinesGiveTheBooksShapes) {
  const int64_t vocab_size = 10, embed_size = 8, num_hiddens = 16, num_layers = 2;
  const int64_t batch_size = 4, num_steps = 7;
  auto encoder = d2l::v1::Seq2SeqEncoder(vocab_size, embed_size, num_hiddens, num_layers);
  auto decoder = d2l::v1::Seq2SeqAttentionDecoder(vocab_size, embed_size, num_hiddens, num_layers);
  const auto X = torch::zeros({batch_size, num_steps}, torch::kLong);
  auto state = decoder->init_state(encoder(X), {});
  auto [output, next] = decoder(X, state);
  EXPECT_EQ(output.sizes(), (std::vector<int64_t>{batch_size, num_steps, vocab_size}));
  EXPECT_EQ(next.enc_outputs.sizes(), (std::vector<int64_t>{batch_size, num_steps, num_hiddens}));
  EXPECT_EQ(next.hidden_state[0].sizes(), (std::vector<int64_t>{batch_size, num_hiddens}));
  EXPECT_EQ(decoder->attention_weights().size(), static_cast<size_t>(num_steps));
  EXPECT_EQ(decoder->attention_weights()[0].sizes(), (std::vector<int64_t>{batch_size, 1, 7}));

  auto plain = d2l::v1::Seq2SeqDecoder(vocab_size, embed_size, num_hiddens, num_layers);
  auto [plain_output, plain_state] = plain(X, plain->init_state(encoder(X)));
  EXPECT_EQ(plain_output.sizes(), (std::vector<int64_t>{batch_size, num_steps, vocab_size}));
  EXPECT_EQ(plain_state.hidden_state.sizes(),
            (std::vector<int64_t>{num_layers, batch_size, num_hiddens}));
}

TEST(V1Seq2Seq, TheEncoderWrapsItsGruAndTheBahdanauDecoderDoesNot) {
  d2l::v1::Seq2SeqEncoder encoder(10, 8, 16, 2);
  EXPECT_EQ(parameter_keys(*encoder)[1], "rnn.rnn.weight_ih_l0");
  d2l::v1::Seq2SeqDecoder plain(10, 8, 16, 2);
  EXPECT_THAT(parameter_keys(*plain), ::testing::Contains("rnn.rnn.weight_hh_l1"));
  d2l::v1::Seq2SeqAttentionDecoder decoder(10, 8, 16, 2);
  EXPECT_EQ(parameter_keys(*decoder),
            (std::vector<std::string>{
                "attention.W_k.weight", "attention.W_q.weight", "attention.w_v.weight",
                "embedding.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0",
                "rnn.bias_hh_l0", "rnn.weight_ih_l1", "rnn.weight_hh_l1", "rnn.bias_ih_l1",
                "rnn.bias_hh_l1", "dense.weight", "dense.bias"}));
  d2l::v1::GRU gru(3, 5, 1);
  auto [outputs, H] = gru(torch::randn({4, 2, 3}));
  EXPECT_EQ(H.sizes(), (std::vector<int64_t>{1, 2, 5}));
  EXPECT_EQ(parameter_keys(*gru).front(), "rnn.weight_ih_l0");
}

TEST(V1Seq2Seq, InitSeq2SeqIsXavierForLinearAndGruWeightsOnly) {
  torch::manual_seed(5);
  d2l::v1::Seq2SeqEncoder encoder(10, 8, 16, 1);
  // Xavier-uniform bound of weight_hh_l0 (48, 16): sqrt(6 / (16 + 48)) ≈ 0.306,
  // above the GRU's own 1/sqrt(16) = 0.25.
  const auto w = encoder->named_parameters()["rnn.rnn.weight_hh_l0"];
  EXPECT_GT(w.abs().max().item<double>(), 0.26);
  EXPECT_LE(w.abs().max().item<double>(), std::sqrt(6.0 / 64) + 1e-6);
  EXPECT_LE(encoder->named_parameters()["rnn.rnn.bias_hh_l0"].abs().max().item<double>(), 0.25);
  torch::nn::Linear linear(100, 100);
  linear->apply(d2l::v1::init_seq2seq);
  EXPECT_GT(linear->weight.abs().max().item<double>(), 0.11);  // nn.Linear's bound is 0.1
  d2l::LazyLinear lazy(4);
  lazy->apply(d2l::v1::init_seq2seq);
  EXPECT_TRUE(lazy->has_uninitialized_params());
}

TEST(V1Seq2Seq, TheMaskedLossLeavesPaddingOut) {
  d2l::v1::Seq2Seq model(d2l::v1::Seq2SeqEncoder(5, 4, 6, 1), d2l::v1::Seq2SeqDecoder(5, 4, 6, 1),
                         /*tgt_pad=*/1, /*lr=*/0.01);
  const auto Y_hat = torch::randn({2, 3, 5});
  const auto Y = torch::tensor({{2, 1, 1}, {0, 3, 1}});
  const auto l = torch::nn::functional::cross_entropy(
      Y_hat.reshape({-1, 5}), Y.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  EXPECT_TRUE(torch::allclose(model->loss(Y_hat, Y), (l[0] + l[3] + l[4]) / 3));
  EXPECT_THAT(error_message([&] { model->loss(Y_hat, Y.to(torch::kFloat)); }),
              AllOf(HasSubstr("d2l::v1::Seq2Seq::loss"), HasSubstr("integer labels")));
  EXPECT_THAT(error_message([&] {
                model->loss(Y_hat, torch::tensor({{2, 1, 1}, {0, 5, 1}}));
              }),
              AllOf(HasSubstr("d2l::v1::Seq2Seq::loss: Y holds 5 at flat index 4"),
                    HasSubstr("Y_hat's vocabulary")));
}

TEST(V1Seq2Seq, AnEditionZeroSeventeenFileIsRefusedWithKeysThatSaySo) {
  // generate_state_dicts.py's 0.17 model: vocab 6, embed 4, hidden 8, 2 layers.
  d2l::v1::EncoderDecoder model(d2l::v1::Seq2SeqEncoder(6, 4, 8, 2, 0.1),
                                d2l::v1::Seq2SeqAttentionDecoder(6, 4, 8, 2, 0.1));
  const auto message = error_message(
      [&] { d2l::load_state_dict(*model, fixture_path("state_seq2seq_torch113.pt")); });
  EXPECT_THAT(message,
              AllOf(HasSubstr("d2l::load_state_dict"),
                    HasSubstr("missing keys (8): encoder.rnn.rnn.weight_ih_l0"),
                    HasSubstr("unexpected keys (8): encoder.rnn.weight_ih_l0"),
                    HasSubstr("GRU keys are d2l 0.17's"), HasSubstr("d2l::Seq2SeqEncoder")));
  // Nothing was loaded: the lazy layers are still waiting for their widths.
  EXPECT_TRUE(d2l::has_uninitialized_params(*model));
  // The Bahdanau decoder's keys are the same in both editions: it loads alone.
  d2l::v1::Seq2SeqAttentionDecoder decoder(6, 4, 8, 2, 0.1);
  std::vector<std::pair<std::string, torch::Tensor>> decoder_part;
  for (auto& [key, value] : d2l::read_state_dict(fixture_path("state_seq2seq_torch113.pt"))) {
    if (key.rfind("decoder.", 0) == 0) decoder_part.emplace_back(key.substr(8), value);
  }
  std::stringstream file;
  d2l::write_state_dict(decoder_part, file);
  d2l::load_state_dict(*decoder, file);
  EXPECT_FALSE(d2l::has_uninitialized_params(*decoder));
}

TEST(V1Seq2Seq, AnEditionOneFileIsRefusedByTheZeroSeventeenModules) {
  d2l::EncoderDecoder model(d2l::Seq2SeqEncoder(10, 8, 16, 2, 0.1),
                            d2l::Seq2SeqAttentionDecoder(10, 8, 16, 2, 0.1));
  const auto before = model->named_parameters()["encoder.embedding.weight"].clone();
  const auto message = error_message(
      [&] { d2l::load_state_dict(*model, fixture_path("v1_seq2seq_attention_float32.pt")); });
  EXPECT_THAT(message, AllOf(HasSubstr("missing keys (8): encoder.rnn.weight_ih_l0"),
                             HasSubstr("unexpected keys (8): encoder.rnn.rnn.weight_ih_l0"),
                             HasSubstr("GRU keys are d2l 1.0's"), HasSubstr("d2l::v1")));
  EXPECT_TRUE(torch::equal(model->named_parameters()["encoder.embedding.weight"], before));
}

TEST(V1Seq2Seq, WhatWeSaveIsWhatPythonVerified) {
  // tests/fixtures/generate_fixtures_v1.py --verify-cpp loads this file into
  // the book's (lazy) model, strictly, and gets the case's output.
  const Case c("v1_seq2seq_attention", "float32");
  const auto model = seq2seq_of(c, /*attention=*/true);
  std::ostringstream bytes;
  d2l::save_state_dict(*model, bytes);
  d2l::testing::v1::expect_committed_bytes("v1_cpp_seq2seq.pt", bytes.str());
  if (d2l::testing::v1::writing_state_fixtures()) {
    GTEST_SKIP() << "D2L_WRITE_STATE_FIXTURES: rewrote v1_cpp_seq2seq.pt; verify it with "
                    "`make fixtures` (generate_fixtures_v1.py --verify-cpp)";
  }
}

TEST(V1Seq2Seq, BadInputNamesTheArgument) {
  d2l::v1::Seq2SeqEncoder encoder(10, 8, 16, 2);
  d2l::v1::Seq2SeqDecoder decoder(10, 8, 16, 2);
  auto state = decoder->init_state(encoder(torch::zeros({3, 5}, torch::kLong)));
  state.hidden_state = torch::zeros({2, 4, 16});
  EXPECT_THAT(error_message([&] {
                decoder(torch::zeros({3, 1}, torch::kLong), state);
              }),
              AllOf(HasSubstr("d2l::v1::Seq2SeqDecoder"), HasSubstr("state.hidden_state"),
                    HasSubstr("batch_size=3"), HasSubstr("[2, 4, 16]")));
  EXPECT_THAT(error_message([] {
                d2l::v1::GRU(3, 5, 1)(torch::randn({4, 2, 6}));
              }),
              AllOf(HasSubstr("d2l::v1::GRU"), HasSubstr("num_inputs=3"), HasSubstr("[4, 2, 6]")));
  EXPECT_THAT(error_message([] { d2l::v1::Seq2SeqEncoder(10, 0, 16, 2); }),
              AllOf(HasSubstr("d2l::v1::Seq2SeqEncoder"), HasSubstr("embed_size=0")));
  d2l::v1::Seq2SeqAttentionDecoder attention(10, 8, 16, 2);
  EXPECT_THAT(
      error_message([&] {
        attention->init_state(encoder(torch::zeros({3, 5}, torch::kLong)), torch::tensor({1, 2}));
      }),
      AllOf(HasSubstr("d2l::v1::Seq2SeqAttentionDecoder::init_state"),
            HasSubstr("enc_valid_lens")));
}

}  // namespace
