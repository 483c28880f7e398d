// d2l 1.0's scoring layers and Transformer against d2l 1.0's own code
// (tests/fixtures/generate_fixtures_v1.py): each module built with the
// book's line, the book's torch.save'd state dict loaded strictly (no key
// missing or extra), then outputs, attention weights (per block) and every
// parameter's gradient compared in float32 and float64, and the decoder run
// one token per call as the book's prediction does.

#include <d2l/state_dict.h>
#include <d2l/transformer.h>
#include <d2l/v1.h>

#include <gmock/gmock.h>

#include <sstream>
#include <string>

#include "test_utils.h"
#include "v1_fixture_helpers.h"

namespace {

using d2l::testing::load_fixture;
using d2l::testing::v1::both_dtypes;
using d2l::testing::v1::Case;
using d2l::testing::v1::file_keys;
using d2l::testing::v1::parameter_keys;

// A scoring module on the case's queries, keys and values: output, weights
// and the gradients of sum(output * G).
template <typename Module, typename Weights>
void expect_attention_case(const Case& c, Module& module, Weights weights_of) {
  EXPECT_EQ(parameter_keys(*module), file_keys(c.pt()));
  c.load_into(*module);
  module->eval();
  auto q = c["queries"].clone().requires_grad_();
  auto k = c["keys"].clone().requires_grad_();
  auto v = c["values"].clone().requires_grad_();
  const auto output = module(q, k, v, c["valid_lens"]);
  EXPECT_TRUE(c.close(output, "output"));
  EXPECT_TRUE(c.close(weights_of(module), "attention_weights"));
  (output * c["G"]).sum().backward();
  EXPECT_TRUE(c.close(q.grad(), "grad.queries"));
  EXPECT_TRUE(c.close(k.grad(), "grad.keys"));
  EXPECT_TRUE(c.close(v.grad(), "grad.values"));
  c.expect_parameter_grads(*module);
}

TEST(V1Fixtures, AdditiveAttentionIsTheBooks) {
  for (const auto& c : both_dtypes("v1_additive")) {
    SCOPED_TRACE(c.dtype);
    d2l::v1::AdditiveAttention attention(8, 0.1);
    expect_attention_case(c, attention, [](auto& m) { return m->last_attention_weights(); });
  }
}

TEST(V1Fixtures, MultiHeadAttentionIsTheBooks) {
  for (const auto& c : both_dtypes("v1_mha")) {
    SCOPED_TRACE(c.dtype);
    d2l::v1::MultiHeadAttention attention(12, 4, 0.1, /*bias=*/true);
    expect_attention_case(c, attention, [](auto& m) { return m->last_attention_weights(); });
  }
}

TEST(V1Fixtures, PositionWiseFFNIsTheBooks) {
  for (const auto& c : both_dtypes("v1_ffn")) {
    SCOPED_TRACE(c.dtype);
    d2l::v1::PositionWiseFFN ffn(4, 8);
    EXPECT_EQ(parameter_keys(*ffn), file_keys(c.pt()));
    c.load_into(*ffn);
    auto X = c["X"].clone().requires_grad_();
    const auto output = ffn(X);
    EXPECT_TRUE(c.close(output, "output"));
    (output * c["G"]).sum().backward();
    EXPECT_TRUE(c.close(X.grad(), "grad.X"));
    c.expect_parameter_grads(*ffn);
  }
}

TEST(V1Fixtures, TransformerEncoderBlockIsTheBooks) {
  for (const auto& c : both_dtypes("v1_encoder_block")) {
    SCOPED_TRACE(c.dtype);
    d2l::v1::TransformerEncoderBlock block(24, 48, 8, 0.5);
    EXPECT_EQ(parameter_keys(*block), file_keys(c.pt()));
    c.load_into(*block);
    block->eval();
    auto X = c["X"].clone().requires_grad_();
    const auto output = block(X, c["valid_lens"]);
    EXPECT_TRUE(c.close(output, "output"));
    EXPECT_TRUE(c.close(block->attention->last_attention_weights(), "attention_weights"));
    (output * c["G"]).sum().backward();
    EXPECT_TRUE(c.close(X.grad(), "grad.X", 4));
    c.expect_parameter_grads(*block, 4);
  }
}

// The case's model: the book's lines, the book's state dict, the book's
// positional table (LibTorch's float32 sin and cos may differ from Python's
// by an ulp, which a float64 model would carry everywhere).
struct Transformer {
  const Case& c;
  d2l::v1::EncoderDecoder model;
  std::shared_ptr<d2l::v1::TransformerEncoderImpl> encoder;
  std::shared_ptr<d2l::v1::TransformerDecoderImpl> decoder;

  explicit Transformer(const Case& c_) : c(c_), model(make(c_)) {
    encoder = std::dynamic_pointer_cast<d2l::v1::TransformerEncoderImpl>(model->encoder);
    decoder = std::dynamic_pointer_cast<d2l::v1::TransformerDecoderImpl>(model->decoder);
    EXPECT_EQ(parameter_keys(*model), file_keys(c.pt()));
    c.load_into(*model);
    const auto table = load_fixture("positional_encoding_float32").tensor("P.16");
    for (auto* pe : {&encoder->pos_encoding, &decoder->pos_encoding}) {
      (*pe)->P.narrow(1, 0, table.size(0)).copy_(table.unsqueeze(0));
    }
    model->train(c.f.scalar("training") != 0);
  }

  static d2l::v1::EncoderDecoder make(const Case& c) {
    const auto n = [&](const char* s) { return static_cast<int64_t>(c.f.scalar(s)); };
    const double dropout = c.f.scalar("dropout");
    return d2l::v1::EncoderDecoder(
        d2l::v1::TransformerEncoder(n("vocab_size"), n("num_hiddens"), n("ffn_num_hiddens"),
                                    n("num_heads"), n("num_blks"), dropout, n("use_bias") != 0),
        d2l::v1::TransformerDecoder(n("vocab_size"), n("num_hiddens"), n("ffn_num_hiddens"),
                                    n("num_heads"), n("num_blks"), dropout));
  }
};

void expect_transformer_case(const Case& c) {
  Transformer t(c);
  const auto enc_X = c["enc_X"], dec_X = c["dec_X"], lens = c["enc_valid_lens"];
  const auto enc = t.encoder->forward(enc_X, lens);
  auto [output, state] = t.decoder->forward(dec_X, t.decoder->init_state(enc, lens));
  EXPECT_TRUE(c.close(output, "output", 4));
  EXPECT_TRUE(c.close(enc.outputs, "enc_outputs", 4));
  const auto enc_weights = t.encoder->attention_weights();
  const auto dec_weights = t.decoder->attention_weights();
  for (int64_t i = 0; i < t.encoder->num_blks; ++i) {
    const auto b = std::to_string(i);
    EXPECT_TRUE(c.close(enc_weights[i], "enc_weights." + b, 4));
    EXPECT_TRUE(c.close(dec_weights[0][i], "dec_self_weights." + b, 4));
    EXPECT_TRUE(c.close(dec_weights[1][i], "dec_cross_weights." + b, 4));
  }
  (output * c["G"]).sum().backward();
  c.expect_parameter_grads(*t.model, 16);
  // d2l 1.0's EncoderDecoder returns the logits alone.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(c.close(t.model(enc_X, dec_X, lens), "output", 4));
}

TEST(V1Fixtures, TransformerInTrainingModeIsTheBooks) {
  for (const auto& c : both_dtypes("v1_transformer_train")) {
    SCOPED_TRACE(c.dtype);
    expect_transformer_case(c);
  }
}

TEST(V1Fixtures, TransformerInEvaluationModeIsTheBooks) {
  for (const auto& c : both_dtypes("v1_transformer_eval")) {
    SCOPED_TRACE(c.dtype);
    expect_transformer_case(c);
  }
}

TEST(V1Fixtures, TransformerDecodesStepByStepAsTheBook) {
  for (const auto& c : both_dtypes("v1_transformer_eval")) {
    SCOPED_TRACE(c.dtype);
    Transformer t(c);
    torch::NoGradGuard no_grad;
    const auto dec_X = c["dec_X"], lens = c["enc_valid_lens"];
    auto state = t.decoder->init_state(t.encoder->forward(c["enc_X"], lens), lens);
    const int64_t blks = t.decoder->num_blks;
    std::vector<torch::Tensor> outputs;
    std::vector<std::vector<torch::Tensor>> cross(static_cast<size_t>(blks));
    for (int64_t step = 0; step < dec_X.size(1); ++step) {
      torch::Tensor Y;
      std::tie(Y, state) = t.decoder->forward(dec_X.slice(1, step, step + 1), state);
      outputs.push_back(Y);
      const auto weights = t.decoder->attention_weights();
      for (int64_t i = 0; i < blks; ++i) {
        EXPECT_TRUE(c.close(
            weights[0][i],
            "stepwise.dec_self_weights." + std::to_string(step) + "." + std::to_string(i), 4));
        cross[i].push_back(weights[1][i]);
      }
    }
    EXPECT_TRUE(c.close(torch::cat(outputs, 1), "stepwise.output", 4));
    for (int64_t i = 0; i < blks; ++i) {
      const auto b = std::to_string(i);
      EXPECT_TRUE(c.close(state.key_values[i], "stepwise.key_values." + b, 4));
      EXPECT_TRUE(c.close(torch::cat(cross[i], 1), "stepwise.dec_cross_weights." + b, 4));
    }
  }
}

TEST(V1Fixtures, AnEditionZeroSeventeenTransformerFileLoadsAndGivesItsOutput) {
  // 0.17's Transformer has 1.0's keys; at key_size = query_size = value_size
  // = num_hiddens its weights fit 1.0's classes and compute the same.
  for (const char* version : {"torch113", "torch211"}) {
    SCOPED_TRACE(version);
    const auto name = std::string("state_transformer_") + version;
    const auto f = load_fixture(name);
    d2l::v1::EncoderDecoder model(d2l::v1::TransformerEncoder(7, 8, 12, 2, 2, 0.1),
                                  d2l::v1::TransformerDecoder(7, 8, 12, 2, 2, 0.1));
    d2l::load_state_dict(*model, d2l::testing::fixture_path(name + ".pt"));
    model->eval();
    torch::NoGradGuard no_grad;
    const auto output = model(f.tensor("enc_X"), f.tensor("dec_X"), f.tensor("enc_valid_lens"));
    EXPECT_LT(d2l::testing::max_rel_error(output, f.tensor("output")), 1e-5);
  }
}

TEST(V1Fixtures, WhatWeSaveIsWhatPythonVerified) {
  // tests/fixtures/generate_fixtures_v1.py --verify-cpp loads this file into
  // the book's (lazy) Transformer, strictly, and gets the case's output.
  const Case c("v1_transformer_eval", "float32");
  Transformer t(c);
  std::ostringstream bytes;
  d2l::save_state_dict(*t.model, bytes);
  d2l::testing::v1::expect_committed_bytes("v1_cpp_transformer.pt", bytes.str());
  std::istringstream back(bytes.str());
  EXPECT_EQ(file_keys(c.pt()), parameter_keys(*t.model));
  const auto entries = d2l::read_state_dict(back);
  ASSERT_EQ(entries.size(), t.model->named_parameters().size());
  for (const auto& [key, value] : entries) {
    EXPECT_TRUE(torch::equal(value, t.model->named_parameters()[key])) << key;
  }
  if (d2l::testing::v1::writing_state_fixtures()) {
    GTEST_SKIP() << "D2L_WRITE_STATE_FIXTURES: rewrote v1_cpp_transformer.pt; verify it with "
                    "`make fixtures` (generate_fixtures_v1.py --verify-cpp)";
  }
}

}  // namespace
