// The training side of d2l's sequence-to-sequence sections: the masked loss
// and BLEU against the book's published numbers, gradient clipping, greedy
// prediction with attention weights, and a few steps of train_seq2seq on the
// shipped fra-eng sample (its loss curve: test_loss_curve.cpp), in float32
// and in bfloat16.

#include <d2l/attention.h>
#include <d2l/train.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using ::testing::HasSubstr;

const std::string kTrainSample = D2L_NMT_DATA_DIR "/fra-eng-sample";

TEST(MaskedSoftmaxCELoss, TheBooksExample) {
  // loss(torch.ones(3, 4, 10), torch.ones((3, 4), dtype=torch.long),
  //      torch.tensor([4, 2, 0])) -> tensor([2.3026, 1.1513, 0.0000])
  d2l::MaskedSoftmaxCELoss loss;
  const auto l =
      loss(torch::ones({3, 4, 10}), torch::ones({3, 4}, torch::kLong), torch::tensor({4, 2, 0}));
  EXPECT_TRUE(
      torch::allclose(l, torch::tensor({std::log(10.0), std::log(10.0) / 2, 0.0}, torch::kFloat)));
  EXPECT_EQ(d2l::testing::printed(*loss), "d2l::MaskedSoftmaxCELoss()");
}

TEST(MaskedSoftmaxCELoss, AgainstAHandComputation) {
  // One sequence of 2 steps over 3 tokens, the second step masked.
  const auto pred =
      torch::tensor({1.0, 2.0, 3.0, 0.5, 0.5, 0.5}, torch::kDouble).reshape({1, 2, 3});
  const auto label = torch::tensor({2, 0}, torch::kLong).reshape({1, 2});
  const double first = -std::log(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
  const auto l = d2l::MaskedSoftmaxCELoss()(pred, label, torch::tensor({1}));
  EXPECT_NEAR(l.item<double>(), first / 2, 1e-12);
}

TEST(MaskedSoftmaxCELoss, LabelsOutsideTheVocabularyAndBadShapes) {
  d2l::MaskedSoftmaxCELoss loss;
  EXPECT_THAT(
      error_message([&] {
        loss(torch::zeros({1, 2, 5}), torch::tensor({{1, 7}}), torch::tensor({2}));
      }),
      HasSubstr("d2l::MaskedSoftmaxCELoss: label holds id 7, outside the vocabulary of size 5"));
  EXPECT_THAT(error_message([&] {
                loss(torch::zeros({1, 2, 5}), torch::tensor({{-1, 0}}), torch::tensor({2}));
              }),
              HasSubstr("id -1"));
  EXPECT_THAT(
      error_message([&] {
        loss(torch::zeros({1, 2, 5}), torch::zeros({1, 3}, torch::kLong), torch::tensor({2}));
      }),
      HasSubstr(
          "label must be an integer (batch, steps) tensor matching pred [1, 2, 5], got [1, 3]"));
}

TEST(GradClipping, ScalesTheGlobalNormDownToTheta) {
  torch::nn::Linear net(torch::nn::LinearOptions(1, 1));
  net->weight.mutable_grad() = torch::full({1, 1}, 3.0);
  net->bias.mutable_grad() = torch::full({1}, 4.0);
  d2l::grad_clipping(*net, 10);  // norm 5: left alone
  EXPECT_FLOAT_EQ(net->weight.grad().item<float>(), 3.0f);
  d2l::grad_clipping(*net, 1);
  EXPECT_FLOAT_EQ(net->weight.grad().item<float>(), 0.6f);
  EXPECT_FLOAT_EQ(net->bias.grad().item<float>(), 0.8f);
  EXPECT_THAT(error_message([&] { d2l::grad_clipping(*net, 0); }),
              HasSubstr("d2l::grad_clipping: theta must be positive, got 0"));
}

TEST(Bleu, TheBooksScores) {
  // The book's Bahdanau section: "he's calm ." => "il est riche .", bleu 0.658.
  EXPECT_NEAR(d2l::bleu("il est riche .", "il est calme .", 2), 0.658, 5e-4);
  EXPECT_DOUBLE_EQ(d2l::bleu("il est riche .", "il est calme .", 2),
                   std::sqrt(3.0 / 4.0) * std::pow(1.0 / 3.0, 0.25));
  EXPECT_DOUBLE_EQ(d2l::bleu("va !", "va !", 2), 1.0);
  EXPECT_DOUBLE_EQ(d2l::bleu("je suis chez moi .", "je suis chez moi .", 2), 1.0);
  // Brevity penalty exp(1 - 4/2), clipped n-gram counts.
  EXPECT_DOUBLE_EQ(d2l::bleu("a b", "a b c d", 1), std::exp(-1.0));
  EXPECT_DOUBLE_EQ(d2l::bleu("a a a", "a b c", 1), std::sqrt(1.0 / 3.0));
  EXPECT_EQ(d2l::bleu("a", "a b", 2), 0.0);
  EXPECT_THAT(error_message([] { d2l::bleu("a", "a", 0); }),
              HasSubstr("d2l::bleu: k must be positive"));
}

d2l::EncoderDecoder tiny_model(const d2l::Vocab& src, const d2l::Vocab& tgt, bool attention) {
  d2l::Seq2SeqEncoder encoder(src.size(), 8, 8, 2, 0.1);
  const auto options = d2l::Seq2SeqOptions(tgt.size(), 8, 8, 2).dropout(0.1);
  if (attention) return d2l::EncoderDecoder(encoder, d2l::Seq2SeqAttentionDecoder(options));
  return d2l::EncoderDecoder(encoder, d2l::Seq2SeqDecoder(options));
}

TEST(PredictSeq2Seq, AttentionWeightsOfEveryStep) {
  torch::manual_seed(0);
  auto data = d2l::load_data_nmt(kTrainSample, 8, 10, 40);
  auto net = tiny_model(data.src_vocab, data.tgt_vocab, true);
  const auto [translation, weights] =
      d2l::predict_seq2seq(*net, "Go .", data.src_vocab, data.tgt_vocab, 10, torch::kCPU,
                           /*save_attention_weights=*/true);
  std::istringstream in(translation);
  int64_t words = 0;
  for (std::string w; in >> w;) ++words;
  ASSERT_FALSE(weights.empty());
  // One tensor a step: every predicted token, plus the <eos> step unless all
  // num_steps were used.
  EXPECT_TRUE(static_cast<int64_t>(weights.size()) == words + 1 || weights.size() == 10u);
  for (const auto& w : weights) {
    ASSERT_EQ(w.sizes(), torch::IntArrayRef({1, 10}));
    EXPECT_NEAR(w.sum().item<double>(), 1.0, 1e-5);
    // "go . <eos>": the padding after the 3 valid steps gets no attention.
    EXPECT_EQ(w.slice(1, 3).abs().sum().item<double>(), 0.0);
  }
  const auto [again, none] =
      d2l::predict_seq2seq(*net, "Go .", data.src_vocab, data.tgt_vocab, 10, torch::kCPU);
  EXPECT_EQ(again, translation);
  EXPECT_TRUE(none.empty());
}

TEST(PredictSeq2Seq, WeightsNeedAnAttentionDecoder) {
  auto data = d2l::load_data_nmt(kTrainSample, 8, 10, 40);
  auto net = tiny_model(data.src_vocab, data.tgt_vocab, false);
  EXPECT_THAT(error_message([&] {
                d2l::predict_seq2seq(*net, "go .", data.src_vocab, data.tgt_vocab, 10, torch::kCPU,
                                     true);
              }),
              HasSubstr("d2l::predict_seq2seq: save_attention_weights needs an AttentionDecoder"));
  EXPECT_THAT(error_message([&] {
                d2l::predict_seq2seq(*net, "go .", data.src_vocab, data.tgt_vocab, 0, torch::kCPU);
              }),
              HasSubstr("num_steps must be positive, got 0"));
}

// Through the module holder, as the book calls it.
TEST(TrainSeq2Seq, AFewEpochsOnTheSampleLowerTheLoss) {
  torch::manual_seed(0);
  auto data = d2l::load_data_nmt(kTrainSample, 8, 6, 20);
  auto net = tiny_model(data.src_vocab, data.tgt_vocab, true);
  const auto result = d2l::train_seq2seq(net, data.data_iter, 0.005, 6, data.tgt_vocab, torch::kCPU,
                                         d2l::TrainSeq2SeqOptions().on_step(nullptr));
  ASSERT_EQ(result.losses.size(), 6u);
  EXPECT_LT(result.losses.back(), result.losses.front());
  EXPECT_EQ(result.loss, result.losses.back());
  EXPECT_GT(result.tokens_per_sec, 0);
  // The holder's predict_seq2seq is the module's.
  const auto by_holder =
      d2l::predict_seq2seq(net, "go .", data.src_vocab, data.tgt_vocab, 6, torch::kCPU).first;
  EXPECT_EQ(
      by_holder,
      d2l::predict_seq2seq(*net, "go .", data.src_vocab, data.tgt_vocab, 6, torch::kCPU).first);
  EXPECT_THAT(error_message([&] {
                d2l::train_seq2seq(*net, data.data_iter, 0.005, 0, data.tgt_vocab, torch::kCPU);
              }),
              HasSubstr("d2l::train_seq2seq: num_epochs must be positive, got 0"));
  EXPECT_THAT(error_message([&] {
                d2l::train_seq2seq(d2l::EncoderDecoder(nullptr), data.data_iter, 0.005, 1,
                                   data.tgt_vocab, torch::kCPU);
              }),
              HasSubstr("d2l::train_seq2seq: net is an empty EncoderDecoder holder"));
}

// The book's Transformer, small, on a slice of the sample.
d2l::EncoderDecoder tiny_transformer(const d2l::Vocab& src, const d2l::Vocab& tgt) {
  return d2l::EncoderDecoder(
      d2l::TransformerEncoder(src.size(), 16, 16, 16, 16, {16}, 16, 32, 2, 2, 0.1),
      d2l::TransformerDecoder(tgt.size(), 16, 16, 16, 16, {16}, 16, 32, 2, 2, 0.1));
}

struct DtypeRun {
  d2l::TrainSeq2SeqResult result;
  std::set<torch::Dtype> while_training, after;
  bool finite = true;
  // Whether some weight holds more than bfloat16's 8 bits.
  bool wider_than_bfloat16 = false;
};

DtypeRun train_tiny_transformer(const d2l::TrainSeq2SeqOptions& options, int64_t epochs) {
  torch::manual_seed(0);
  auto data = d2l::load_data_nmt(kTrainSample, 16, 6, 96);
  auto net = tiny_transformer(data.src_vocab, data.tgt_vocab);
  DtypeRun run;
  auto seen = options;
  seen.on_step([&](const d2l::StepStats&) {
    for (const auto& p : net->parameters()) run.while_training.insert(p.scalar_type());
  });
  run.result =
      d2l::train_seq2seq(net, data.data_iter, 0.005, epochs, data.tgt_vocab, torch::kCPU, seen);
  for (const auto& p : net->parameters()) {
    run.after.insert(p.scalar_type());
    run.finite = run.finite && torch::isfinite(p).all().item<bool>();
    run.wider_than_bfloat16 =
        run.wider_than_bfloat16 || !torch::equal(p, p.to(torch::kBFloat16).to(p.scalar_type()));
  }
  return run;
}

using Dtypes = std::set<torch::Dtype>;

// From the same seed, bfloat16 follows float32's loss (the same Xavier draw
// and batches; dropout masks drawn alike).
TEST(TrainSeq2SeqBFloat16, MixedPrecisionLowersTheLossAndEndsOnTheMasterWeights) {
  const auto run = train_tiny_transformer(
      d2l::TrainSeq2SeqOptions().on_step(nullptr).dtype(torch::kBFloat16), 5);
  EXPECT_EQ(run.while_training, Dtypes{torch::kBFloat16});
  EXPECT_EQ(run.after, Dtypes{torch::kFloat});
  EXPECT_TRUE(run.finite);
  EXPECT_TRUE(run.wider_than_bfloat16);
  ASSERT_EQ(run.result.losses.size(), 5u);
  for (double l : run.result.step_losses) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(run.result.losses.back(), 0.8 * run.result.losses.front());
  const auto float32 = train_tiny_transformer(d2l::TrainSeq2SeqOptions().on_step(nullptr), 5);
  EXPECT_NEAR(run.result.losses.back(), float32.result.losses.back(),
              0.05 * float32.result.losses.back());
}

TEST(TrainSeq2SeqBFloat16, WithoutMasterWeightsTheNetStaysBFloat16) {
  const auto run = train_tiny_transformer(
      d2l::TrainSeq2SeqOptions().on_step(nullptr).dtype(torch::kBFloat16).master_weights(false), 5);
  EXPECT_EQ(run.while_training, Dtypes{torch::kBFloat16});
  EXPECT_EQ(run.after, Dtypes{torch::kBFloat16});
  EXPECT_TRUE(run.finite);
  EXPECT_LT(run.result.losses.back(), 0.8 * run.result.losses.front());
}

TEST(TrainSeq2SeqBFloat16, Float64StaysAndUnsetKeepsTheNetsDtype) {
  const auto wide =
      train_tiny_transformer(d2l::TrainSeq2SeqOptions().on_step(nullptr).dtype(torch::kDouble), 1);
  EXPECT_EQ(wide.while_training, Dtypes{torch::kDouble});
  EXPECT_EQ(wide.after, Dtypes{torch::kDouble});
  const auto as_built = train_tiny_transformer(d2l::TrainSeq2SeqOptions().on_step(nullptr), 1);
  EXPECT_EQ(as_built.while_training, Dtypes{torch::kFloat});
  EXPECT_EQ(as_built.after, Dtypes{torch::kFloat});
}

// An exception from a callback ends the training; the net still gets its
// float32 master weights.
TEST(TrainSeq2SeqBFloat16, AnExceptionLeavesTheMasterWeights) {
  torch::manual_seed(0);
  auto data = d2l::load_data_nmt(kTrainSample, 16, 6, 48);
  auto net = tiny_transformer(data.src_vocab, data.tgt_vocab);
  const auto stop = [](const d2l::StepStats& s) {
    if (s.batch == 2) throw std::runtime_error("stop");
  };
  EXPECT_THROW(d2l::train_seq2seq(net, data.data_iter, 0.005, 3, data.tgt_vocab, torch::kCPU,
                                  d2l::TrainSeq2SeqOptions().on_step(stop).dtype(torch::kBFloat16)),
               std::runtime_error);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
}

TEST(TrainSeq2SeqBFloat16, DtypesItCannotTrainIn) {
  auto data = d2l::load_data_nmt(kTrainSample, 8, 6, 16);
  auto net = tiny_transformer(data.src_vocab, data.tgt_vocab);
  const auto train = [&](torch::Dtype dtype) {
    d2l::train_seq2seq(net, data.data_iter, 0.005, 1, data.tgt_vocab, torch::kCPU,
                       d2l::TrainSeq2SeqOptions().on_step(nullptr).dtype(dtype));
  };
  EXPECT_THAT(error_message([&] { train(torch::kHalf); }),
              HasSubstr("d2l::train_seq2seq: dtype must be float32, float64 or bfloat16, got Half "
                        "(float16 needs loss scaling, which this loop does not do)"));
  EXPECT_THAT(
      error_message([&] { train(torch::kLong); }),
      HasSubstr("d2l::train_seq2seq: dtype must be float32, float64 or bfloat16, got Long"));
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
}

}  // namespace
