#pragma once

#include <d2l/additive_attention.h>
#include <d2l/encoder_decoder.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <tuple>

namespace d2l {

/// Constructor arguments shared by the book's three RNN sequence-to-sequence
/// modules, `(vocab_size, embed_size, num_hiddens, num_layers, dropout=0)`.
struct Seq2SeqOptions {
  Seq2SeqOptions(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens, int64_t num_layers);
  /// Number of token ids; inputs must lie in [0, vocab_size).
  TORCH_ARG(int64_t, vocab_size);
  /// Size of a token embedding.
  TORCH_ARG(int64_t, embed_size);
  /// Hidden units of every GRU layer.
  TORCH_ARG(int64_t, num_hiddens);
  /// Stacked GRU layers.
  TORCH_ARG(int64_t, num_layers);
  /// Dropout between GRU layers (and on the attention weights) in training.
  TORCH_ARG(double, dropout) = 0.0;
};
using Seq2SeqEncoderOptions = Seq2SeqOptions;
using Seq2SeqDecoderOptions = Seq2SeqOptions;
using Seq2SeqAttentionDecoderOptions = Seq2SeqOptions;

/// d2l's `Seq2SeqEncoder`: token ids X (B, num_steps) -> embedding -> GRU.
/// Returns the GRU's (outputs (num_steps, B, num_hiddens), state
/// (num_layers, B, num_hiddens)). As in the book, padding is encoded like any
/// token; `valid_lens` is accepted for the `Encoder` interface and ignored.
/// Parameters: `embedding.weight`, `rnn.weight_ih_l0`, ... as in PyTorch.
class Seq2SeqEncoderImpl : public torch::nn::Cloneable<Seq2SeqEncoderImpl>, public Encoder {
 public:
  Seq2SeqEncoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                     int64_t num_layers, double dropout = 0.0);
  explicit Seq2SeqEncoderImpl(const Seq2SeqEncoderOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  void load(torch::serialize::InputArchive& archive) override;

  EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& valid_lens = {}) override;

  Seq2SeqEncoderOptions options;
  torch::nn::Embedding embedding{nullptr};
  torch::nn::GRU rnn{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(Seq2SeqEncoder);

/// d2l's `Seq2SeqDecoder`: the encoder's final state initialises the GRU, and
/// the last layer of the decoder state is concatenated to every input
/// embedding as the context. X (B, num_steps) -> (logits (B, num_steps,
/// vocab_size), state).
///
/// As in the book, the context is read from the state passed to `forward`: over
/// a whole target sequence that is the encoder's state, but when decoding one
/// step at a time it is the decoder's own state from the previous step.
class Seq2SeqDecoderImpl : public torch::nn::Cloneable<Seq2SeqDecoderImpl>, public Decoder {
 public:
  Seq2SeqDecoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                     int64_t num_layers, double dropout = 0.0);
  explicit Seq2SeqDecoderImpl(const Seq2SeqDecoderOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's `enc_outputs[1]`: the encoder's final hidden state. This
  /// decoder does not attend, so `enc_valid_lens` is ignored, as in the book
  /// (but checked like the attention decoder's).
  DecoderState init_state(const EncoderOutput& enc_outputs,
                          const torch::Tensor& enc_valid_lens = {}) override;
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state) override;

  Seq2SeqDecoderOptions options;
  torch::nn::Embedding embedding{nullptr};
  torch::nn::GRU rnn{nullptr};
  torch::nn::Linear dense{nullptr};
};
TORCH_MODULE(Seq2SeqDecoder);

/// d2l's `Seq2SeqAttentionDecoder` (Bahdanau attention): at every step the
/// top layer of the hidden state queries the encoder outputs through
/// `AdditiveAttention(num_hiddens, num_hiddens, num_hiddens, dropout)`, and the
/// context is concatenated before the input embedding.
///
/// Computes what the book computes, with one change in how: the key
/// projection W_k(enc_outputs) is made once by `init_state` and kept in the
/// state (`DecoderState::projected_keys`), where the book repeats it at every
/// step. Parameter names are unchanged: `attention.W_k.weight`, ...,
/// `embedding.weight`, `rnn.weight_ih_l0`, ..., `dense.weight`, `dense.bias`.
class Seq2SeqAttentionDecoderImpl : public torch::nn::Cloneable<Seq2SeqAttentionDecoderImpl>,
                                    public AttentionDecoder {
 public:
  Seq2SeqAttentionDecoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                              int64_t num_layers, double dropout = 0.0);
  explicit Seq2SeqAttentionDecoderImpl(const Seq2SeqAttentionDecoderOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's `(outputs.permute(1, 0, 2), hidden_state, enc_valid_lens)`,
  /// plus the projected keys.
  DecoderState init_state(const EncoderOutput& enc_outputs,
                          const torch::Tensor& enc_valid_lens = {}) override;
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state) override;
  /// Safe while other threads call forward (Note [Recording attention
  /// weights] in src/attention_weights.h).
  torch::Tensor attention_weights() const override;

  Seq2SeqAttentionDecoderOptions options;
  AdditiveAttention attention{nullptr};
  torch::nn::Embedding embedding{nullptr};
  torch::nn::GRU rnn{nullptr};
  torch::nn::Linear dense{nullptr};

 private:
  torch::Tensor attention_weights_;
};
TORCH_MODULE(Seq2SeqAttentionDecoder);

}  // namespace d2l
