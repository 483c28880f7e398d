// terminal_progress, train_seq2seq's default on_step.

#include <d2l/train.h>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace d2l {

namespace {

class TerminalProgress {
 public:
  void operator()(const StepStats& s) {
    // A run starts: whether stdout is a terminal is asked once per run.
    if (s.epoch == 1 && s.batch == 1) shown_ = isatty(fileno(stdout)) != 0;
    if (!shown_) return;
    if (s.batch == 1) drawn_at_ = 0;
    const bool last_of_epoch = s.batch == s.num_batches;
    if (!last_of_epoch && s.seconds - drawn_at_ <= 0.25) return;
    draw(s);
    drawn_at_ = s.seconds;
    if (last_of_epoch && s.epoch == s.num_epochs) fmt::print("\n");
  }

 private:
  static void draw(const StepStats& s) {
    constexpr int width = 24;
    const double done = (static_cast<double>(s.epoch) - 1 +
                         static_cast<double>(s.batch) / static_cast<double>(s.num_batches)) /
                        static_cast<double>(s.num_epochs);
    const int filled = std::clamp(static_cast<int>(done * width), 0, width);
    fmt::print("\repoch {:>4}/{} [{}{}] loss {:.4f} ", s.epoch, s.num_epochs,
               std::string(filled, '#'), std::string(width - filled, '-'), s.epoch_loss);
    std::fflush(stdout);
  }

  bool shown_ = false;
  // Seconds into the epoch when the bar was last drawn.
  double drawn_at_ = 0;
};

}  // namespace

StepCallback terminal_progress() { return TerminalProgress(); }

}  // namespace d2l
