// LibTorch's masks in the Transformer (AttentionMask): the encoder's source
// mask through every block, the decoder's encoder-decoder attention masked by
// it, the causal flag of evaluation mode, and the errors for bad masks.

#include <d2l/transformer.h>

#include <gmock/gmock.h>

#include <cmath>
#include <limits>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kMaskVocab = 17, kMaskHiddens = 8, kMaskHeads = 2, kMaskLayers = 2;

d2l::TransformerBlockOptions mask_block(bool causal = false) {
  return d2l::TransformerBlockOptions(kMaskHiddens, kMaskHiddens, kMaskHiddens, kMaskHiddens,
                                      {kMaskHiddens}, kMaskHiddens, 16, kMaskHeads)
      .causal(causal);
}

d2l::TransformerEncoder mask_encoder(torch::ScalarType dtype = torch::kFloat) {
  torch::manual_seed(21);
  d2l::TransformerEncoder e(d2l::TransformerOptions(kMaskVocab, mask_block(), kMaskLayers));
  e->to(dtype);
  e->eval();
  return e;
}

d2l::TransformerDecoder mask_decoder(bool causal, torch::ScalarType dtype = torch::kFloat) {
  torch::manual_seed(22);
  d2l::TransformerDecoder d(d2l::TransformerOptions(kMaskVocab, mask_block(causal), kMaskLayers));
  d->to(dtype);
  d->eval();
  return d;
}

// Padding after each entry's length: true at the keys past it.
torch::Tensor padding_of(const torch::Tensor& lens, int64_t m) {
  return torch::arange(m).unsqueeze(0) >= lens.unsqueeze(1);
}

TEST(TransformerMasks, EncoderKeyPaddingMaskEqualsTheEquivalentLengths) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto encoder = mask_encoder(dtype);
    const auto X = torch::randint(kMaskVocab, {3, 6}, torch::kLong);
    const auto lens = torch::tensor({6, 2, 4});
    const auto by_lens = encoder->forward(X, lens).outputs;
    const auto weights = encoder->attention_weights();
    const auto by_mask =
        encoder->forward_masked(X, d2l::AttentionMask().key_padding_mask(padding_of(lens, 6)))
            .outputs;
    EXPECT_LT(max_rel_error(by_mask, by_lens), dtype == torch::kFloat ? 1e-6 : 1e-13);
    const auto mask_weights = encoder->attention_weights();
    for (size_t i = 0; i < weights.size(); ++i) {
      EXPECT_LT(max_rel_error(mask_weights[i], weights[i]), 1e-6) << "block " << i;
    }
    // And the lengths through the mask-taking call are forward(X, lens).
    EXPECT_TRUE(torch::equal(
        encoder->forward_masked(X, d2l::AttentionMask().valid_lens(lens)).outputs, by_lens));
    // A mask that masks something gives other numbers.
    EXPECT_GT(max_rel_error(encoder->forward(X).outputs, by_lens), 1e-3);
  }
}

// The book's multi-head attention with a boolean mask (true: may not attend),
// written with ATen's ops only.
torch::Tensor reference_masked_mha(const d2l::MultiHeadAttentionImpl& m, const torch::Tensor& X,
                                   const torch::Tensor& blocked) {
  const int64_t heads = m.options.num_heads();
  const auto split = [&](const torch::Tensor& W) {
    return d2l::transpose_qkv(torch::matmul(X, W.t()), heads);
  };
  const auto q = split(m.W_q->weight), k = split(m.W_k->weight), v = split(m.W_v->weight);
  const auto scores = torch::bmm(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(q.size(2)));
  const auto weights =
      torch::softmax(scores.masked_fill(blocked, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(d2l::transpose_output(torch::bmm(weights, v), heads), m.W_o->weight.t());
}

TEST(TransformerMasks, EncoderAttnMaskThatIsNotAPrefixEqualsTheCompositeReference) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto encoder = mask_encoder(dtype);
    const int64_t n = 7;
    const auto X = torch::randint(kMaskVocab, {2, n}, torch::kLong);
    auto blocked = torch::rand({n, n}) < 0.5;
    blocked.fill_diagonal_(false);  // every query sees at least itself
    blocked[0][n - 1] = false;
    blocked[0][n - 2] = true;  // row 0 is no prefix
    const auto out = encoder->forward_masked(X, d2l::AttentionMask().attn_mask(blocked)).outputs;
    torch::NoGradGuard no_grad;
    auto H = encoder->pos_encoding(encoder->embedding(X) * std::sqrt(double(kMaskHiddens)));
    for (int64_t i = 0; i < kMaskLayers; ++i) {
      auto b = encoder->block(i);
      const auto Y = b->addnorm1(H, reference_masked_mha(*b->attention, H, blocked));
      H = b->addnorm2(Y, b->ffn(Y));
    }
    EXPECT_LT(max_rel_error(out, H), dtype == torch::kFloat ? 1e-5 : 1e-12);
  }
}

// The decoder's outputs for `tokens`, one call a token.
torch::Tensor step_by_step(d2l::TransformerDecoder& decoder, d2l::DecoderState state,
                           const torch::Tensor& tokens) {
  std::vector<torch::Tensor> outputs;
  for (int64_t t = 0; t < tokens.size(1); ++t) {
    torch::Tensor Y;
    std::tie(Y, state) = decoder->forward(tokens.slice(1, t, t + 1), state);
    outputs.push_back(Y);
  }
  return torch::cat(outputs, 1);
}

// The decoder's blocks on H (B, n, h) from `state`: all of it in one call,
// or one step a call.
torch::Tensor through_blocks(d2l::TransformerDecoder& decoder, d2l::DecoderState state,
                             const torch::Tensor& H, bool step_by_step) {
  if (!step_by_step) {
    auto X = H;
    for (int64_t i = 0; i < kMaskLayers; ++i) std::tie(X, state) = decoder->block(i)(X, state);
    return X;
  }
  std::vector<torch::Tensor> outputs;
  for (int64_t t = 0; t < H.size(1); ++t) {
    auto X = H.narrow(1, t, 1);
    for (int64_t i = 0; i < kMaskLayers; ++i) std::tie(X, state) = decoder->block(i)(X, state);
    outputs.push_back(X);
  }
  return torch::cat(outputs, 1);
}

TEST(TransformerMasks, CausalDecoderInEvaluationEqualsDecodingStepByStep) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto encoder = mask_encoder(dtype);
    auto decoder = mask_decoder(/*causal=*/true, dtype);
    const auto src = torch::randint(kMaskVocab, {3, 5}, torch::kLong);
    const auto lens = torch::tensor({5, 2, 3});
    const auto state = decoder->init_state(encoder->forward(src, lens), lens);
    const double tol = dtype == torch::kFloat ? 2e-5 : 1e-12;
    // The blocks (the book's decoder adds positions 0, 1, ... at every call,
    // so one token a call gets position 0: below the embedding, the blocks
    // see the same inputs either way). With autograd, the book's path; without,
    // the cache.
    const auto H = torch::randn({3, 6, kMaskHiddens}, torch::TensorOptions().dtype(dtype));
    for (const bool grad : {true, false}) {
      torch::AutoGradMode mode(grad);
      const auto whole = through_blocks(decoder, state, H, false);
      const auto steps = through_blocks(decoder, state, H, true);
      EXPECT_LT(max_rel_error(whole, steps), tol) << "autograd " << grad;
      // After a prefix decoded step by step, the rest at once.
      auto prefix_state = state;
      auto X = H.narrow(1, 0, 2);
      for (int64_t t = 0; t < 2; ++t) {
        auto x = H.narrow(1, t, 1);
        for (int64_t i = 0; i < kMaskLayers; ++i) {
          std::tie(x, prefix_state) = decoder->block(i)(x, prefix_state);
        }
      }
      const auto rest = through_blocks(decoder, prefix_state, H.narrow(1, 2, 4), false);
      EXPECT_LT(max_rel_error(rest, steps.narrow(1, 2, 4)), tol) << "autograd " << grad;
    }
    // The whole decoder: a target's first tokens do not see its later ones.
    torch::NoGradGuard no_grad;
    const auto tgt = torch::randint(kMaskVocab, {3, 6}, torch::kLong);
    const auto whole = std::get<0>(decoder->forward(tgt, state));
    const auto first = std::get<0>(decoder->forward(tgt.narrow(1, 0, 3), state));
    EXPECT_LT(max_rel_error(whole.narrow(1, 0, 3), first), tol);
  }
}

TEST(TransformerMasks, TheBooksDecoderInEvaluationSeesTheFuture) {
  // Without the flag (the book), the first token of a whole target sees the
  // later ones: it differs from the same token decoded alone.
  auto encoder = mask_encoder();
  auto decoder = mask_decoder(/*causal=*/false);
  torch::NoGradGuard no_grad;
  const auto src = torch::randint(kMaskVocab, {2, 4}, torch::kLong);
  const auto state = decoder->init_state(encoder->forward(src));
  const auto tgt = torch::randint(kMaskVocab, {2, 5}, torch::kLong);
  const auto whole = std::get<0>(decoder->forward(tgt, state));
  const auto alone = std::get<0>(decoder->forward(tgt.narrow(1, 0, 1), state));
  EXPECT_GT(max_rel_error(whole.narrow(1, 0, 1), alone), 1e-3);
}

TEST(TransformerMasks, CausalTrainingIsTheBooksMask) {
  auto book = mask_decoder(false), causal = mask_decoder(true);
  book->train();
  causal->train();
  auto encoder = mask_encoder();
  const auto src = torch::randint(kMaskVocab, {2, 4}, torch::kLong);
  const auto tgt = torch::randint(kMaskVocab, {2, 5}, torch::kLong);
  const auto enc = encoder->forward(src);
  EXPECT_TRUE(torch::equal(std::get<0>(book->forward(tgt, book->init_state(enc))),
                           std::get<0>(causal->forward(tgt, causal->init_state(enc)))));
  EXPECT_THAT(d2l::testing::printed(*causal->block(0)), HasSubstr("causal=true"));
}

TEST(TransformerMasks, DecoderSourceKeyPaddingMaskEqualsTheEquivalentLengths) {
  auto encoder = mask_encoder(torch::kDouble);
  auto decoder = mask_decoder(false, torch::kDouble);
  const auto src = torch::randint(kMaskVocab, {3, 5}, torch::kLong);
  const auto lens = torch::tensor({5, 1, 3});
  const auto mask = d2l::AttentionMask().key_padding_mask(padding_of(lens, 5));
  const auto tgt = torch::randint(kMaskVocab, {3, 4}, torch::kLong);
  const auto by_lens = decoder->init_state(encoder->forward(src, lens), lens);
  const auto by_mask = decoder->init_state(encoder->forward_masked(src, mask), mask);
  EXPECT_TRUE(by_mask.enc_key_padding_mask.defined());
  EXPECT_FALSE(by_mask.enc_valid_lens.defined());
  for (const bool grad : {true, false}) {  // the book's path, then the cache
    torch::AutoGradMode mode(grad);
    const auto expected = step_by_step(decoder, by_lens, tgt);
    const auto expected_weights = decoder->attention_weights();
    EXPECT_LT(max_rel_error(step_by_step(decoder, by_mask, tgt), expected), 1e-12) << grad;
    EXPECT_LT(max_rel_error(decoder->attention_weights(), expected_weights), 1e-12) << grad;
  }
}

TEST(TransformerMasks, BadMasksNameTheFunctionTheArgumentAndTheShapes) {
  auto encoder = mask_encoder();
  const auto X = torch::randint(kMaskVocab, {2, 4}, torch::kLong);
  const std::string enc = "d2l::TransformerEncoder";
  const auto kpm = [&](const torch::Tensor& m) {
    return error_message(
        [&] { encoder->forward_masked(X, d2l::AttentionMask().key_padding_mask(m)); });
  };
  EXPECT_THAT(kpm(torch::zeros({2, 4})),
              AllOf(StartsWith(enc), HasSubstr("key_padding_mask"), HasSubstr("Float")));
  EXPECT_THAT(kpm(torch::zeros({2, 4, 1}, torch::kBool)),
              AllOf(StartsWith(enc), HasSubstr("key_padding_mask"), HasSubstr("[2, 4, 1]")));
  EXPECT_THAT(kpm(torch::zeros({2, 5}, torch::kBool)),
              AllOf(StartsWith(enc), HasSubstr("key_padding_mask"), HasSubstr("[2, 5]")));
  EXPECT_THAT(kpm(torch::zeros({}, torch::kBool)),
              AllOf(StartsWith(enc), HasSubstr("key_padding_mask"), HasSubstr("[]")));
  const auto attn = [&](const torch::Tensor& m) {
    return error_message([&] { encoder->forward_masked(X, d2l::AttentionMask().attn_mask(m)); });
  };
  EXPECT_THAT(attn(torch::zeros({4, 4}, torch::kInt)),
              AllOf(StartsWith(enc), HasSubstr("attn_mask"), HasSubstr("Int")));
  EXPECT_THAT(attn(torch::zeros({3, 4}, torch::kBool)),
              AllOf(StartsWith(enc), HasSubstr("attn_mask"), HasSubstr("[3, 4]")));
  EXPECT_THAT(attn(torch::zeros({}, torch::kBool)),
              AllOf(StartsWith(enc), HasSubstr("attn_mask"), HasSubstr("[]")));
  EXPECT_THAT(attn(torch::zeros({1, 2, 4, 4}, torch::kBool)),
              AllOf(StartsWith(enc), HasSubstr("attn_mask"), HasSubstr("[1, 2, 4, 4]")));
  EXPECT_THAT(error_message([&] {
                encoder->forward_masked(X, d2l::AttentionMask().valid_lens(torch::ones({2, 4})));
              }),
              AllOf(StartsWith(enc), HasSubstr("valid_lens")));
  if (torch::cuda::is_available()) {
    EXPECT_THAT(kpm(torch::zeros({2, 4}, torch::kBool).cuda()),
                AllOf(StartsWith(enc), HasSubstr("key_padding_mask"), HasSubstr("cuda")));
  }
  // The decoder's: the mask given to init_state, and a state altered later.
  auto decoder = mask_decoder(false);
  const auto out = encoder->forward(X);
  const std::string init = "d2l::TransformerDecoder::init_state";
  EXPECT_THAT(error_message([&] {
                decoder->init_state(
                    out, d2l::AttentionMask().key_padding_mask(torch::zeros({2, 3}, torch::kBool)));
              }),
              AllOf(StartsWith(init), HasSubstr("enc_key_padding_mask"), HasSubstr("[2, 3]"),
                    HasSubstr("[2, 4, 8]")));
  EXPECT_THAT(error_message([&] {
                decoder->init_state(
                    out, d2l::AttentionMask().key_padding_mask(torch::zeros({2, 4}, torch::kLong)));
              }),
              AllOf(StartsWith(init), HasSubstr("enc_key_padding_mask"), HasSubstr("Long")));
  auto state = decoder->init_state(out);
  state.enc_key_padding_mask = torch::zeros({4}, torch::kBool);
  EXPECT_THAT(error_message([&] { decoder->forward(X, state); }),
              AllOf(StartsWith("d2l::TransformerDecoder"), HasSubstr("state.enc_key_padding_mask"),
                    HasSubstr("[4]")));
}

}  // namespace
