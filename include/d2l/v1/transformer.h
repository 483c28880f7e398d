#pragma once

// d2l 1.0's Transformer (d2l.ai, sections "Self-Attention and Positional
// Encoding" and "The Transformer Architecture"), with the book's
// constructors, submodule names and state: PositionalEncoding,
// PositionWiseFFN, AddNorm, TransformerEncoderBlock, TransformerEncoder,
// TransformerDecoderBlock and TransformerDecoder. Their linear layers are
// lazy as the book's nn.LazyLinear (d2l/lazy.h): the parameters exist from
// construction and take their input widths from the first forward call or a
// loaded state dict (docs/transformer.md, "d2l 1.0's classes"). They work in
// d2l::v1::EncoderDecoder (and d2l::EncoderDecoder) through the Encoder and
// Decoder interfaces.

#include <d2l/attention_mask.h>
#include <d2l/encoder_decoder.h>
#include <d2l/lazy.h>
#include <d2l/transformer.h>
#include <d2l/v1/attention.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

namespace d2l::v1 {

/// d2l 1.0's `PositionalEncoding(num_hiddens, dropout, max_len=1000)` is
/// 0.17's, line for line: `P` is a plain attribute (not in the state dict).
using PositionalEncoding = d2l::PositionalEncoding;
using PositionalEncodingImpl = d2l::PositionalEncodingImpl;

/// d2l 1.0's `PositionWiseFFN(ffn_num_hiddens, ffn_num_outputs)`:
/// dense2(relu(dense1(X))) on the last dimension, dense1 and dense2 lazy
/// (the input width comes from the first X).
class PositionWiseFFNImpl : public torch::nn::Cloneable<PositionWiseFFNImpl> {
 public:
  PositionWiseFFNImpl(int64_t ffn_num_hiddens, int64_t ffn_num_outputs);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// X (..., features) -> (..., ffn_num_outputs).
  torch::Tensor forward(const torch::Tensor& X);

  int64_t ffn_num_hiddens;
  int64_t ffn_num_outputs;
  LazyLinear dense1{nullptr};
  torch::nn::ReLU relu{nullptr};
  LazyLinear dense2{nullptr};
};
TORCH_MODULE(PositionWiseFFN);

/// d2l 1.0's `AddNorm(norm_shape, dropout)`, norm_shape an int:
/// ln(dropout(Y) + X) with submodules `dropout` and `ln`. The module is
/// 0.17's AddNorm (whose constructor takes a list); only the constructor
/// differs.
class AddNorm : public torch::nn::ModuleHolder<d2l::AddNormImpl> {
 public:
  using Impl = d2l::AddNormImpl;
  /* implicit */ AddNorm(std::nullptr_t) : torch::nn::ModuleHolder<Impl>(nullptr) {}
  /* implicit */ AddNorm(std::shared_ptr<Impl> impl)
      : torch::nn::ModuleHolder<Impl>(std::move(impl)) {}
  AddNorm(int64_t norm_shape, double dropout);
};

/// d2l 1.0's `TransformerEncoderBlock(num_hiddens, ffn_num_hiddens,
/// num_heads, dropout, use_bias=False)`: Y = addnorm1(X, attention(X, X, X,
/// valid_lens)); addnorm2(Y, ffn(Y)). X must have num_hiddens features (the
/// layer norms' width), so its lazy layers all take num_hiddens.
class TransformerEncoderBlockImpl : public torch::nn::Cloneable<TransformerEncoderBlockImpl> {
 public:
  TransformerEncoderBlockImpl(int64_t num_hiddens, int64_t ffn_num_hiddens, int64_t num_heads,
                              double dropout, bool use_bias = false);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (B, n, num_hiddens); `valid_lens` (B) or (B, n), or any AttentionMask,
  /// goes to the self-attention.
  torch::Tensor forward(const torch::Tensor& X, const AttentionMask& valid_lens = {});

  int64_t num_hiddens;
  int64_t ffn_num_hiddens;
  int64_t num_heads;
  double dropout_p;
  bool use_bias;
  MultiHeadAttention attention{nullptr};
  AddNorm addnorm1{nullptr};
  PositionWiseFFN ffn{nullptr};
  AddNorm addnorm2{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(AttentionMask())})
};
TORCH_MODULE(TransformerEncoderBlock);

/// d2l 1.0's `TransformerEncoder(vocab_size, num_hiddens, ffn_num_hiddens,
/// num_heads, num_blks, dropout, use_bias=False)`: embedding *
/// sqrt(num_hiddens), the positional encoding, then the blocks `blks.block0`,
/// `blks.block1`, ... Its EncoderOutput holds the last block's output
/// (B, n, num_hiddens); `hidden_state` is undefined.
class TransformerEncoderImpl : public torch::nn::Cloneable<TransformerEncoderImpl>,
                               public d2l::Encoder {
 public:
  TransformerEncoderImpl(int64_t vocab_size, int64_t num_hiddens, int64_t ffn_num_hiddens,
                         int64_t num_heads, int64_t num_blks, double dropout,
                         bool use_bias = false);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (B, n) token ids; valid_lens (B) or undefined.
  EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& valid_lens = {}) override;

  /// The book's `attention_weights`: per block, the per-head weights of the
  /// last forward call, (B * num_heads, n, n).
  std::vector<torch::Tensor> attention_weights() const;
  /// Block i of `blks`.
  TransformerEncoderBlock block(int64_t i) const;

  int64_t vocab_size;
  int64_t num_hiddens;
  int64_t ffn_num_hiddens;
  int64_t num_heads;
  int64_t num_blks;
  double dropout_p;
  bool use_bias;
  torch::nn::Embedding embedding{nullptr};
  PositionalEncoding pos_encoding{nullptr};
  torch::nn::Sequential blks{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(TransformerEncoder);

/// d2l 1.0's `TransformerDecoderBlock(num_hiddens, ffn_num_hiddens,
/// num_heads, dropout, i)`, the i-th block of a decoder: self-attention over
/// the target so far (attention1, addnorm1), attention over the encoder's
/// outputs (attention2, addnorm2; its key and value widths are lazy, taken
/// from the encoder's outputs), then the FFN (ffn, addnorm3).
class TransformerDecoderBlockImpl : public torch::nn::Cloneable<TransformerDecoderBlockImpl> {
 public:
  TransformerDecoderBlockImpl(int64_t num_hiddens, int64_t ffn_num_hiddens, int64_t num_heads,
                              double dropout, int64_t i);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's forward(X, state): X (B, steps, num_hiddens) and the state
  /// [enc_outputs, enc_valid_lens, key_values] of TransformerDecoder::
  /// init_state. Block i's keys and values are its inputs so far,
  /// cat(state.key_values[i], X), stored back in the returned state. In
  /// training mode the self-attention masks with the book's dec_valid_lens =
  /// [1, ..., steps] per example; in evaluation mode it sees every key (one
  /// step at a time when decoding). In evaluation mode without autograd,
  /// where no attention weights are recorded (d2l::generate), the block
  /// keeps its inputs and their projected keys and values in state.cache
  /// (key_values[i] a view of them) and projects only X: the same outputs
  /// up to rounding (docs/transformer.md).
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state);

  int64_t num_hiddens;
  int64_t ffn_num_hiddens;
  int64_t num_heads;
  double dropout_p;
  int64_t i;
  MultiHeadAttention attention1{nullptr};
  AddNorm addnorm1{nullptr};
  MultiHeadAttention attention2{nullptr};
  AddNorm addnorm2{nullptr};
  PositionWiseFFN ffn{nullptr};
  AddNorm addnorm3{nullptr};

 private:
  friend class TransformerDecoderImpl;
  // forward; the encoder's entries of `state` are checked only with
  // `check_encoder` (TransformerDecoder checks them once for all blocks).
  std::tuple<torch::Tensor, DecoderState> forward_checked(const torch::Tensor& X,
                                                          const DecoderState& state,
                                                          bool check_encoder);
};
TORCH_MODULE(TransformerDecoderBlock);

/// d2l 1.0's `TransformerDecoder(vocab_size, num_hiddens, ffn_num_hiddens,
/// num_heads, num_blks, dropout)`: embedding * sqrt(num_hiddens), the
/// positional encoding, the blocks `blks.block<i>`, then `dense`
/// (LazyLinear(vocab_size)).
class TransformerDecoderImpl : public torch::nn::Cloneable<TransformerDecoderImpl>,
                               public d2l::Decoder {
 public:
  TransformerDecoderImpl(int64_t vocab_size, int64_t num_hiddens, int64_t ffn_num_hiddens,
                         int64_t num_heads, int64_t num_blks, double dropout);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's `init_state(enc_outputs, enc_valid_lens)` = [enc_outputs,
  /// enc_valid_lens, [None] * num_blks]: DecoderState::enc_outputs (a
  /// TransformerEncoder's output, batch-first), enc_valid_lens (B) or
  /// undefined, and key_values, one undefined entry per block.
  DecoderState init_state(const EncoderOutput& enc_outputs,
                          const torch::Tensor& enc_valid_lens = {}) override;
  /// X (B, steps) token ids -> (logits (B, steps, vocab_size), state). As in
  /// the book, each call adds positions 0, 1, ... to its own tokens.
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state) override;

  /// The book's `attention_weights` of the last forward call: [0][i] the
  /// self-attention weights of block i, (B * num_heads, steps, keys so far);
  /// [1][i] its encoder-decoder weights, (B * num_heads, steps, enc steps).
  std::array<std::vector<torch::Tensor>, 2> attention_weights() const;
  /// Block i of `blks`.
  TransformerDecoderBlock block(int64_t i) const;

  int64_t vocab_size;
  int64_t num_hiddens;
  int64_t ffn_num_hiddens;
  int64_t num_heads;
  int64_t num_blks;
  double dropout_p;
  torch::nn::Embedding embedding{nullptr};
  PositionalEncoding pos_encoding{nullptr};
  torch::nn::Sequential blks{nullptr};
  LazyLinear dense{nullptr};
};
TORCH_MODULE(TransformerDecoder);

}  // namespace d2l::v1
