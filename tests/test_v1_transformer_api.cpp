// d2l 1.0's Transformer as a reader of the book writes it: the book's lines
// and shapes, lazy widths (an optimizer built before the first batch trains
// the parameters; another width afterwards is an error), copies, and what
// the modules refuse.

#include <d2l/lazy.h>
#include <d2l/v1.h>

#include <gmock/gmock.h>

#include <map>
#include <string>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<int64_t> shape(const torch::Tensor& t) { return t.sizes().vec(); }

TEST(V1Transformer, TheBooksLinesGiveTheBooksShapes) {
  auto ffn = d2l::v1::PositionWiseFFN(4, 8);
  ffn->eval();
  EXPECT_EQ(shape(ffn(torch::ones({2, 3, 4}))[0]), (std::vector<int64_t>{3, 8}));

  auto add_norm = d2l::v1::AddNorm(4, 0.5);
  EXPECT_EQ(shape(add_norm(torch::ones({2, 3, 4}), torch::ones({2, 3, 4}))),
            (std::vector<int64_t>{2, 3, 4}));

  const auto X = torch::ones({2, 100, 24});
  const auto valid_lens = torch::tensor({3, 2});
  auto encoder_blk = d2l::v1::TransformerEncoderBlock(24, 48, 8, 0.5);
  encoder_blk->eval();
  EXPECT_EQ(encoder_blk(X, valid_lens).sizes(), X.sizes());

  auto encoder = d2l::v1::TransformerEncoder(200, 24, 48, 8, 2, 0.5);
  EXPECT_EQ(shape(encoder(torch::ones({2, 100}, torch::kLong), valid_lens).outputs),
            (std::vector<int64_t>{2, 100, 24}));

  auto decoder_blk = d2l::v1::TransformerDecoderBlock(24, 48, 8, 0.5, 0);
  d2l::DecoderState state;  // the book's [encoder_blk(X, valid_lens), valid_lens, [None]]
  state.enc_outputs = encoder_blk(X, valid_lens);
  state.enc_valid_lens = valid_lens;
  state.key_values = {torch::Tensor()};
  EXPECT_EQ(std::get<0>(decoder_blk(X, state)).sizes(), X.sizes());

  // The section's training set-up, with its (small) sizes.
  auto decoder = d2l::v1::TransformerDecoder(201, 24, 48, 8, 2, 0.5);
  d2l::v1::Seq2Seq model(encoder, decoder, /*tgt_pad=*/0, /*lr=*/0.001);
  const auto logits =
      model(torch::ones({2, 9}, torch::kLong), torch::ones({2, 9}, torch::kLong), valid_lens);
  EXPECT_EQ(shape(logits), (std::vector<int64_t>{2, 9, 201}));
  EXPECT_EQ(shape(encoder->attention_weights()[1]), (std::vector<int64_t>{16, 9, 9}));
  EXPECT_EQ(decoder->attention_weights()[1].size(), 2u);
}

TEST(V1Transformer, KeysAreTheBooksFromConstruction) {
  d2l::v1::TransformerDecoder decoder(11, 16, 24, 4, 2, 0.0);
  EXPECT_TRUE(d2l::has_uninitialized_params(*decoder));
  const auto keys = d2l::testing::parameter_names(*decoder);
  EXPECT_EQ(keys.front(), "embedding.weight");
  EXPECT_THAT(keys, ::testing::Contains("blks.block1.attention2.W_v.weight"));
  EXPECT_THAT(keys, ::testing::Contains("blks.block0.addnorm3.ln.bias"));
  EXPECT_THAT(keys, ::testing::Contains("blks.block0.ffn.dense2.bias"));
  EXPECT_EQ(keys.back(), "dense.bias");
  EXPECT_THAT(keys, ::testing::Not(::testing::Contains("blks.block0.attention1.W_q.bias")));
  d2l::v1::TransformerEncoder biased(11, 16, 24, 4, 1, 0.0, /*use_bias=*/true);
  EXPECT_THAT(d2l::testing::parameter_names(*biased),
              ::testing::Contains("blks.block0.attention.W_o.bias"));
}

TEST(V1Transformer, AnOptimizerBuiltBeforeTheFirstBatchTrainsEveryParameter) {
  torch::manual_seed(3);
  d2l::v1::Seq2Seq model(d2l::v1::TransformerEncoder(13, 16, 32, 4, 2, 0.0),
                         d2l::v1::TransformerDecoder(13, 16, 32, 4, 2, 0.0), /*tgt_pad=*/0,
                         /*lr=*/0.01);
  auto optimizer = model->configure_optimizers();
  std::map<std::string, const void*> before;
  for (const auto& p : model->named_parameters()) before[p.key()] = p.value().unsafeGetTensorImpl();
  const auto enc_X = torch::randint(1, 13, {3, 6}, torch::kLong);
  const auto dec_X = torch::randint(1, 13, {3, 5}, torch::kLong);
  const auto Y = torch::randint(0, 13, {3, 5}, torch::kLong);
  const auto loss = model->loss(model(enc_X, dec_X, torch::tensor({6, 3, 4})), Y);
  optimizer->zero_grad();
  loss.backward();
  std::map<std::string, torch::Tensor> materialised;
  for (const auto& p : model->named_parameters())
    materialised[p.key()] = p.value().detach().clone();
  optimizer->step();
  EXPECT_FALSE(d2l::has_uninitialized_params(*model));
  const auto& held = optimizer->param_groups()[0].params();
  ASSERT_EQ(held.size(), before.size());
  size_t i = 0;
  for (const auto& p : model->named_parameters()) {
    EXPECT_EQ(p.value().unsafeGetTensorImpl(), before[p.key()]) << p.key();
    EXPECT_EQ(held[i++].unsafeGetTensorImpl(), before[p.key()]) << p.key();
    EXPECT_GT(p.value().numel(), 0) << p.key();
    EXPECT_FALSE(torch::equal(p.value().detach(), materialised[p.key()])) << p.key();
  }
}

TEST(V1Transformer, ToBeforeTheFirstBatchMaterialisesInThatDtype) {
  d2l::v1::TransformerEncoder encoder(11, 16, 24, 4, 2, 0.0);
  encoder->to(torch::kFloat64);
  const auto out = encoder(torch::randint(11, {2, 5}, torch::kLong)).outputs;
  EXPECT_EQ(out.scalar_type(), torch::kFloat64);
  for (const auto& p : encoder->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat64);
}

TEST(V1Transformer, ClonesAreDeepAndComputeTheSame) {
  d2l::v1::EncoderDecoder model(d2l::v1::TransformerEncoder(11, 16, 24, 4, 2, 0.1),
                                d2l::v1::TransformerDecoder(11, 16, 24, 4, 2, 0.1));
  model->eval();
  const auto enc_X = torch::randint(11, {2, 5}, torch::kLong);
  const auto dec_X = torch::randint(11, {2, 4}, torch::kLong);
  const auto y = model(enc_X, dec_X);
  auto copy = std::dynamic_pointer_cast<d2l::v1::EncoderDecoderImpl>(model->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_TRUE(torch::equal(copy->forward(enc_X, dec_X), y));
  EXPECT_NE(copy->named_parameters()["decoder.dense.weight"].data_ptr(),
            model->named_parameters()["decoder.dense.weight"].data_ptr());
  d2l::v1::Seq2Seq seq2seq(d2l::v1::TransformerEncoder(11, 16, 24, 4, 1, 0.0),
                           d2l::v1::TransformerDecoder(11, 16, 24, 4, 1, 0.0), 0, 0.1);
  EXPECT_NE(std::dynamic_pointer_cast<d2l::v1::Seq2SeqImpl>(seq2seq->clone()), nullptr);
}

TEST(V1Transformer, ALazyLayerRefusesAnotherWidthThroughItsBlock) {
  d2l::v1::PositionWiseFFN ffn(4, 8);
  ffn(torch::randn({2, 3, 4}));
  EXPECT_THAT(error_message([&] {
                ffn(torch::randn({2, 3, 5}));
              }),
              AllOf(HasSubstr("d2l::v1::PositionWiseFFN"), HasSubstr("X has 5 features"),
                    HasSubstr("[2, 3, 5]"), HasSubstr("fixed at 4")));

  // The cross-attention's keys take the encoder's width at the first call.
  d2l::v1::TransformerDecoderBlock block(16, 32, 4, 0.0, 0);
  d2l::DecoderState state;
  state.enc_outputs = torch::randn({2, 5, 16});
  state.key_values = {torch::Tensor()};
  block(torch::randn({2, 3, 16}), state);
  state.enc_outputs = torch::randn({2, 5, 12});
  EXPECT_THAT(error_message([&] {
                block(torch::randn({2, 3, 16}), state);
              }),
              AllOf(HasSubstr("d2l::v1::MultiHeadAttention"), HasSubstr("keys has 12 features"),
                    HasSubstr("fixed at 16")));
}

TEST(V1Transformer, BadInputIsRefusedBeforeAnyWidthIsFixed) {
  d2l::v1::TransformerEncoderBlock block(24, 48, 8, 0.5);
  EXPECT_THAT(error_message([&] {
                block(torch::randn({2, 5, 20}));
              }),
              AllOf(HasSubstr("d2l::v1::TransformerEncoderBlock"), HasSubstr("num_hiddens=24"),
                    HasSubstr("[2, 5, 20]")));
  EXPECT_TRUE(d2l::has_uninitialized_params(*block));

  EXPECT_THAT(error_message([] { d2l::v1::TransformerEncoderBlock(10, 20, 3, 0.1); }),
              HasSubstr("num_hiddens=10 must be a multiple of num_heads=3"));
  EXPECT_THAT(error_message([] { d2l::v1::TransformerDecoder(0, 16, 24, 4, 2, 0.1); }),
              AllOf(HasSubstr("d2l::v1::TransformerDecoder"), HasSubstr("vocab_size=0")));

  d2l::v1::TransformerEncoder encoder(11, 16, 24, 4, 2, 0.0);
  EXPECT_THAT(error_message([&] {
                encoder(torch::full({2, 3}, 11, torch::kLong));
              }),
              AllOf(HasSubstr("d2l::v1::TransformerEncoder"), HasSubstr("vocab_size=11")));
  EXPECT_THAT(error_message([&] {
                encoder(torch::zeros({2, 3}, torch::kLong), torch::tensor({1, 2, 3}));
              }),
              AllOf(HasSubstr("valid_lens"), HasSubstr("[3]")));

  d2l::v1::TransformerDecoder decoder(11, 16, 24, 4, 2, 0.0);
  d2l::EncoderOutput rnn_output{torch::randn({3, 2, 16}), torch::randn({1, 2, 16})};
  EXPECT_THAT(
      error_message([&] { decoder->init_state(rnn_output); }),
      AllOf(HasSubstr("d2l::v1::TransformerDecoder::init_state"), HasSubstr("an RNN encoder's?")));
  auto state = decoder->init_state(encoder(torch::zeros({2, 3}, torch::kLong)));
  state.key_values.pop_back();
  EXPECT_THAT(error_message([&] {
                decoder(torch::zeros({2, 1}, torch::kLong), state);
              }),
              HasSubstr("one entry per block (num_blks=2), got 1"));
}

}  // namespace
