#pragma once

// d2l::train (link d2l::train; it brings d2l::attention and nothing else): the
// training side of d2l's sequence-to-sequence sections (d2l.torch 0.17):
// `MaskedSoftmaxCELoss`, `grad_clipping`, `train_seq2seq`, `predict_seq2seq`
// and `bleu`. Progress and the loss curve are callbacks
// (`TrainSeq2SeqOptions::on_step`, `on_epoch`); d2l::viz's `save_loss_curve`
// draws the book's animator curve. Deliberate differences from the book are
// listed with each function and in docs/api.md ("Where we differ from the
// book").

#include <d2l/encoder_decoder.h>
#include <d2l/nmt_data.h>
#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace d2l {

/// The book's `MaskedSoftmaxCELoss`: cross-entropy of `pred` (B, steps, vocab)
/// against `label` (B, steps) with every position at or after `valid_len` (B)
/// weighted 0, averaged over the steps; returns (B). Label ids outside
/// [0, vocab) throw c10::Error naming the id and the vocabulary size.
class MaskedSoftmaxCELossImpl : public torch::nn::Cloneable<MaskedSoftmaxCELossImpl> {
 public:
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& pred, const torch::Tensor& label,
                        const torch::Tensor& valid_len);
  void pretty_print(std::ostream& stream) const override;
};
TORCH_MODULE(MaskedSoftmaxCELoss);

/// The book's `grad_clipping(net, theta)`: when the global L2 norm of the
/// gradients of `net`'s trainable parameters exceeds `theta`, every gradient
/// is scaled by theta / norm. Parameters without a gradient are left out
/// (the book would fail on them). Not LibTorch's
/// `torch::nn::utils::clip_grad_norm_`, which scales by
/// max_norm / (norm + 1e-6) whenever that is below 1: on the golden training
/// fixture its steps differ from the book's by 4e-9 (loss) and 1e-8
/// (parameters) after four steps, where the book's own loop is reproduced to
/// 1e-10. The norm is accumulated in float64; bfloat16 and float16 gradients
/// are squared and summed in float32 first.
void grad_clipping(torch::nn::Module& net, double theta);

/// One optimisation step of `train_seq2seq`, as `TrainSeq2SeqOptions::on_step`
/// sees it.
struct StepStats {
  /// 1-based epoch, of `num_epochs`.
  int64_t epoch = 0, num_epochs = 0;
  /// 1-based batch within the epoch, of `num_batches`.
  int64_t batch = 0, num_batches = 0;
  /// Loss per token of this step (all ranks' shares together).
  double loss = 0;
  /// Loss per token of the epoch so far.
  double epoch_loss = 0;
  /// Wall-clock seconds since the epoch started.
  double seconds = 0;
};

/// One finished epoch of `train_seq2seq`, as `TrainSeq2SeqOptions::on_epoch`
/// sees it.
struct EpochStats {
  /// 1-based epoch, of `num_epochs`.
  int64_t epoch = 0, num_epochs = 0;
  /// Loss per token of the epoch.
  double loss = 0;
  /// Tokens and sentence pairs per second, and the epoch's wall-clock seconds.
  double tokens_per_sec = 0, examples_per_sec = 0, seconds = 0;
};

using StepCallback = std::function<void(const StepStats&)>;
using EpochCallback = std::function<void(const EpochStats&)>;

/// The default `on_step`: a one-line progress bar on stdout
/// ("\repoch    2/10 [#####-------------------] loss 0.1234 "), redrawn at
/// most every 250 ms and at the end of every epoch, ended by a newline after
/// the last step; nothing when stdout is not a terminal (checked when a run
/// starts).
StepCallback terminal_progress();

/// What `train_seq2seq` shows besides the book's printed line, and the dtype
/// it trains in. The callbacks run on the calling thread, between steps; in
/// d2l::distributed, on rank 0 only. An exception from one ends the training
/// and propagates.
struct TrainSeq2SeqOptions {
  /// Called after every optimisation step; nullptr: nothing.
  TORCH_ARG(StepCallback, on_step) = terminal_progress();
  /// Called after every epoch; nullptr: nothing. d2l::viz's
  /// `save_loss_curve(path)` draws the book's animator curve as SVG.
  TORCH_ARG(EpochCallback, on_epoch) = nullptr;
  /// The dtype of the forward and backward passes: the net's parameters,
  /// activations and gradients while it trains. Unset: the net's own, as
  /// built (float32) or converted by the caller. torch::kFloat32 or
  /// torch::kFloat64: the net is converted and trains, and stays, in it.
  /// torch::kBFloat16: bfloat16 as `master_weights` says, with the logits
  /// widened to float32 for the loss. Other dtypes throw c10::Error (float16
  /// would need loss scaling, which this loop does not do).
  TORCH_ARG(std::optional<torch::Dtype>, dtype) = std::nullopt;
  /// With dtype bfloat16: true (mixed precision, the default) keeps float32
  /// master weights: the gradients are widened to them, clipped and given to
  /// Adam (whose state is float32 too) there, and the net's bfloat16
  /// parameters are the master weights rounded after every step; the net
  /// ends in float32 holding the master weights (also when an exception ends
  /// the training). false: the clipping and Adam work on the bfloat16
  /// parameters themselves, which the net keeps; an update below half a
  /// bfloat16 step of its weight (2^-9 of it) is lost. Ignored for other
  /// dtypes.
  TORCH_ARG(bool, master_weights) = true;
};

/// What the book prints at the end of `train_seq2seq`, and every epoch's loss.
struct TrainSeq2SeqResult {
  /// Loss per token of every epoch.
  std::vector<double> losses;
  /// Loss per token of every optimisation step (every batch, all ranks'
  /// shares together).
  std::vector<double> step_losses;
  /// Wall-clock seconds of every epoch.
  std::vector<double> epoch_seconds;
  /// Loss per token and tokens per second of the last epoch (the book's line
  /// "loss 0.020, 2874.8 tokens/sec on cuda:0").
  double loss = 0, tokens_per_sec = 0;
  /// Sentence pairs per second of the last epoch.
  double examples_per_sec = 0;
};

/// The book's `train_seq2seq(net, data_iter, lr, num_epochs, tgt_vocab,
/// device)`: Xavier-uniform weights of every Linear and GRU, Adam at `lr`,
/// teacher forcing with `<bos>`, `MaskedSoftmaxCELoss`, `grad_clipping(net, 1)`,
/// in the dtype `options.dtype()` names (bfloat16 with float32 master weights,
/// say). Batches of `data_iter` are (X, X_valid_len, Y, Y_valid_len).
TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const TrainSeq2SeqOptions& options = {});
/// The same on the module holder: `train_seq2seq(net, ...)` for `*net`.
TrainSeq2SeqResult train_seq2seq(const EncoderDecoder& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const TrainSeq2SeqOptions& options = {});

/// What a data-parallel trainer adds to `train_seq2seq`'s loop: every rank
/// runs the loop on its rows [B * rank / world_size, B * (rank + 1) /
/// world_size) of every batch of B, and these hooks make the ranks agree.
/// d2l::distributed::train_seq2seq implements them on a c10d process group;
/// the callbacks and the printed line are rank 0's.
class TrainSeq2SeqSync {
 public:
  virtual ~TrainSeq2SeqSync() = default;
  /// The trainer's name in error messages ("d2l::distributed::train_seq2seq").
  virtual const char* name() const = 0;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  /// After initialisation, before the optimiser: make every rank's weights
  /// rank 0's.
  virtual void after_init(torch::nn::Module& net) = 0;
  /// Around every backward pass (called on ranks with no rows as well); after
  /// `after_backward`, every rank's gradients are the sum over the ranks.
  virtual void before_backward() = 0;
  virtual void after_backward() = 0;
  /// Sums `values` (CPU, float64) across the ranks in place.
  virtual void sum(torch::Tensor& values) = 0;
};

/// `train_seq2seq` as one rank of `sync`'s group.
TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 TrainSeq2SeqSync& sync, const TrainSeq2SeqOptions& options = {});

/// What predict_seq2seq calls after each decoding step: (step, token).
using PredictStepCallback = std::function<void(int64_t step, int64_t token)>;

/// The book's `predict_seq2seq`: greedy decoding of `src_sentence` (lower-cased
/// and split on spaces), at most `num_steps` tokens, stopping at `<eos>`.
/// Returns the translation and, with `save_attention_weights`, one tensor a
/// decoding step (including the one that gave `<eos>`): the decoder's
/// `attention_weights()[0]`, (1, num_steps) for Seq2SeqAttentionDecoder.
/// The encoder's valid length is capped at `num_steps` (the book passes the
/// uncapped length). Requesting weights from a decoder that is not an
/// `AttentionDecoder` throws c10::Error. `on_step`, when given, is called
/// after every decoding step with the step and the token it chose, while the
/// decoder still holds that step's state: read what the book's loop would
/// keep there (TransformerDecoder::block_attention_weights(), say).
std::pair<std::string, std::vector<torch::Tensor>> predict_seq2seq(
    EncoderDecoderImpl& net, const std::string& src_sentence, const Vocab& src_vocab,
    const Vocab& tgt_vocab, int64_t num_steps, torch::Device device,
    bool save_attention_weights = false, const PredictStepCallback& on_step = nullptr);
/// The same on the module holder.
std::pair<std::string, std::vector<torch::Tensor>> predict_seq2seq(
    const EncoderDecoder& net, const std::string& src_sentence, const Vocab& src_vocab,
    const Vocab& tgt_vocab, int64_t num_steps, torch::Device device,
    bool save_attention_weights = false, const PredictStepCallback& on_step = nullptr);

/// The book's `bleu(pred_seq, label_seq, k)` of space-separated sequences:
/// exp(min(0, 1 - len_label / len_pred)) times p_n^(1/2^n) for n = 1..k.
/// A prediction with fewer than `k` tokens scores 0 (the book divides by
/// zero when it has k - 1).
double bleu(const std::string& pred_seq, const std::string& label_seq, int64_t k);

}  // namespace d2l
