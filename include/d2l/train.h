#pragma once

// Part of d2l::viz (link d2l::viz: `train_seq2seq` draws the book's animator
// curve): the training side of d2l's sequence-to-sequence sections
// (d2l.torch 0.17): `MaskedSoftmaxCELoss`, `grad_clipping`, `train_seq2seq`,
// `predict_seq2seq` and `bleu`. Deliberate differences from the book are
// listed with each function and in README ("Machine translation: the book's
// training API").

#include <d2l/encoder_decoder.h>
#include <d2l/nmt_data.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
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
/// (the book would fail on them).
void grad_clipping(torch::nn::Module& net, double theta);

/// What `train_seq2seq` shows and writes besides the book's printed line.
struct TrainSeq2SeqOptions {
  /// Where the animator's loss curve (every 10th epoch, as the book's) is
  /// written as SVG, rewritten at every point; empty: nowhere.
  TORCH_ARG(std::string, svg_path) = "";
  /// A one-line progress bar, shown only when stdout is a terminal.
  TORCH_ARG(bool, progress) = true;
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
/// teacher forcing with `<bos>`, `MaskedSoftmaxCELoss`, `grad_clipping(net, 1)`.
/// Batches of `data_iter` are (X, X_valid_len, Y, Y_valid_len).
TrainSeq2SeqResult train_seq2seq(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                 int64_t num_epochs, const Vocab& tgt_vocab, torch::Device device,
                                 const TrainSeq2SeqOptions& options = {});

/// The book's `predict_seq2seq`: greedy decoding of `src_sentence` (lower-cased
/// and split on spaces), at most `num_steps` tokens, stopping at `<eos>`.
/// Returns the translation and, with `save_attention_weights`, one tensor a
/// decoding step (including the one that gave `<eos>`): the decoder's
/// `attention_weights()[0]`, (1, num_steps) for Seq2SeqAttentionDecoder.
/// The encoder's valid length is capped at `num_steps` (the book passes the
/// uncapped length). Requesting weights from a decoder that is not an
/// `AttentionDecoder` throws c10::Error.
std::pair<std::string, std::vector<torch::Tensor>> predict_seq2seq(
    EncoderDecoderImpl& net, const std::string& src_sentence, const Vocab& src_vocab,
    const Vocab& tgt_vocab, int64_t num_steps, torch::Device device,
    bool save_attention_weights = false);

/// The book's `bleu(pred_seq, label_seq, k)` of space-separated sequences:
/// exp(min(0, 1 - len_label / len_pred)) times p_n^(1/2^n) for n = 1..k.
/// A prediction with fewer than `k` tokens scores 0 (the book divides by
/// zero when it has k - 1).
double bleu(const std::string& pred_seq, const std::string& label_seq, int64_t k);

}  // namespace d2l
