// save_loss_curve: the book's animator curve, as a train_seq2seq callback.

#include <d2l/viz/loss_curve.h>
#include <d2l/viz/plot.h>

#include <c10/util/Exception.h>

#include <utility>

namespace d2l {

namespace {

class LossCurve {
 public:
  LossCurve(std::string path, int64_t every) : path_(std::move(path)), every_(every) {}

  void operator()(const EpochStats& s) {
    if (s.epoch % every_ != 0 && s.epoch != s.num_epochs) return;
    if (!curve_.x.empty() && static_cast<double>(s.epoch) <= curve_.x.back()) curve_ = Series();
    curve_.x.push_back(static_cast<double>(s.epoch));
    curve_.y.push_back(s.loss);
    save_plot({curve_}, PlotOptions().xlabel("epoch").ylabel("loss"), path_);
  }

 private:
  std::string path_;
  int64_t every_;
  Series curve_;
};

}  // namespace

EpochCallback save_loss_curve(std::string svg_path, int64_t every) {
  TORCH_CHECK(!svg_path.empty(), "d2l::save_loss_curve: svg_path is empty");
  TORCH_CHECK(every >= 1, "d2l::save_loss_curve: every must be at least 1, got ", every);
  return LossCurve(std::move(svg_path), every);
}

}  // namespace d2l
