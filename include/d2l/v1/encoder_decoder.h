#pragma once

// d2l 1.0's encoder-decoder architecture (d2l.ai, sections "The
// Encoder-Decoder Architecture" and "Sequence-to-Sequence Learning for
// Machine Translation"): the Encoder and Decoder interfaces, which are
// 0.17's, EncoderDecoder, whose forward returns the logits only, and
// Seq2Seq, which adds the book's hyper-parameters, masked loss and Adam.

#include <d2l/encoder_decoder.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/adam.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>

namespace d2l::v1 {

// The same interfaces in both editions: forward(X, *args) for an encoder,
// init_state(enc_all_outputs, *args) and forward(X, state) for a decoder.
using d2l::Decoder;
using d2l::DecoderState;
using d2l::Encoder;
using d2l::EncoderOutput;

/// d2l 1.0's `EncoderDecoder(encoder, decoder)`: forward(enc_X, dec_X,
/// *args) runs `dec_state = decoder.init_state(encoder(enc_X, *args),
/// *args)` and returns `decoder(dec_X, dec_state)[0]`, the logits only
/// (0.17's returns the state too). Parameters are named `encoder.*` and
/// `decoder.*`, as in the book's state_dict.
class EncoderDecoderImpl : public torch::nn::Cloneable<EncoderDecoderImpl> {
 public:
  /// `encoder` and `decoder` must also be torch::nn::Modules (see
  /// d2l::Encoder); they are registered as "encoder" and "decoder".
  EncoderDecoderImpl(std::shared_ptr<Encoder> encoder, std::shared_ptr<Decoder> decoder);

  /// Accepts module holders directly: `EncoderDecoder(TransformerEncoder(...),
  /// TransformerDecoder(...))`.
  template <typename E, typename D>
  EncoderDecoderImpl(const torch::nn::ModuleHolder<E>& encoder,
                     const torch::nn::ModuleHolder<D>& decoder)
      : EncoderDecoderImpl(std::shared_ptr<Encoder>(encoder.ptr()),
                           std::shared_ptr<Decoder>(decoder.ptr())) {}

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Deep copy, through the encoder's and decoder's own clone().
  std::shared_ptr<torch::nn::Module> clone(
      const torch::optional<torch::Device>& device = torch::nullopt) const override;

  /// enc_X (B, num_enc_steps) and dec_X (B, num_dec_steps) token ids;
  /// enc_valid_lens (B) or undefined. Returns the decoder's output, for the
  /// book's decoders the logits (B, num_dec_steps, vocab_size).
  torch::Tensor forward(const torch::Tensor& enc_X, const torch::Tensor& dec_X,
                        const torch::Tensor& enc_valid_lens = {});

  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<Decoder> decoder;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({2, torch::nn::AnyValue(torch::Tensor())})
  /// `copy` (a copy of *this) with deep copies of the encoder and decoder.
  void clone_children(EncoderDecoderImpl& copy, const torch::optional<torch::Device>& device) const;
};
TORCH_MODULE(EncoderDecoder);

/// d2l 1.0's `Seq2Seq(encoder, decoder, tgt_pad, lr)`: an EncoderDecoder
/// with the book's loss and optimizer.
class Seq2SeqImpl : public EncoderDecoderImpl {
 public:
  Seq2SeqImpl(std::shared_ptr<Encoder> encoder, std::shared_ptr<Decoder> decoder, int64_t tgt_pad,
              double lr);
  template <typename E, typename D>
  Seq2SeqImpl(const torch::nn::ModuleHolder<E>& encoder, const torch::nn::ModuleHolder<D>& decoder,
              int64_t tgt_pad, double lr)
      : Seq2SeqImpl(std::shared_ptr<Encoder>(encoder.ptr()),
                    std::shared_ptr<Decoder>(decoder.ptr()), tgt_pad, lr) {}

  void pretty_print(std::ostream& stream) const override;
  std::shared_ptr<torch::nn::Module> clone(
      const torch::optional<torch::Device>& device = torch::nullopt) const override;

  /// The section's masked loss: the cross-entropy of Y_hat (B, steps,
  /// vocab_size) against the labels Y (B, steps), averaged over the labels
  /// that are not tgt_pad. (d2l 1.0.3's torch.py leaves this method out,
  /// so the package's d2l.Seq2Seq averages over every label, padding
  /// included: Classifier.loss.)
  torch::Tensor loss(const torch::Tensor& Y_hat, const torch::Tensor& Y) const;
  /// The book's configure_optimizers: Adam(parameters(), lr). Built before
  /// the first batch, it holds the lazy layers' parameters, which the first
  /// forward fills in place.
  std::unique_ptr<torch::optim::Adam> configure_optimizers();

  int64_t tgt_pad;
  double lr;
};
TORCH_MODULE(Seq2Seq);

}  // namespace d2l::v1
