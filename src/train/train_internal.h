#pragma once

// What train_seq2seq's loop shares between its files: the gradient clipping
// of a parameter list (loss.cpp) and the dtype it trains in (precision.cpp).

#include <d2l/train.h>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <vector>

namespace d2l::detail {

/// grad_clipping over `params`: those that require a gradient and have one.
/// bfloat16 and float16 gradients are squared and summed in float32.
void clip_gradients(const std::vector<torch::Tensor>& params, double theta);

/// Throws c10::Error naming `fn` unless options.dtype() is unset, float32,
/// float64 or bfloat16.
void check_train_dtype(const TrainSeq2SeqOptions& options, const char* fn);

/// TrainSeq2SeqOptions::dtype and master_weights applied to a net: the
/// constructor converts the net (after its initialisation and the ranks'
/// agreement on it); the loop runs the forward and backward passes on the
/// net, calls gradients_to_master() after them, clips and steps `optimized()`,
/// then calls master_to_model(). finish() (or the destructor, when an
/// exception ends the loop) leaves the net as the options promise.
class TrainPrecision {
 public:
  TrainPrecision(torch::nn::Module& net, const TrainSeq2SeqOptions& options, const char* fn);
  TrainPrecision(const TrainPrecision&) = delete;
  TrainPrecision& operator=(const TrainPrecision&) = delete;
  ~TrainPrecision();

  /// What the clipping and Adam work on: the float32 master weights, or the
  /// net's parameters.
  const std::vector<torch::Tensor>& optimized() const { return master_.empty() ? model_ : master_; }
  /// The net's output as the loss takes it: bfloat16 logits widened to float32.
  torch::Tensor loss_input(const torch::Tensor& Y_hat) const;
  /// The net's gradients widened into the master weights' (undefined where
  /// the net's is), and the net's cleared; nothing without master weights.
  void gradients_to_master();
  /// The master weights rounded into the net's parameters.
  void master_to_model();
  /// With master weights: the net back in their dtype, holding them.
  void finish();

 private:
  torch::nn::Module& net_;
  bool widen_logits_ = false;
  std::vector<torch::Tensor> model_, master_;
};

}  // namespace d2l::detail
