// The dtype train_seq2seq trains in (TrainSeq2SeqOptions::dtype and
// master_weights): the net converted, and for mixed precision the float32
// master weights that the clipping and Adam update.
//
// Not LibTorch's autocast (AutocastCPU, in 1.13 and 2.x): it casts the inputs
// of registered ops such as linear and bmm, but the residual sums promote
// back to float32, so every block's input is float32 again and the
// attention's own nodes (small heads, flash), which autocast does not see,
// run in float32; and its cache of cast weights must be cleared after every
// step. Here the whole net runs in bfloat16.

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/utils.h>

#include "train_internal.h"

namespace d2l::detail {

namespace {

// Module::to(dtype) would convert integer buffers too; Python's converts
// only the floating-point ones, and so does this.
void convert_floating(const std::vector<torch::Tensor>& tensors, torch::Dtype dtype) {
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors) {
    if (t.is_floating_point()) t.set_data(t.to(dtype));
  }
}

}  // namespace

void check_train_dtype(const TrainSeq2SeqOptions& options, const char* fn) {
  if (!options.dtype()) return;
  const auto dtype = *options.dtype();
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kDouble || dtype == torch::kBFloat16,
              fmt::format("{}: dtype must be float32, float64 or bfloat16, got {}{}", fn,
                          c10::toString(dtype),
                          dtype == torch::kHalf
                              ? " (float16 needs loss scaling, which this loop does not do)"
                              : ""));
}

TrainPrecision::TrainPrecision(torch::nn::Module& net, const TrainSeq2SeqOptions& options,
                               const char* fn)
    : net_(net), model_(net.parameters()) {
  check_train_dtype(options, fn);
  if (!options.dtype()) return;
  const auto dtype = *options.dtype();
  if (dtype == torch::kBFloat16 && options.master_weights()) {
    torch::NoGradGuard no_grad;
    for (const auto& p : model_) {
      master_.push_back(p.detach()
                            .to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true)
                            .requires_grad_(p.requires_grad()));
    }
  }
  convert_floating(model_, dtype);
  convert_floating(net.buffers(), dtype);
  widen_logits_ = dtype == torch::kBFloat16;
}

// An exception that ends the training still leaves the net with its master
// weights; a destructor must not throw, and the exception in flight is the
// one to report.
TrainPrecision::~TrainPrecision() {
  try {
    finish();
  } catch (...) {
  }
}

torch::Tensor TrainPrecision::loss_input(const torch::Tensor& Y_hat) const {
  return widen_logits_ ? Y_hat.to(torch::kFloat) : Y_hat;
}

void TrainPrecision::gradients_to_master() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) {
    auto& grad = model_[i].mutable_grad();
    master_[i].mutable_grad() =
        grad.defined() ? grad.to(master_[i].scalar_type()) : torch::Tensor();
    grad = torch::Tensor();
  }
}

void TrainPrecision::master_to_model() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) model_[i].copy_(master_[i]);
}

void TrainPrecision::finish() {
  if (master_.empty()) return;
  convert_floating(net_.buffers(), torch::kFloat);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master_.size(); ++i) {
    model_[i].set_data(master_[i].detach());
    model_[i].mutable_grad() = torch::Tensor();
  }
  master_.clear();
}

}  // namespace d2l::detail
