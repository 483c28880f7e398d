// The book's Encoder, Decoder and AttentionDecoder interfaces and the
// EncoderDecoder module that chains an encoder and a decoder.

#include <d2l/encoder_decoder.h>

#include <fmt/format.h>

#include <c10/util/Type.h>

#include <typeinfo>
#include <utility>

#include "checked_load.h"
#include "checks.h"

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

template <typename Interface>
std::shared_ptr<torch::nn::Module> shared_module(const std::shared_ptr<Interface>& part,
                                                 const char* what, const char* interface) {
  TORCH_CHECK(part != nullptr,
              fmt::format("d2l::EncoderDecoder: {} must be a module, got nullptr", what));
  auto module = std::dynamic_pointer_cast<torch::nn::Module>(part);
  TORCH_CHECK(module != nullptr,
              fmt::format("d2l::EncoderDecoder: {0} must be a torch::nn::Module that implements "
                          "d2l::{1}, got a d2l::{1} of class {2} that is not a module; declare "
                          "it as `struct MyImpl : torch::nn::Cloneable<MyImpl>, d2l::{1}`",
                          what, interface, c10::demangle(typeid(*part).name())));
  return module;
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
  register_module("encoder", shared_module(encoder, "encoder", "Encoder"));
  register_module("decoder", shared_module(decoder, "decoder", "Decoder"));
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
  constexpr const char* fn = "d2l::EncoderDecoder";
  detail::check_strided_layout(fn, "enc_X", enc_X);
  detail::check_strided_layout(fn, "dec_X", dec_X);
  detail::check_strided_layout(fn, "enc_valid_lens", enc_valid_lens);
  TORCH_CHECK(enc_X.defined() && dec_X.defined() && enc_X.dim() == 2 && dec_X.dim() == 2 &&
                  enc_X.size(0) == dec_X.size(0),
              fmt::format("{}: enc_X and dec_X must be (batch_size, num_steps) "
                          "with the same batch size, got enc_X {} and dec_X {}",
                          fn, detail::shape_of(enc_X), detail::shape_of(dec_X)));
  // Against the model's device first: with the model on CUDA and one input
  // left on the CPU, the error names that input, not its neighbour.
  const auto params = parameters();
  if (!params.empty()) {
    const auto& ref = params.front();
    constexpr const char* ref_name = "the model's parameters";
    detail::check_same_device(fn, ref_name, ref, "enc_X", enc_X);
    detail::check_same_device(fn, ref_name, ref, "dec_X", dec_X);
    if (enc_valid_lens.defined()) {
      detail::check_same_device(fn, ref_name, ref, "enc_valid_lens", enc_valid_lens);
    }
  }
  if (enc_valid_lens.defined()) {
    // Checked here too: an encoder or decoder of the user's may not check it.
    TORCH_CHECK(enc_valid_lens.dim() == 1 && enc_valid_lens.size(0) == enc_X.size(0),
                fmt::format("{}: enc_valid_lens must have shape [batch_size={}], got {}", fn,
                            enc_X.size(0), detail::shape_of(enc_valid_lens)));
    detail::check_same_device(fn, "enc_X", enc_X, "enc_valid_lens", enc_valid_lens);
    detail::check_length_values(fn, "enc_valid_lens", enc_valid_lens);
  }
  const auto enc_outputs = encoder->forward(enc_X, enc_valid_lens);
  const auto dec_state = decoder->init_state(enc_outputs, enc_valid_lens);
  return decoder->forward(dec_X, dec_state);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void EncoderDecoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::EncoderDecoder::load");
}

}  // namespace d2l
