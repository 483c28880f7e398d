#pragma once

// The book's Transformer (d2l 0.17, sections "Self-Attention and Positional
// Encoding" and "Transformer"): PositionalEncoding, PositionWiseFFN, AddNorm,
// EncoderBlock, TransformerEncoder, DecoderBlock and TransformerDecoder, with
// the book's constructor arguments in the book's order and its submodule
// names, so that the state_dict of the book's Python model loads key for key
// (`encoder.blks.block0.attention.W_q.weight`, `decoder.blks.block1.addnorm3.ln.bias`, ...).
// They work in d2l::EncoderDecoder through the Encoder and Decoder interfaces.
//
// Differences from the book (README, "Differences from the book"):
// - PositionalEncoding adds its table in the input's dtype (the book adds its
//   float32 table, which promotes a float16 or bfloat16 input to float32; a
//   float64 input gets the same values either way).
// - TransformerDecoder in evaluation mode without autograd keeps, per block,
//   its self-attention's keys and values projected once
//   (MultiHeadAttention::forward_cached), in buffers that grow by doubling:
//   a decoding step projects only its own tokens and copies nothing of the
//   past (the book concatenates and re-projects every past step). The book's
//   `state[2][i]`, the block's inputs so far, is still kept in
//   DecoderState::key_values.
// - TransformerBlockOptions::causal masks the decoder's self-attention in
//   evaluation mode too; the encoder and the decoder take LibTorch's masks
//   (AttentionMask) beside the book's lengths.

#include <d2l/encoder_decoder.h>
#include <d2l/multi_head_attention.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <tuple>
#include <vector>

namespace d2l {

// ---------------------------------------------------------------------------
// PositionalEncoding

/// The book's `PositionalEncoding(num_hiddens, dropout, max_len=1000)`:
/// X (B, n, num_hiddens) -> dropout(X + P[:, :n, :]), with
/// P[0, i, 2j] = sin(i / 10000^(2j / num_hiddens)) and P[0, i, 2j + 1] the cosine.
/// `P` is computed once, in float32 as the book does, and (as in the book) is
/// neither a parameter nor a buffer: it is not in the state_dict.
class PositionalEncodingImpl : public torch::nn::Cloneable<PositionalEncodingImpl> {
 public:
  PositionalEncodingImpl(int64_t num_hiddens, double dropout, int64_t max_len = 1000);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// X (B, n, num_hiddens) with n <= max_len, floating point.
  torch::Tensor forward(const torch::Tensor& X);

  int64_t num_hiddens;
  double dropout_p;
  int64_t max_len;
  /// (1, max_len, num_hiddens), float32, on the CPU.
  torch::Tensor P;
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(PositionalEncoding);

// ---------------------------------------------------------------------------
// PositionWiseFFN and AddNorm

/// The book's `PositionWiseFFN(ffn_num_input, ffn_num_hiddens, ffn_num_outputs)`:
/// dense2(relu(dense1(X))) on the last dimension.
class PositionWiseFFNImpl : public torch::nn::Cloneable<PositionWiseFFNImpl> {
 public:
  PositionWiseFFNImpl(int64_t ffn_num_input, int64_t ffn_num_hiddens, int64_t ffn_num_outputs);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& X);

  int64_t ffn_num_input, ffn_num_hiddens, ffn_num_outputs;
  torch::nn::Linear dense1{nullptr};
  torch::nn::ReLU relu{nullptr};
  torch::nn::Linear dense2{nullptr};
};
TORCH_MODULE(PositionWiseFFN);

/// The book's `AddNorm(normalized_shape, dropout)`: ln(dropout(Y) + X).
class AddNormImpl : public torch::nn::Cloneable<AddNormImpl> {
 public:
  AddNormImpl(std::vector<int64_t> normalized_shape, double dropout);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// X and Y of the same shape, ending in normalized_shape.
  torch::Tensor forward(const torch::Tensor& X, const torch::Tensor& Y);

  std::vector<int64_t> normalized_shape;
  double dropout_p;
  torch::nn::Dropout dropout{nullptr};
  torch::nn::LayerNorm ln{nullptr};
};
/// The holder of AddNormImpl, as TORCH_MODULE(AddNorm) makes it, with the book's
/// constructor spelled out so that a braced shape works as the book's list
/// does: `d2l::AddNorm({3, 4}, 0.5)`.
class AddNorm : public torch::nn::ModuleHolder<AddNormImpl> {
 public:
  using torch::nn::ModuleHolder<AddNormImpl>::ModuleHolder;
  using Impl = AddNormImpl;
  AddNorm(std::vector<int64_t> normalized_shape, double dropout)
      : torch::nn::ModuleHolder<AddNormImpl>(std::make_shared<AddNormImpl>(std::move(normalized_shape), dropout)) {}
};

// ---------------------------------------------------------------------------
// Blocks

/// The arguments the book's EncoderBlock and DecoderBlock share, in its order.
struct TransformerBlockOptions {
  TransformerBlockOptions(int64_t key_size, int64_t query_size, int64_t value_size,
                          int64_t num_hiddens, std::vector<int64_t> norm_shape,
                          int64_t ffn_num_input, int64_t ffn_num_hiddens, int64_t num_heads);
  TORCH_ARG(int64_t, key_size);
  TORCH_ARG(int64_t, query_size);
  TORCH_ARG(int64_t, value_size);
  /// Width of the attention's projections and of the block's output.
  TORCH_ARG(int64_t, num_hiddens);
  /// AddNorm's normalized_shape; the book passes [num_hiddens].
  TORCH_ARG(std::vector<int64_t>, norm_shape);
  TORCH_ARG(int64_t, ffn_num_input);
  TORCH_ARG(int64_t, ffn_num_hiddens);
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(double, dropout) = 0.0;
  /// Whether the attention's projections have biases (the book's use_bias;
  /// its DecoderBlock has none, so the positional constructors pass false).
  TORCH_ARG(bool, use_bias) = false;
  /// Decoder blocks: whether the self-attention masks later positions in
  /// evaluation mode too, so that a whole target run at once gives what
  /// decoding it step by step gives (query i sees the keys up to its own,
  /// AttentionMask::is_causal). The book masks only in training (with
  /// dec_valid_lens = 1..steps, which training keeps either way): off.
  TORCH_ARG(bool, causal) = false;
};

/// The book's `EncoderBlock`: Y = addnorm1(X, attention(X, X, X, valid_lens));
/// addnorm2(Y, ffn(Y)).
class EncoderBlockImpl : public torch::nn::Cloneable<EncoderBlockImpl> {
 public:
  EncoderBlockImpl(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
                   std::vector<int64_t> norm_shape, int64_t ffn_num_input, int64_t ffn_num_hiddens,
                   int64_t num_heads, double dropout, bool use_bias = false);
  explicit EncoderBlockImpl(const TransformerBlockOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (B, n, num_hiddens); `mask` goes to the self-attention: the book's
  /// valid_lens, (B) or (B, n), or any AttentionMask.
  torch::Tensor forward(const torch::Tensor& X, const AttentionMask& mask = {});

  TransformerBlockOptions options;
  MultiHeadAttention attention{nullptr};
  AddNorm addnorm1{nullptr};
  PositionWiseFFN ffn{nullptr};
  AddNorm addnorm2{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(AttentionMask())})
};
/// The holder of EncoderBlockImpl, as TORCH_MODULE(EncoderBlock) makes it, with the book's
/// constructor spelled out so that a braced shape works as the book's list
/// does: `d2l::EncoderBlock(24, 24, 24, 24, {100, 24}, 24, 48, 8, 0.5)`.
class EncoderBlock : public torch::nn::ModuleHolder<EncoderBlockImpl> {
 public:
  using torch::nn::ModuleHolder<EncoderBlockImpl>::ModuleHolder;
  using Impl = EncoderBlockImpl;
  EncoderBlock(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
      std::vector<int64_t> norm_shape, int64_t ffn_num_input, int64_t ffn_num_hiddens,
      int64_t num_heads, double dropout, bool use_bias = false)
      : torch::nn::ModuleHolder<EncoderBlockImpl>(std::make_shared<EncoderBlockImpl>(key_size, query_size, value_size, num_hiddens, std::move(norm_shape),
                                                ffn_num_input, ffn_num_hiddens, num_heads, dropout, use_bias)) {}
};

/// The book's `DecoderBlock(..., dropout, i)`, the i-th block of a decoder:
/// masked self-attention over the target so far (attention1, addnorm1),
/// attention over the encoder's outputs (attention2, addnorm2), then the FFN
/// (ffn, addnorm3). It reads and extends block i's entries of the state.
class DecoderBlockImpl : public torch::nn::Cloneable<DecoderBlockImpl> {
 public:
  DecoderBlockImpl(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
                   std::vector<int64_t> norm_shape, int64_t ffn_num_input, int64_t ffn_num_hiddens,
                   int64_t num_heads, double dropout, int64_t i);
  DecoderBlockImpl(const TransformerBlockOptions& options_, int64_t i);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (B, steps, num_hiddens) and a state from TransformerDecoder::init_state
  /// (or from the previous call). In training mode, as in the book, the
  /// self-attention sees the block's inputs so far with the causal lengths
  /// 1..steps; in evaluation mode it sees them all (one step at a time when
  /// decoding), or with options.causal() those up to its own position. The
  /// encoder-decoder attention masks state.enc_valid_lens and
  /// state.enc_key_padding_mask. Returns the block's output and the state with block i's
  /// entries extended by X.
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X, const DecoderState& state);

  TransformerBlockOptions options;
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
  // `check_encoder` (TransformerDecoder checks them once for all its blocks).
  std::tuple<torch::Tensor, DecoderState> forward_checked(const torch::Tensor& X,
                                                          const DecoderState& state,
                                                          bool check_encoder);
};
/// The holder of DecoderBlockImpl, as TORCH_MODULE(DecoderBlock) makes it, with the book's
/// constructor spelled out so that a braced shape works as the book's list
/// does: `d2l::DecoderBlock(24, 24, 24, 24, {100, 24}, 24, 48, 8, 0.5, 0)`.
class DecoderBlock : public torch::nn::ModuleHolder<DecoderBlockImpl> {
 public:
  using torch::nn::ModuleHolder<DecoderBlockImpl>::ModuleHolder;
  using Impl = DecoderBlockImpl;
  DecoderBlock(int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
      std::vector<int64_t> norm_shape, int64_t ffn_num_input, int64_t ffn_num_hiddens,
      int64_t num_heads, double dropout, int64_t i)
      : torch::nn::ModuleHolder<DecoderBlockImpl>(std::make_shared<DecoderBlockImpl>(key_size, query_size, value_size, num_hiddens, std::move(norm_shape),
                                                ffn_num_input, ffn_num_hiddens, num_heads, dropout, i)) {}
};

// ---------------------------------------------------------------------------
// Encoder and decoder

/// The book's TransformerEncoder and TransformerDecoder arguments: the
/// vocabulary, a block's arguments and the number of blocks.
struct TransformerOptions {
  TransformerOptions(int64_t vocab_size, TransformerBlockOptions block, int64_t num_layers);
  TORCH_ARG(int64_t, vocab_size);
  TORCH_ARG(TransformerBlockOptions, block);
  TORCH_ARG(int64_t, num_layers);
  /// The positional table's length, the longest sequence (the book's 1000).
  TORCH_ARG(int64_t, max_len) = 1000;
};

/// The book's `TransformerEncoder(vocab_size, key_size, query_size, value_size,
/// num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads,
/// num_layers, dropout, use_bias=False)`: embedding * sqrt(num_hiddens), the
/// positional encoding, then the blocks `blks.block0`, `blks.block1`, ...
/// Its EncoderOutput holds the last block's output batch-first,
/// (B, n, num_hiddens); `hidden_state` is undefined.
class TransformerEncoderImpl : public torch::nn::Cloneable<TransformerEncoderImpl>,
                               public Encoder {
 public:
  TransformerEncoderImpl(int64_t vocab_size, int64_t key_size, int64_t query_size,
                         int64_t value_size, int64_t num_hiddens, std::vector<int64_t> norm_shape,
                         int64_t ffn_num_input, int64_t ffn_num_hiddens, int64_t num_heads,
                         int64_t num_layers, double dropout, bool use_bias = false);
  explicit TransformerEncoderImpl(const TransformerOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// X (B, n) token ids; valid_lens (B) or undefined.
  EncoderOutput forward(const torch::Tensor& X, const torch::Tensor& valid_lens = {}) override;
  /// X (B, n) token ids and the source mask, passed to every block's
  /// self-attention: valid_lens (B), key_padding_mask (B, n),
  /// attn_mask (n, n), (B, n, n) or (B * num_heads, n, n), is_causal
  /// (AttentionMask). forward(X, valid_lens) is forward_masked(X,
  /// valid_lens). The decoder's init_state takes the same mask for its
  /// encoder-decoder attention. A name of its own, where the blocks' forward
  /// takes the mask: forward(X, valid_lens) is the book's Encoder interface,
  /// which users' encoders implement, and AnyModule needs one forward.
  EncoderOutput forward_masked(const torch::Tensor& X, const AttentionMask& mask);
  /// Which path forward_masked(X, mask) takes, computing nothing: "fused_pass"
  /// (one pass; docs/transformer.md) or "blocks" with "fused_pass: <why not>".
  PathExplanation explain_forward(const torch::Tensor& X, const AttentionMask& mask = {}) const;

  /// The book's `attention_weights`: per block, the per-head weights of the
  /// last forward call, (B * num_heads, n, n) (undefined where the blocks'
  /// attention records none).
  std::vector<torch::Tensor> attention_weights() const;

  /// Block i of `blks`.
  EncoderBlock block(int64_t i) const;

  TransformerOptions options;
  torch::nn::Embedding embedding{nullptr};
  PositionalEncoding pos_encoding{nullptr};
  torch::nn::Sequential blks{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())})
};
/// The holder of TransformerEncoderImpl, as TORCH_MODULE(TransformerEncoder) makes it, with the book's
/// constructor spelled out so that a braced shape works as the book's list
/// does: `d2l::TransformerEncoder(200, 24, 24, 24, 24, {24}, 24, 48, 8, 2, 0.5)`.
class TransformerEncoder : public torch::nn::ModuleHolder<TransformerEncoderImpl> {
 public:
  using torch::nn::ModuleHolder<TransformerEncoderImpl>::ModuleHolder;
  using Impl = TransformerEncoderImpl;
  TransformerEncoder(int64_t vocab_size, int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
      std::vector<int64_t> norm_shape, int64_t ffn_num_input, int64_t ffn_num_hiddens,
      int64_t num_heads, int64_t num_layers, double dropout, bool use_bias = false)
      : torch::nn::ModuleHolder<TransformerEncoderImpl>(std::make_shared<TransformerEncoderImpl>(vocab_size, key_size, query_size, value_size, num_hiddens, std::move(norm_shape),
                                                ffn_num_input, ffn_num_hiddens, num_heads, num_layers, dropout, use_bias)) {}
};

/// The book's `TransformerDecoder(vocab_size, key_size, query_size, value_size,
/// num_hiddens, norm_shape, ffn_num_input, ffn_num_hiddens, num_heads,
/// num_layers, dropout)`: embedding * sqrt(num_hiddens), the positional
/// encoding (at the positions after those already decoded, when decoding step
/// by step), the blocks `blks.block<i>`, then `dense` to the vocabulary.
class TransformerDecoderImpl : public torch::nn::Cloneable<TransformerDecoderImpl>,
                               public AttentionDecoder {
 public:
  TransformerDecoderImpl(int64_t vocab_size, int64_t key_size, int64_t query_size,
                         int64_t value_size, int64_t num_hiddens, std::vector<int64_t> norm_shape,
                         int64_t ffn_num_input, int64_t ffn_num_hiddens, int64_t num_heads,
                         int64_t num_layers, double dropout);
  explicit TransformerDecoderImpl(const TransformerOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's `init_state(enc_outputs, enc_valid_lens)`: a TransformerEncoder's
  /// output (batch-first) and its valid lengths (B) or undefined.
  DecoderState init_state(const EncoderOutput& enc_outputs,
                          const torch::Tensor& enc_valid_lens = {}) override;
  /// init_state with the encoder's source mask (as given to
  /// TransformerEncoder::forward): its key-side parts, valid_lens (B) and
  /// key_padding_mask (B, num_enc_steps), mask the encoder-decoder attention
  /// of every step (DecoderState::enc_valid_lens, enc_key_padding_mask); its
  /// attn_mask and is_causal are about the encoder's own queries and are not
  /// used here.
  DecoderState init_state(const EncoderOutput& enc_outputs, const AttentionMask& src_mask);
  /// X (B, steps) token ids.
  std::tuple<torch::Tensor, DecoderState> forward(const torch::Tensor& X,
                                                  const DecoderState& state) override;
  /// Which path forward(X, state) takes, computing nothing: "fused_step" (one
  /// pass; docs/transformer.md) or "blocks" with "fused_step: <why not>".
  PathExplanation explain_step(const torch::Tensor& X, const DecoderState& state) const;

  /// The book's `attention_weights` of the last forward call: [0][i] the
  /// self-attention weights of block i, (B * num_heads, steps, keys so far);
  /// [1][i] its encoder-decoder weights, (B * num_heads, steps, enc steps).
  std::array<std::vector<torch::Tensor>, 2> block_attention_weights() const;
  /// The encoder-decoder weights of every block and head, example first:
  /// (B, num_layers * num_heads, steps, enc steps), block-major; undefined
  /// where the blocks' attention records none. predict_seq2seq keeps its
  /// [0] of every decoding step.
  torch::Tensor attention_weights() const override;

  /// Block i of `blks`.
  DecoderBlock block(int64_t i) const;

  TransformerOptions options;
  torch::nn::Embedding embedding{nullptr};
  PositionalEncoding pos_encoding{nullptr};
  torch::nn::Sequential blks{nullptr};
  torch::nn::Linear dense{nullptr};
};
/// The holder of TransformerDecoderImpl, as TORCH_MODULE(TransformerDecoder) makes it, with the book's
/// constructor spelled out so that a braced shape works as the book's list
/// does: `d2l::TransformerDecoder(200, 24, 24, 24, 24, {24}, 24, 48, 8, 2, 0.5)`.
class TransformerDecoder : public torch::nn::ModuleHolder<TransformerDecoderImpl> {
 public:
  using torch::nn::ModuleHolder<TransformerDecoderImpl>::ModuleHolder;
  using Impl = TransformerDecoderImpl;
  TransformerDecoder(int64_t vocab_size, int64_t key_size, int64_t query_size, int64_t value_size, int64_t num_hiddens,
      std::vector<int64_t> norm_shape, int64_t ffn_num_input, int64_t ffn_num_hiddens,
      int64_t num_heads, int64_t num_layers, double dropout)
      : torch::nn::ModuleHolder<TransformerDecoderImpl>(std::make_shared<TransformerDecoderImpl>(vocab_size, key_size, query_size, value_size, num_hiddens, std::move(norm_shape),
                                                ffn_num_input, ffn_num_hiddens, num_heads, num_layers, dropout)) {}
};

}  // namespace d2l
