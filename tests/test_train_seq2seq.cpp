// train_seq2seq against the book's own loop on fixed data (golden values from
// tests/fixtures/train_seq2seq_case.py), its timing fields, callbacks and
// progress bar,
// and predict_seq2seq's decoding loop on models whose weights spell out a
// known token sequence.

#include <d2l/attention.h>
#include <d2l/train.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "fixture.h"
#include "seq2seq_models.h"
#include "test_utils.h"

namespace {

using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

struct GoldenTrainRun {
  d2l::EncoderDecoder model{nullptr};
  d2l::TrainSeq2SeqResult result;
};

// The fixture's model and batches, trained by d2l::train_seq2seq after
// seeding LibTorch's generator as the Python script seeds torch's.
GoldenTrainRun train_like_the_fixture(const d2l::testing::Fixture& f,
                                      const d2l::TrainSeq2SeqOptions& options) {
  const auto size = [&](const char* name) { return static_cast<int64_t>(f.scalar(name)); };
  GoldenTrainRun run;
  run.model =
      d2l::testing::make_model(true, d2l::Seq2SeqOptions(size("vocab_size"), size("embed_size"),
                                                         size("num_hiddens"), size("num_layers"))
                                         .dropout(f.scalar("dropout")));
  run.model->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : run.model->named_parameters()) p.value().copy_(f.tensor("init." + p.key()));
  }
  d2l::ArrayLoader loader(
      {f.tensor("X"), f.tensor("X_valid_len"), f.tensor("Y"), f.tensor("Y_valid_len")},
      size("batch_size"), /*is_train=*/false);
  const d2l::Vocab tgt_vocab(std::vector<std::vector<std::string>>{}, 0,
                             {"<pad>", "<bos>", "<eos>"});
  EXPECT_EQ(tgt_vocab["<bos>"], size("bos"));
  torch::manual_seed(static_cast<uint64_t>(size("seed")));
  run.result = d2l::train_seq2seq(run.model, loader, f.scalar("lr"), size("num_epochs"), tgt_vocab,
                                  torch::kCPU, options);
  return run;
}

std::vector<double> as_double_vector(const torch::Tensor& t) {
  const auto c = t.to(torch::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Empty when this LibTorch draws `probe` (a fixture tensor) from the seeded
// generator as the torch that wrote the fixture did; else why not.
std::string stream_differs(const d2l::testing::Fixture& f, const char* probe) {
  const auto expected = f.tensor(std::string("probe.") + probe);
  torch::manual_seed(static_cast<uint64_t>(f.scalar("seed")));
  auto drawn = torch::empty_like(expected);
  if (std::string(probe) == "uniform") {
    drawn.uniform_(-1, 1);
  } else {
    drawn.bernoulli_(0.9);
  }
  if (torch::equal(drawn, expected)) return "";
  return std::string("this LibTorch's ") + probe +
         "_ draws other numbers from the same seed than the torch 1.13 that wrote the "
         "fixture (MKL builds draw dropout masks from another stream): the book's loop "
         "cannot be replayed";
}

// The loss of every step and epoch and every parameter after the last step
// equal those of the book's loop (Xavier draw, teacher forcing with <bos>,
// the masked loss, clipping, Adam, and dropout in training mode where the
// fixture has it): a label fed to the decoder unshifted, or a step that
// clips or averages differently, changes the first loss already.
void expect_the_books_loop(const std::string& name) {
  const auto f = d2l::testing::load_fixture(name);
  for (const char* probe : {"uniform", "bernoulli"}) {
    if (std::string(probe) == "bernoulli" && f.scalar("dropout") == 0) continue;
    const auto why = stream_differs(f, probe);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  const auto run = train_like_the_fixture(f, d2l::TrainSeq2SeqOptions().on_step(nullptr));
  const auto expected_steps = as_double_vector(f.tensor("step_losses"));
  const auto expected_epochs = as_double_vector(f.tensor("losses"));
  ASSERT_EQ(run.result.step_losses.size(), expected_steps.size());
  ASSERT_EQ(run.result.losses.size(), expected_epochs.size());
  for (size_t i = 0; i < expected_steps.size(); ++i) {
    EXPECT_NEAR(run.result.step_losses[i], expected_steps[i], 1e-10 * expected_steps[i])
        << "step " << i;
  }
  for (size_t i = 0; i < expected_epochs.size(); ++i) {
    EXPECT_NEAR(run.result.losses[i], expected_epochs[i], 1e-10 * expected_epochs[i])
        << "epoch " << i;
  }
  EXPECT_EQ(run.result.loss, run.result.losses.back());
  // Adam moves a parameter by about lr a step: the C++ loop started from the
  // book's Xavier draw, whatever the steps did.
  const double reach = f.scalar("lr") * static_cast<double>(expected_steps.size()) * 1.01;
  for (const auto& p : run.model->named_parameters()) {
    const auto moved = (p.value() - f.tensor("xavier." + p.key())).abs().max().item<double>();
    EXPECT_LE(moved, reach) << p.key() << ": not the book's Xavier draw";
    EXPECT_LT(max_rel_error(p.value(), f.tensor("trained." + p.key())), 1e-9) << p.key();
  }
}

TEST(TrainSeq2SeqGolden, TwoEpochsMatchTheBooksLoop) {
  expect_the_books_loop("train_seq2seq_float64");
}

TEST(TrainSeq2SeqGolden, TwoEpochsWithoutDropoutMatchTheBooksLoop) {
  expect_the_books_loop("train_seq2seq_nodropout_float64");
}

// The timing fields describe the last epoch: 6 examples and the fixture's
// tokens over its seconds.
TEST(TrainSeq2SeqGolden, EpochSecondsAndRatesDescribeEveryEpoch) {
  const auto f = d2l::testing::load_fixture("train_seq2seq_float64");
  const auto run = train_like_the_fixture(f, d2l::TrainSeq2SeqOptions().on_step(nullptr));
  const auto& r = run.result;
  ASSERT_EQ(r.epoch_seconds.size(), static_cast<size_t>(f.scalar("num_epochs")));
  for (double s : r.epoch_seconds) EXPECT_GT(s, 0);
  const double examples = static_cast<double>(f.tensor("X").size(0));
  const double tokens = f.tensor("Y_valid_len").sum().item<double>();
  EXPECT_DOUBLE_EQ(r.examples_per_sec, examples / r.epoch_seconds.back());
  EXPECT_DOUBLE_EQ(r.tokens_per_sec, tokens / r.epoch_seconds.back());
}

// Runs `fn` with stdout on a pseudo-terminal and returns what it wrote there.
template <typename Fn>
std::string stdout_on_a_terminal(Fn&& fn) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) return "no pty";
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  std::fflush(stdout);
  const int saved = ::dup(STDOUT_FILENO);
  ::dup2(slave, STDOUT_FILENO);
  fn();
  std::fflush(stdout);
  ::dup2(saved, STDOUT_FILENO);
  ::close(saved);
  ::close(slave);
  std::string text;
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  char buffer[4096];
  for (ssize_t n; (n = ::read(master, buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  ::close(master);
  return text;
}

// The default on_step draws the bar on a terminal, ending it with a newline
// before the book's line, and on_step(nullptr) draws nothing.
TEST(TrainSeq2SeqGolden, ProgressBarOnATerminalOnly) {
  const auto f = d2l::testing::load_fixture("train_seq2seq_float64");
  std::string with_bar, without_bar;
  with_bar = stdout_on_a_terminal([&] { train_like_the_fixture(f, d2l::TrainSeq2SeqOptions()); });
  if (with_bar == "no pty") GTEST_SKIP() << "no pseudo-terminal to show the progress bar on";
  without_bar = stdout_on_a_terminal(
      [&] { train_like_the_fixture(f, d2l::TrainSeq2SeqOptions().on_step(nullptr)); });
  EXPECT_THAT(with_bar, HasSubstr("\repoch    2/2 [########################] loss "));
  EXPECT_THAT(with_bar, ::testing::ContainsRegex("loss [0-9.]+ \r?\nloss [0-9.]+, "));
  EXPECT_THAT(with_bar, HasSubstr("tokens/sec on cpu"));
  EXPECT_THAT(without_bar, ::testing::Not(HasSubstr("epoch ")));
  EXPECT_THAT(without_bar, HasSubstr("tokens/sec on cpu"));
}

// on_step sees every step and on_epoch every epoch, with the numbers the
// result holds.
TEST(TrainSeq2SeqCallbacks, SeeEveryStepAndEpochAsTheResultHoldsThem) {
  const auto f = d2l::testing::load_fixture("train_seq2seq_float64");
  std::vector<d2l::StepStats> steps;
  std::vector<d2l::EpochStats> epochs;
  const auto run = train_like_the_fixture(
      f, d2l::TrainSeq2SeqOptions()
             .on_step([&](const d2l::StepStats& s) { steps.push_back(s); })
             .on_epoch([&](const d2l::EpochStats& e) { epochs.push_back(e); }));
  const auto& r = run.result;
  ASSERT_EQ(steps.size(), r.step_losses.size());
  ASSERT_EQ(epochs.size(), r.losses.size());
  const auto num_batches = static_cast<int64_t>(steps.size() / epochs.size());
  ASSERT_EQ(num_batches, 2);
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& s = steps[i];
    EXPECT_EQ(s.epoch, static_cast<int64_t>(i) / num_batches + 1) << "step " << i;
    EXPECT_EQ(s.batch, static_cast<int64_t>(i) % num_batches + 1) << "step " << i;
    EXPECT_EQ(s.num_epochs, 2);
    EXPECT_EQ(s.num_batches, num_batches);
    EXPECT_EQ(s.loss, r.step_losses[i]) << "step " << i;
    EXPECT_GE(s.seconds, 0);
    if (s.batch > 1) EXPECT_GE(s.seconds, steps[i - 1].seconds);
    // The epoch's running loss ends at the epoch's loss.
    if (s.batch == num_batches) EXPECT_DOUBLE_EQ(s.epoch_loss, r.losses[s.epoch - 1]);
  }
  EXPECT_EQ(steps.front().epoch_loss, steps.front().loss);
  for (size_t e = 0; e < epochs.size(); ++e) {
    EXPECT_EQ(epochs[e].epoch, static_cast<int64_t>(e) + 1);
    EXPECT_EQ(epochs[e].num_epochs, 2);
    EXPECT_EQ(epochs[e].loss, r.losses[e]);
    EXPECT_EQ(epochs[e].seconds, r.epoch_seconds[e]);
  }
  EXPECT_EQ(epochs.back().tokens_per_sec, r.tokens_per_sec);
  EXPECT_EQ(epochs.back().examples_per_sec, r.examples_per_sec);
}

// An exception from a callback ends the run where it was thrown.
TEST(TrainSeq2SeqCallbacks, AnExceptionFromACallbackEndsTheRun) {
  const auto f = d2l::testing::load_fixture("train_seq2seq_float64");
  int64_t steps_seen = 0;
  const auto options = d2l::TrainSeq2SeqOptions()
                           .on_step([&](const d2l::StepStats&) { ++steps_seen; })
                           .on_epoch([](const d2l::EpochStats& e) {
                             TORCH_CHECK(e.epoch != 1, "stop after epoch 1");
                           });
  EXPECT_THAT(d2l::testing::error_message([&] { train_like_the_fixture(f, options); }),
              HasSubstr("stop after epoch 1"));
  EXPECT_EQ(steps_seen, 2);
}

// ---------------------------------------------------------------------------
// predict_seq2seq on a decoder that maps each input token to a chosen next
// token: its update gate shut (bias -30: h' = n), the candidate state
// n = tanh(8 * one_hot(next[token])) from the token's one-hot embedding, and
// a dense layer that copies h' into the logits. The encoder's context gets
// zero weight.

const d2l::Vocab& toy_tgt_vocab() {
  // <unk> 0, <pad> 1, <bos> 2, <eos> 3, a 4, b 5, c 6.
  static const d2l::Vocab vocab({{"a", "b", "c"}}, 0, {"<pad>", "<bos>", "<eos>"});
  return vocab;
}

d2l::EncoderDecoder scripted_model(bool attention, const std::map<int64_t, int64_t>& next) {
  const int64_t V = toy_tgt_vocab().size();
  auto model = d2l::testing::make_model(attention, d2l::Seq2SeqOptions(V, V, V, 1));
  torch::NoGradGuard no_grad;
  auto params = model->named_parameters();
  const std::string d = "decoder.";
  params[d + "embedding.weight"].copy_(torch::eye(V));
  for (const char* name : {"rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_hh_l0"}) {
    params[d + name].zero_();
  }
  auto bias = params[d + "rnn.bias_ih_l0"];  // gates r, z, n
  bias.zero_();
  bias.slice(0, V, 2 * V).fill_(-30);
  // The decoder's GRU input is [embedding, context] in Seq2SeqDecoder and
  // [context, embedding] in Seq2SeqAttentionDecoder.
  const int64_t embedding_column = attention ? V : 0;
  auto candidate = params[d + "rnn.weight_ih_l0"].slice(0, 2 * V, 3 * V);
  for (const auto& [token, following] : next) candidate[following][embedding_column + token] = 8;
  params[d + "dense.weight"].copy_(torch::eye(V));
  params[d + "dense.bias"].zero_();
  return model;
}

std::pair<std::string, size_t> predict_scripted(d2l::EncoderDecoder& model, int64_t num_steps,
                                                bool attention) {
  const d2l::Vocab src({{"x", "y"}}, 0, {"<pad>", "<bos>", "<eos>"});
  const auto [translation, weights] =
      d2l::predict_seq2seq(*model, "x y", src, toy_tgt_vocab(), num_steps, torch::kCPU, attention);
  return {translation, weights.size()};
}

TEST(PredictSeq2SeqLoop, StopsAtEosAndLeavesItOut) {
  const auto& v = toy_tgt_vocab();
  // <bos> -> a -> b -> c -> <eos> -> a ...
  const std::map<int64_t, int64_t> next = {{v["<bos>"], v["a"]},
                                           {v["a"], v["b"]},
                                           {v["b"], v["c"]},
                                           {v["c"], v["<eos>"]},
                                           {v["<eos>"], v["a"]}};
  for (bool attention : {false, true}) {
    auto model = scripted_model(attention, next);
    const auto [translation, steps] = predict_scripted(model, 10, attention);
    EXPECT_EQ(translation, "a b c") << "attention " << attention;
    // One attention tensor a step, the step that gave <eos> included.
    if (attention) EXPECT_EQ(steps, 4u);
    // Fewer steps than the sentence: cut at num_steps, no <eos> seen.
    const auto [cut, cut_steps] = predict_scripted(model, 2, attention);
    EXPECT_EQ(cut, "a b") << "attention " << attention;
    if (attention) EXPECT_EQ(cut_steps, 2u);
  }
}

TEST(PredictSeq2SeqLoop, WithoutEosStopsAtNumSteps) {
  const auto& v = toy_tgt_vocab();
  // <bos> -> a -> b -> a -> b ...: never <eos>.
  const std::map<int64_t, int64_t> next = {
      {v["<bos>"], v["a"]}, {v["a"], v["b"]}, {v["b"], v["a"]}};
  for (bool attention : {false, true}) {
    auto model = scripted_model(attention, next);
    const auto [translation, steps] = predict_scripted(model, 5, attention);
    EXPECT_EQ(translation, "a b a b a") << "attention " << attention;
    if (attention) EXPECT_EQ(steps, 5u);
  }
}

// on_step sees every step, the one that gave <eos> included, with its token,
// while the decoder holds that step's state.
TEST(PredictSeq2SeqLoop, OnStepSeesEveryStepAndItsToken) {
  const auto& v = toy_tgt_vocab();
  const std::map<int64_t, int64_t> next = {
      {v["<bos>"], v["a"]}, {v["a"], v["b"]}, {v["b"], v["<eos>"]}};
  auto model = scripted_model(/*attention=*/true, next);
  const d2l::Vocab src({{"x", "y"}}, 0, {"<pad>", "<bos>", "<eos>"});
  std::vector<std::pair<int64_t, int64_t>> seen;
  std::vector<torch::Tensor> weights_seen;
  auto* decoder = dynamic_cast<d2l::AttentionDecoder*>(model->decoder.get());
  const auto [translation, weights] = d2l::predict_seq2seq(
      model, "x y", src, v, 10, torch::kCPU, true, [&](int64_t step, int64_t token) {
        seen.emplace_back(step, token);
        weights_seen.push_back(decoder->attention_weights());
      });
  EXPECT_EQ(translation, "a b");
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, int64_t>>{{0, v["a"]}, {1, v["b"]}, {2, v["<eos>"]}}));
  ASSERT_EQ(weights_seen.size(), weights.size());
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_TRUE(torch::equal(weights_seen[i][0], weights[i]));
}

}  // namespace
