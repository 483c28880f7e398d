// The book's Encoder, Decoder and AttentionDecoder interfaces and the
// EncoderDecoder module that chains an encoder and a decoder.

#include <d2l/encoder_decoder.h>

#include <fmt/format.h>

#include <c10/util/Type.h>

#include <typeinfo>
#include <utility>

#include "checked_load.h"
#include "checks.h"
#include "seq2seq/sequence_checks.h"

namespace d2l {
namespace {

// The interfaces do not derive from torch::nn::Module (see Encoder); the
// classes that implement them do, so the module is a cross-cast away.
template <typename Interface>
torch::nn::Module& module_of(Interface* part, const char* interface) {
  auto* module = dynamic_cast<torch::nn::Module*>(part);
  TORCH_CHECK(module != nullptr,
              fmt::format("d2l::{0}::as_module: this d2l::{0} (class {1}) is not a "
                          "torch::nn::Module; declare it as "
                          "`struct MyImpl : torch::nn::Cloneable<MyImpl>, d2l::{0}`",
                          interface, c10::demangle(typeid(*part).name())));
  return *module;
}

}  // namespace

torch::nn::Module& Encoder::as_module() { return module_of(this, "Encoder"); }
const torch::nn::Module& Encoder::as_module() const {
  return module_of(const_cast<Encoder*>(this), "Encoder");
}
torch::nn::Module& Decoder::as_module() { return module_of(this, "Decoder"); }
const torch::nn::Module& Decoder::as_module() const {
  return module_of(const_cast<Decoder*>(this), "Decoder");
}

EncoderDecoderImpl::EncoderDecoderImpl(std::shared_ptr<Encoder> encoder_,
                                       std::shared_ptr<Decoder> decoder_)
    : encoder(std::move(encoder_)), decoder(std::move(decoder_)) {
  reset();
}

void EncoderDecoderImpl::reset() {
  constexpr const char* fn = "d2l::EncoderDecoder";
  register_module("encoder", detail::module_of_encoder(fn, encoder));
  register_module("decoder", detail::module_of_decoder(fn, decoder));
}

void EncoderDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::EncoderDecoder";
}

std::shared_ptr<torch::nn::Module> EncoderDecoderImpl::clone(
    const torch::optional<torch::Device>& device) const {
  // The copy constructor keeps the training mode; the children it shares with
  // `this` are then swapped for deep copies.
  auto copy = std::make_shared<EncoderDecoderImpl>(*this);
  auto encoder_module = encoder->as_module().clone(device);
  auto decoder_module = decoder->as_module().clone(device);
  copy->encoder = std::dynamic_pointer_cast<Encoder>(encoder_module);
  copy->decoder = std::dynamic_pointer_cast<Decoder>(decoder_module);
  TORCH_CHECK(copy->encoder && copy->decoder,
              "d2l::EncoderDecoder::clone: clone() of the encoder or decoder returned a module "
              "that no longer implements d2l::Encoder or d2l::Decoder");
  copy->replace_module("encoder", std::move(encoder_module));
  copy->replace_module("decoder", std::move(decoder_module));
  return copy;
}

std::tuple<torch::Tensor, DecoderState> EncoderDecoderImpl::forward(
    const torch::Tensor& enc_X, const torch::Tensor& dec_X, const torch::Tensor& enc_valid_lens) {
  detail::check_encoder_decoder_inputs("d2l::EncoderDecoder", *this, enc_X, dec_X, enc_valid_lens);
  const auto enc_outputs = encoder->forward(enc_X, enc_valid_lens);
  const auto dec_state = decoder->init_state(enc_outputs, enc_valid_lens);
  return decoder->forward(dec_X, dec_state);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void EncoderDecoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::EncoderDecoder::load");
}

}  // namespace d2l
