#pragma once

// d2l 1.0's RNN sequence-to-sequence modules (d2l.ai, sections "Deep
// Recurrent Neural Networks", "Sequence-to-Sequence Learning for Machine
// Translation" and "The Bahdanau Attention Mechanism"): GRU, init_seq2seq,
// Seq2SeqEncoder, Seq2SeqDecoder and Seq2SeqAttentionDecoder, with the
// book's constructors and state_dict keys. The encoder and the plain decoder
// wrap their GRU in d2l.GRU (`rnn.rnn.weight_ih_l0`); the Bahdanau decoder
// does not (`rnn.weight_ih_l0`). The decoders' output layer `dense` is lazy
// (d2l/lazy.h), so are the attention's W_q, W_k and w_v.

#include <d2l/lazy.h>
#include <d2l/seq2seq.h>
#include <d2l/v1/attention.h>
#include <d2l/v1/encoder_decoder.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/rnn.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace d2l::v1 {

/// d2l 1.0's `init_seq2seq(module)`, for Module::apply: Xavier-uniform
/// weights for a torch::nn::Linear and for every weight of a
/// torch::nn::GRU; other modules (a LazyLinear, as the book's nn.LazyLinear,
/// an embedding, the GRUs' biases) keep theirs. The book's Seq2SeqEncoder and
/// decoders apply it at construction.
void init_seq2seq(torch::nn::Module& module);

/// d2l 1.0's `GRU(num_inputs, num_hiddens, num_layers, dropout=0)`: the
/// module `rnn` = nn.GRU(num_inputs, num_hiddens, num_layers, dropout), whose
/// parameters are therefore `rnn.weight_ih_l0`, ...
class GRUImpl : public torch::nn::Cloneable<GRUImpl> {
 public:
  GRUImpl(int64_t num_inputs, int64_t num_hiddens, int64_t num_layers, double dropout = 0.0);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// The book's forward(inputs, H=None): inputs (num_steps, B, num_inputs),
  /// H (num_layers, B, num_hiddens) or undefined -> (outputs, H).
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& inputs,
                                                   const torch::Tensor& H = {});

  int64_t num_inputs;
  int64_t num_hiddens;
  int64_t num_layers;
  double dropout_p;
  torch::nn::GRU rnn{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(GRU);

/// d2l 1.0's `Seq2SeqEncoder(vocab_size, embed_size, num_hiddens,
/// num_layers, dropout=0)`: token ids X (B, num_steps) -> embedding -> GRU
/// (wrapped: `rnn.rnn.weight_ih_l0`). Returns (outputs (num_steps, B,
/// num_hiddens), state (num_layers, B, num_hiddens)); `valid_lens` is
/// accepted for the Encoder interface and ignored, as in the book.
class Seq2SeqEncoderImpl : public torch::nn::Cloneable<Seq2SeqEncoderImpl>, public Encoder {
 public:
  Seq2SeqEncoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                     int64_t num_layers, double dropout = 0.0);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& valid_lens = {}) override;

  d2l::Seq2SeqOptions options;
  torch::nn::Embedding embedding{nullptr};
  GRU rnn{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(Seq2SeqEncoder);

/// d2l 1.0's `Seq2SeqDecoder(vocab_size, embed_size, num_hiddens,
/// num_layers, dropout=0)` (section "Sequence-to-Sequence Learning"; not in
/// torch.py): the book's state is [enc_output, hidden_state]; the context
/// concatenated to every input embedding is enc_output[-1], the encoder's
/// top-layer output at its last step, for every call (0.17's decoder reads
/// its own state instead). Here enc_output is DecoderState::enc_outputs,
/// batch-first (B, num_enc_steps, num_hiddens) as in every DecoderState.
/// Its GRU is wrapped (`rnn.rnn.*`); `dense` is lazy.
class Seq2SeqDecoderImpl : public torch::nn::Cloneable<Seq2SeqDecoderImpl>, public Decoder {
 public:
  Seq2SeqDecoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                     int64_t num_layers, double dropout = 0.0);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's init_state(enc_all_outputs): the encoder's (outputs,
  /// hidden_state); `enc_valid_lens` is checked and ignored.
  DecoderState init_state(const EncoderOutput& enc_outputs,
                          const torch::Tensor& enc_valid_lens = {}) override;
  /// X (B, steps) -> (logits (B, steps, vocab_size), [enc_output, new hidden_state]).
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state) override;

  d2l::Seq2SeqOptions options;
  torch::nn::Embedding embedding{nullptr};
  GRU rnn{nullptr};
  LazyLinear dense{nullptr};
};
TORCH_MODULE(Seq2SeqDecoder);

/// d2l 1.0's Bahdanau `Seq2SeqAttentionDecoder(vocab_size, embed_size,
/// num_hiddens, num_layers, dropout=0)`: at every step the top layer of the
/// hidden state queries the encoder outputs through 1.0's
/// AdditiveAttention(num_hiddens, dropout), and the context is concatenated
/// before the input embedding. Its GRU is not wrapped (`rnn.weight_ih_l0`).
/// The book's state (enc_outputs, hidden_state, enc_valid_lens) is
/// DecoderState's fields of those names. The keys W_k(enc_outputs) are
/// projected once per forward call, where the book projects them at every
/// step, and without autograd once per decoding (kept in the returned
/// state's cache from the first call): the same numbers.
class Seq2SeqAttentionDecoderImpl : public torch::nn::Cloneable<Seq2SeqAttentionDecoderImpl>,
                                    public Decoder {
 public:
  Seq2SeqAttentionDecoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                              int64_t num_layers, double dropout = 0.0);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's (outputs.permute(1, 0, 2), hidden_state, enc_valid_lens).
  DecoderState init_state(const EncoderOutput& enc_outputs,
                          const torch::Tensor& enc_valid_lens = {}) override;
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state) override;
  /// The book's `attention_weights` of the last forward call: one (B, 1,
  /// num_enc_steps) tensor per decoding step. Safe while other threads call
  /// forward (Note [Recording attention weights] in src/attention_weights.h).
  std::vector<torch::Tensor> attention_weights() const;

  d2l::Seq2SeqOptions options;
  AdditiveAttention attention{nullptr};
  torch::nn::Embedding embedding{nullptr};
  torch::nn::GRU rnn{nullptr};
  LazyLinear dense{nullptr};

 private:
  // The steps' weights concatenated, (B, steps, num_enc_steps).
  torch::Tensor attention_weights_;
};
TORCH_MODULE(Seq2SeqAttentionDecoder);

}  // namespace d2l::v1
