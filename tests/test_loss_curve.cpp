// d2l::viz's save_loss_curve, train_seq2seq's on_epoch callback that draws
// the book's animator curve: the same document the training loop wrote
// before progress and plotting became callbacks (every 10th epoch and the
// last, "epoch" against "loss"), a curve per run, and its errors.

#include <d2l/attention.h>
#include <d2l/train.h>
#include <d2l/viz.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_utils.h"
#include "xml_checked.h"

namespace {

using d2l::testing::error_message;
using ::testing::HasSubstr;

std::string curve_file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

std::string curve_path(const char* name) {
  return (std::filesystem::path(::testing::TempDir()) /
          (std::string("d2l_loss_curve_") + name + "_" + std::to_string(::getpid()) + ".svg"))
      .string();
}

d2l::EpochStats epoch_stats(int64_t epoch, int64_t num_epochs, double loss) {
  d2l::EpochStats s;
  s.epoch = epoch;
  s.num_epochs = num_epochs;
  s.loss = loss;
  return s;
}

// The points are the book's animator's: epochs 10, 20 and the last, 25.
TEST(LossCurve, EveryTenthEpochAndTheLastAsTheBooksAnimator) {
  const auto path = curve_path("tenth");
  auto callback = d2l::save_loss_curve(path);
  d2l::Series expected;
  for (int64_t epoch = 1; epoch <= 25; ++epoch) {
    const double loss = 1.0 / static_cast<double>(epoch);
    callback(epoch_stats(epoch, 25, loss));
    if (epoch % 10 == 0 || epoch == 25) {
      expected.x.push_back(static_cast<double>(epoch));
      expected.y.push_back(loss);
      // Rewritten at every point, with what plot_svg draws for the points so far.
      EXPECT_EQ(curve_file_text(path),
                d2l::testing::valid_plot_svg({expected},
                                             d2l::PlotOptions().xlabel("epoch").ylabel("loss")))
          << "epoch " << epoch;
    }
  }
  EXPECT_EQ(expected.x, (std::vector<double>{10, 20, 25}));
  std::filesystem::remove(path);
}

// A run that starts again (an options object used twice) starts a new curve.
TEST(LossCurve, ASecondRunStartsANewCurve) {
  const auto path = curve_path("again");
  auto callback = d2l::save_loss_curve(path, 1);
  for (int64_t epoch = 1; epoch <= 3; ++epoch) callback(epoch_stats(epoch, 3, 2.0));
  callback(epoch_stats(1, 2, 0.5));
  d2l::Series one_point;
  one_point.x = {1};
  one_point.y = {0.5};
  EXPECT_EQ(
      curve_file_text(path),
      d2l::testing::valid_plot_svg({one_point}, d2l::PlotOptions().xlabel("epoch").ylabel("loss")));
  std::filesystem::remove(path);
}

TEST(LossCurve, BadArgumentsAndUnwritablePaths) {
  EXPECT_THAT(error_message([] { d2l::save_loss_curve(""); }),
              HasSubstr("d2l::save_loss_curve: svg_path is empty"));
  EXPECT_THAT(error_message([] { d2l::save_loss_curve("curve.svg", 0); }),
              HasSubstr("d2l::save_loss_curve: every must be at least 1, got 0"));
  const auto missing =
      (std::filesystem::temp_directory_path() / "d2l_no_such_dir" / "loss.svg").string();
  auto callback = d2l::save_loss_curve(missing);
  EXPECT_THAT(error_message([&] { callback(epoch_stats(1, 1, 1.0)); }),
              HasSubstr("d2l::save_plot: cannot write '" + missing + "'"));
}

// train_seq2seq with the callback draws its last epoch's loss.
TEST(LossCurve, TrainSeq2SeqDrawsItsLoss) {
  torch::manual_seed(0);
  auto data = d2l::load_data_nmt(D2L_NMT_DATA_DIR "/fra-eng-sample", 8, 6, 20);
  d2l::Seq2SeqEncoder encoder(data.src_vocab.size(), 8, 8, 2, 0.1);
  d2l::EncoderDecoder net(
      encoder, d2l::Seq2SeqAttentionDecoder(d2l::Seq2SeqOptions(data.tgt_vocab.size(), 8, 8, 2)));
  const auto path = curve_path("train");
  const auto result = d2l::train_seq2seq(
      net, data.data_iter, 0.005, 3, data.tgt_vocab, torch::kCPU,
      d2l::TrainSeq2SeqOptions().on_step(nullptr).on_epoch(d2l::save_loss_curve(path)));
  d2l::Series last;
  last.x = {3};
  last.y = {result.losses.back()};
  EXPECT_EQ(curve_file_text(path), d2l::testing::valid_plot_svg(
                                       {last}, d2l::PlotOptions().xlabel("epoch").ylabel("loss")));
  std::filesystem::remove(path);
}

}  // namespace
