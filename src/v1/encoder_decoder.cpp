// d2l 1.0's EncoderDecoder and Seq2Seq (include/d2l/v1/encoder_decoder.h):
// the 0.17 module's checks and cloning, the logits alone as output, and the
// book's masked loss and Adam.

#include <d2l/v1/encoder_decoder.h>

#include <fmt/format.h>

#include <torch/nn/functional/loss.h>

#include <ostream>
#include <utility>

#include "../checked_load.h"
#include "../checks.h"
#include "../lazy_internal.h"
#include "../seq2seq/sequence_checks.h"

namespace d2l::v1 {

// ---------------------------------------------------------------------------
// EncoderDecoder

EncoderDecoderImpl::EncoderDecoderImpl(std::shared_ptr<Encoder> encoder_,
                                       std::shared_ptr<Decoder> decoder_)
    : encoder(std::move(encoder_)), decoder(std::move(decoder_)) {
  reset();
}

void EncoderDecoderImpl::reset() {
  constexpr const char* fn = "d2l::v1::EncoderDecoder";
  register_module("encoder", d2l::detail::module_of_encoder(fn, encoder));
  register_module("decoder", d2l::detail::module_of_decoder(fn, decoder));
}

void EncoderDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::v1::EncoderDecoder";
}

void EncoderDecoderImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::EncoderDecoder::load");
}

void EncoderDecoderImpl::clone_children(EncoderDecoderImpl& copy,
                                        const torch::optional<torch::Device>& device) const {
  auto encoder_module = encoder->as_module().clone(device);
  auto decoder_module = decoder->as_module().clone(device);
  copy.encoder = std::dynamic_pointer_cast<Encoder>(encoder_module);
  copy.decoder = std::dynamic_pointer_cast<Decoder>(decoder_module);
  TORCH_CHECK(copy.encoder && copy.decoder,
              "d2l::v1::EncoderDecoder::clone: clone() of the encoder or decoder returned a "
              "module that no longer implements d2l::Encoder or d2l::Decoder");
  copy.replace_module("encoder", std::move(encoder_module));
  copy.replace_module("decoder", std::move(decoder_module));
}

std::shared_ptr<torch::nn::Module> EncoderDecoderImpl::clone(
    const torch::optional<torch::Device>& device) const {
  // The copy constructor keeps the training mode and shares the children,
  // which are then swapped for deep copies.
  auto copy = std::make_shared<EncoderDecoderImpl>(*this);
  clone_children(*copy, device);
  return copy;
}

torch::Tensor EncoderDecoderImpl::forward(const torch::Tensor& enc_X, const torch::Tensor& dec_X,
                                          const torch::Tensor& enc_valid_lens) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  d2l::detail::check_encoder_decoder_inputs("d2l::v1::EncoderDecoder", *this, enc_X, dec_X,
                                            enc_valid_lens);
  const auto enc_all_outputs = encoder->forward(enc_X, enc_valid_lens);
  const auto dec_state = decoder->init_state(enc_all_outputs, enc_valid_lens);
  // Return decoder output only
  return std::get<0>(decoder->forward(dec_X, dec_state));
}

// ---------------------------------------------------------------------------
// Seq2Seq

Seq2SeqImpl::Seq2SeqImpl(std::shared_ptr<Encoder> encoder_, std::shared_ptr<Decoder> decoder_,
                         int64_t tgt_pad_, double lr_)
    : EncoderDecoderImpl(std::move(encoder_), std::move(decoder_)), tgt_pad(tgt_pad_), lr(lr_) {
  TORCH_CHECK(lr > 0, fmt::format("d2l::v1::Seq2Seq: lr must be positive, got {}", lr));
}

void Seq2SeqImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::v1::Seq2Seq(tgt_pad={}, lr={})", tgt_pad, lr);
}

std::shared_ptr<torch::nn::Module> Seq2SeqImpl::clone(
    const torch::optional<torch::Device>& device) const {
  auto copy = std::make_shared<Seq2SeqImpl>(*this);
  clone_children(*copy, device);
  return copy;
}

torch::Tensor Seq2SeqImpl::loss(const torch::Tensor& Y_hat, const torch::Tensor& Y) const {
  constexpr const char* fn = "d2l::v1::Seq2Seq::loss";
  d2l::detail::check_strided_layout(fn, "Y_hat", Y_hat);
  d2l::detail::check_strided_layout(fn, "Y", Y);
  TORCH_CHECK(
      Y_hat.defined() && Y.defined() && Y_hat.dim() == 3 && Y.dim() == 2 &&
          Y_hat.size(0) == Y.size(0) && Y_hat.size(1) == Y.size(1) && Y_hat.is_floating_point() &&
          at::isIntegralType(Y.scalar_type(), /*includeBool=*/false),
      fmt::format("{}: Y_hat must be floating logits (batch_size, num_steps, vocab_size) "
                  "and Y integer labels (batch_size, num_steps), got Y_hat {} {} and Y {} "
                  "{}",
                  fn, Y_hat.defined() ? c10::toString(Y_hat.scalar_type()) : "",
                  d2l::detail::shape_of(Y_hat), Y.defined() ? c10::toString(Y.scalar_type()) : "",
                  d2l::detail::shape_of(Y)));
  d2l::detail::check_same_device(fn, "Y_hat", Y_hat, "Y", Y);
  d2l::detail::check_class_labels(fn, "Y", Y, Y_hat.size(-1), "Y_hat's vocabulary");
  // Classifier.loss(Y_hat, Y, averaged=False), then the mean over the labels
  // that are not padding.
  const auto labels = Y.reshape({-1}).to(torch::kLong);
  const auto l = torch::nn::functional::cross_entropy(
      Y_hat.reshape({-1, Y_hat.size(-1)}), labels,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const auto mask = (labels != tgt_pad).to(l.scalar_type());
  return (l * mask).sum() / mask.sum();
}

std::unique_ptr<torch::optim::Adam> Seq2SeqImpl::configure_optimizers() {
  return std::make_unique<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(lr));
}

}  // namespace d2l::v1
