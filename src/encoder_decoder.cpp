#include <d2l/encoder_decoder.h>

#include <fmt/format.h>

#include <utility>

#include "checks.h"

namespace d2l {

EncoderDecoderImpl::EncoderDecoderImpl(std::shared_ptr<Encoder> encoder_,
                                       std::shared_ptr<Decoder> decoder_)
    : encoder(std::move(encoder_)), decoder(std::move(decoder_)) {
  reset();
}

void EncoderDecoderImpl::reset() {
  TORCH_CHECK(encoder != nullptr, "d2l::EncoderDecoder: encoder must be a module, got nullptr");
  TORCH_CHECK(decoder != nullptr, "d2l::EncoderDecoder: decoder must be a module, got nullptr");
  encoder = register_module("encoder", encoder);
  decoder = register_module("decoder", decoder);
}

void EncoderDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::EncoderDecoder";
}

std::shared_ptr<torch::nn::Module> EncoderDecoderImpl::clone(
    const torch::optional<torch::Device>& device) const {
  // The copy constructor keeps the training mode; the children it shares with
  // `this` are then swapped for deep copies.
  auto copy = std::make_shared<EncoderDecoderImpl>(*this);
  auto encoder_copy = std::dynamic_pointer_cast<Encoder>(encoder->clone(device));
  auto decoder_copy = std::dynamic_pointer_cast<Decoder>(decoder->clone(device));
  TORCH_INTERNAL_ASSERT(encoder_copy && decoder_copy,
                        "clone() of an encoder or decoder changed its type");
  copy->encoder = copy->replace_module("encoder", std::move(encoder_copy));
  copy->decoder = copy->replace_module("decoder", std::move(decoder_copy));
  return copy;
}

std::tuple<torch::Tensor, DecoderState> EncoderDecoderImpl::forward(
    const torch::Tensor& enc_X, const torch::Tensor& dec_X, const torch::Tensor& enc_valid_lens) {
  TORCH_CHECK(enc_X.defined() && dec_X.defined() && enc_X.dim() == 2 && dec_X.dim() == 2 &&
                  enc_X.size(0) == dec_X.size(0),
              fmt::format("d2l::EncoderDecoder: enc_X and dec_X must be (batch_size, num_steps) "
                          "with the same batch size, got enc_X {} and dec_X {}",
                          detail::shape_of(enc_X), detail::shape_of(dec_X)));
  const auto enc_outputs = encoder->forward(enc_X, enc_valid_lens);
  const auto dec_state = decoder->init_state(enc_outputs, enc_valid_lens);
  return decoder->forward(dec_X, dec_state);
}

}  // namespace d2l
