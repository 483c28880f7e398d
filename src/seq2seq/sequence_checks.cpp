#include "seq2seq/sequence_checks.h"

#include <ATen/Dispatch.h>
#include <c10/util/Type.h>
#include <fmt/format.h>

#include <algorithm>
#include <typeinfo>

#include "checks.h"

namespace d2l::detail {
namespace {

template <typename Interface>
std::shared_ptr<torch::nn::Module> shared_module(const char* fn,
                                                 const std::shared_ptr<Interface>& part,
                                                 const char* what, const char* interface) {
  TORCH_CHECK(part != nullptr, fmt::format("{}: {} must be a module, got nullptr", fn, what));
  auto module = std::dynamic_pointer_cast<torch::nn::Module>(part);
  TORCH_CHECK(module != nullptr,
              fmt::format("{0}: {1} must be a torch::nn::Module that implements "
                          "d2l::{2}, got a d2l::{2} of class {3} that is not a module; declare "
                          "it as `struct MyImpl : torch::nn::Cloneable<MyImpl>, d2l::{2}`",
                          fn, what, interface, c10::demangle(typeid(*part).name())));
  return module;
}

}  // namespace

void check_seq2seq_options(const char* fn, const Seq2SeqOptions& o) {
  TORCH_CHECK(o.vocab_size() > 0 && o.embed_size() > 0 && o.num_hiddens() > 0 && o.num_layers() > 0,
              fmt::format("{}: vocab_size, embed_size, num_hiddens and num_layers must be "
                          "positive, got vocab_size={}, embed_size={}, num_hiddens={}, "
                          "num_layers={}",
                          fn, o.vocab_size(), o.embed_size(), o.num_hiddens(), o.num_layers()));
  TORCH_CHECK(o.dropout() >= 0 && o.dropout() <= 1,
              fmt::format("{}: dropout must be a probability in [0, 1], got {}", fn, o.dropout()));
}

std::string describe_seq2seq(const char* fn, const Seq2SeqOptions& o) {
  return fmt::format("{}(vocab_size={}, embed_size={}, num_hiddens={}, num_layers={}, dropout={})",
                     fn, o.vocab_size(), o.embed_size(), o.num_hiddens(), o.num_layers(),
                     o.dropout());
}

void check_hidden_state(const char* fn, const char* name, const torch::Tensor& state,
                        int64_t batch, const Seq2SeqOptions& o, const torch::nn::GRU& rnn,
                        const char* rnn_name) {
  check_strided_layout(fn, name, state);
  TORCH_CHECK(
      state.defined() && state.dim() == 3 && state.size(0) == o.num_layers() &&
          state.size(1) == batch && state.size(2) == o.num_hiddens(),
      fmt::format("{}: {} must have shape [num_layers={}, batch_size={}, num_hiddens={}], "
                  "got {}",
                  fn, name, o.num_layers(), batch, o.num_hiddens(), shape_of(state)));
  const torch::Tensor weight = rnn->named_parameters(false)["weight_hh_l0"];
  const std::string weight_name = std::string(rnn_name) + ".weight_hh_l0";
  check_same_device(fn, weight_name.c_str(), weight, name, state);
  check_same_dtype(fn, weight_name.c_str(), weight, name, state);
}

void check_encoder_output(const char* fn, const EncoderOutput& enc, const Seq2SeqOptions& o,
                          const torch::nn::GRU& rnn, const char* rnn_name) {
  check_strided_layout(fn, "enc_outputs.outputs", enc.outputs);
  check_strided_layout(fn, "enc_outputs.hidden_state", enc.hidden_state);
  TORCH_CHECK(enc.outputs.defined() && enc.outputs.dim() == 3 && enc.outputs.size(0) > 0 &&
                  enc.outputs.size(2) == o.num_hiddens(),
              fmt::format("{}: enc_outputs.outputs must have shape [num_steps, batch_size, "
                          "num_hiddens={}] with at least one step, got {}",
                          fn, o.num_hiddens(), shape_of(enc.outputs)));
  check_hidden_state(fn, "enc_outputs.hidden_state", enc.hidden_state, enc.outputs.size(1), o, rnn,
                     rnn_name);
  check_same_dtype(fn, "enc_outputs.hidden_state", enc.hidden_state, "enc_outputs.outputs",
                   enc.outputs);
  check_same_device(fn, "enc_outputs.hidden_state", enc.hidden_state, "enc_outputs.outputs",
                    enc.outputs);
}

std::shared_ptr<torch::nn::Module> module_of_encoder(const char* fn,
                                                     const std::shared_ptr<Encoder>& part) {
  return shared_module(fn, part, "encoder", "Encoder");
}

std::shared_ptr<torch::nn::Module> module_of_decoder(const char* fn,
                                                     const std::shared_ptr<Decoder>& part) {
  return shared_module(fn, part, "decoder", "Decoder");
}

void check_encoder_decoder_inputs(const char* fn, const torch::nn::Module& model,
                                  const torch::Tensor& enc_X, const torch::Tensor& dec_X,
                                  const torch::Tensor& enc_valid_lens) {
  check_strided_layout(fn, "enc_X", enc_X);
  check_strided_layout(fn, "dec_X", dec_X);
  check_strided_layout(fn, "enc_valid_lens", enc_valid_lens);
  TORCH_CHECK(enc_X.defined() && dec_X.defined() && enc_X.dim() == 2 && dec_X.dim() == 2 &&
                  enc_X.size(0) == dec_X.size(0),
              fmt::format("{}: enc_X and dec_X must be (batch_size, num_steps) "
                          "with the same batch size, got enc_X {} and dec_X {}",
                          fn, shape_of(enc_X), shape_of(dec_X)));
  // Against the model's device first: with the model on CUDA and one input
  // left on the CPU, the error names that input, not its neighbour.
  const auto params = model.parameters();
  if (!params.empty()) {
    const auto& ref = params.front();
    constexpr const char* ref_name = "the model's parameters";
    check_same_device(fn, ref_name, ref, "enc_X", enc_X);
    check_same_device(fn, ref_name, ref, "dec_X", dec_X);
    if (enc_valid_lens.defined()) {
      check_same_device(fn, ref_name, ref, "enc_valid_lens", enc_valid_lens);
    }
  }
  if (enc_valid_lens.defined()) {
    // Checked here too: an encoder or decoder of the user's may not check it.
    TORCH_CHECK(enc_valid_lens.dim() == 1 && enc_valid_lens.size(0) == enc_X.size(0),
                fmt::format("{}: enc_valid_lens must have shape [batch_size={}], got {}", fn,
                            enc_X.size(0), shape_of(enc_valid_lens)));
    check_same_device(fn, "enc_X", enc_X, "enc_valid_lens", enc_valid_lens);
    check_length_values(fn, "enc_valid_lens", enc_valid_lens);
  }
}

torch::Tensor checked_tokens(const char* fn, const torch::Tensor& X,
                             const torch::nn::Embedding& embedding) {
  check_strided_layout(fn, "X", X);
  TORCH_CHECK(X.defined() && X.dim() == 2 && X.size(0) > 0 && X.size(1) > 0,
              fmt::format("{}: X must be a 2-D tensor (batch_size, num_steps) of token ids with "
                          "at least one example and one step, got {}",
                          fn, shape_of(X)));
  TORCH_CHECK(at::isIntegralType(X.scalar_type(), /*includeBool=*/false),
              fmt::format("{}: X must hold integer token ids, got dtype {}", fn,
                          c10::toString(X.scalar_type())));
  check_same_device(fn, "embedding.weight", embedding->weight, "X", X);
  const int64_t vocab_size = embedding->options.num_embeddings();
  int64_t min_id = 0, max_id = 0;
  if (X.device().is_cpu()) {
    // Read in place: a decoding step's few ids cost less than one ATen call.
    const auto ids = X.contiguous();
    AT_DISPATCH_INTEGRAL_TYPES(ids.scalar_type(), "d2l::checked_tokens", [&] {
      const scalar_t* p = ids.data_ptr<scalar_t>();
      const auto [lo, hi] = std::minmax_element(p, p + ids.numel());
      min_id = static_cast<int64_t>(*lo);
      max_id = static_cast<int64_t>(*hi);
    });
  } else {
    const auto [lo, hi] = torch::aminmax(X);
    min_id = lo.item<int64_t>();
    max_id = hi.item<int64_t>();
  }
  TORCH_CHECK(min_id >= 0 && max_id < vocab_size,
              fmt::format("{}: X must hold token ids in [0, vocab_size={}), got ids from {} to {}",
                          fn, vocab_size, min_id, max_id));
  return X.scalar_type() == torch::kLong ? X : X.to(torch::kLong);
}

void check_enc_valid_lens(const char* fn, const char* name, const torch::Tensor& lens,
                          int64_t batch, const torch::Tensor& ref, const char* ref_name) {
  if (!lens.defined()) return;
  check_strided_layout(fn, name, lens);
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == batch,
              fmt::format("{}: {} must have shape [batch_size={}], got {}", fn, name, batch,
                          shape_of(lens)));
  check_same_device(fn, ref_name, ref, name, lens);
  check_length_values(fn, name, lens);
}

}  // namespace d2l::detail
