#pragma once

// The helpers of d2l's machine-translation sections that are not models:
// vocabulary, padded arrays, the masked loss, training, greedy prediction,
// BLEU, and a loss-curve plot. Shared by the seq2seq examples.

#include <d2l/encoder_decoder.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace d2l::examples {

using Sentence = std::vector<std::string>;

/// Words of `text` separated by spaces.
Sentence split(const std::string& text);

/// Token <-> index map with the book's reserved tokens first: <pad> 0,
/// <bos> 1, <eos> 2, <unk> 3, then `words` in the given order. The same word
/// list always gives the same indices, so a saved model needs no vocabulary file.
class Vocab {
 public:
  Vocab() = default;
  explicit Vocab(const std::vector<std::string>& words);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  /// Index of `token`, <unk> for a word outside the vocabulary.
  int64_t operator[](const std::string& token) const;
  const std::string& to_token(int64_t index) const { return tokens_.at(index); }

  static constexpr int64_t pad() { return 0; }
  static constexpr int64_t bos() { return 1; }
  static constexpr int64_t eos() { return 2; }
  static constexpr int64_t unk() { return 3; }

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> index_;
};

/// The book's `build_array_nmt` applied to both sides: each sentence plus
/// <eos>, truncated or padded to `num_steps`, with its valid length.
struct Dataset {
  torch::Tensor source, source_valid_len, target, target_valid_len;
};
Dataset build_dataset(const std::vector<Sentence>& sources, const std::vector<Sentence>& targets,
                      const Vocab& source_vocab, const Vocab& target_vocab, int64_t num_steps);

/// The book's `MaskedSoftmaxCELoss`: cross-entropy of `pred` (B, steps, vocab)
/// against `label` (B, steps), padding positions weighted 0, averaged over
/// steps. Returns (B).
torch::Tensor masked_softmax_ce_loss(const torch::Tensor& pred, const torch::Tensor& label,
                                     const torch::Tensor& valid_len);

/// The book's `grad_clipping`: rescales all gradients together so that their
/// global norm is at most `theta`.
void grad_clipping(torch::nn::Module& net, double theta);

struct TrainOptions {
  double lr;
  int num_epochs;
  int64_t batch_size;
  uint64_t shuffle_seed;
};

/// The book's `train_seq2seq`: Xavier initialisation, Adam, teacher forcing
/// with <bos>, the masked loss, gradient clipping at 1. Shows a one-line
/// progress bar and returns the loss per token of every epoch.
std::vector<double> train_seq2seq(d2l::EncoderDecoderImpl& net, const Dataset& data,
                                  const TrainOptions& options, int64_t bos, torch::Device device);

struct Prediction {
  Sentence tokens;
  /// (decoding steps, num_steps): the attention of every step, including the
  /// one that produced <eos>; undefined unless requested.
  torch::Tensor attention_weights;
};

/// The book's `predict_seq2seq`: greedy decoding of one sentence, at most
/// `num_steps` tokens, stopping at <eos>. Attention weights can only be saved
/// for an `AttentionDecoder`.
Prediction predict_seq2seq(d2l::EncoderDecoderImpl& net, const Sentence& source,
                           const Vocab& source_vocab, const Vocab& target_vocab, int64_t num_steps,
                           torch::Device device, bool save_attention_weights = false);

/// The book's `bleu`: exp(min(0, 1 - len_label / len_pred)) times the
/// precisions p_n^(1/2^n) of n-grams up to `k`. A prediction with fewer than
/// `k` tokens scores 0 (the book divides by zero there).
double bleu(const Sentence& pred, const Sentence& label, int k);

/// Writes an SVG line chart of loss per epoch, one line per named curve.
void save_loss_curves_svg(const std::string& path,
                          const std::vector<std::pair<std::string, std::vector<double>>>& curves);

}  // namespace d2l::examples
