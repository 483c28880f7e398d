#pragma once

// Checks of the token ids and source lengths that the sequence-to-sequence
// modules (src/seq2seq/, src/transformer/, src/v1/) take, and of the parts and
// inputs of both editions' EncoderDecoder.

#include <d2l/encoder_decoder.h>
#include <d2l/seq2seq.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/types.h>

#include <memory>
#include <string>

namespace d2l::detail {

/// Token ids X (B, num_steps), at least one of each, integers in
/// [0, vocab_size of `embedding`), on the embedding's device, as the int64
/// tensor the embedding takes. Out of range ids are caught here: the
/// embedding's own error does not say which argument or which range.
torch::Tensor checked_tokens(const char* fn, const torch::Tensor& X,
                             const torch::nn::Embedding& embedding);

/// Valid source lengths `name`: undefined, or (batch) whole non-negative
/// numbers on the device of `ref` (named `ref_name`).
void check_enc_valid_lens(const char* fn, const char* name, const torch::Tensor& lens,
                          int64_t batch, const torch::Tensor& ref, const char* ref_name);

/// The RNN seq2seq modules' sizes: positive, and dropout a probability.
void check_seq2seq_options(const char* fn, const Seq2SeqOptions& o);
/// "fn(vocab_size=..., embed_size=..., ...)".
std::string describe_seq2seq(const char* fn, const Seq2SeqOptions& o);

/// A recurrent state `name` must be (num_layers, batch, num_hiddens) in the
/// dtype and on the device of `rnn`'s weights; `rnn_name` is the GRU's
/// dotted name in the module ("rnn", or "rnn.rnn" where d2l 1.0 wraps it).
void check_hidden_state(const char* fn, const char* name, const torch::Tensor& state,
                        int64_t batch, const Seq2SeqOptions& o, const torch::nn::GRU& rnn,
                        const char* rnn_name);

/// An RNN encoder's (outputs (num_steps, B, num_hiddens), hidden_state
/// (num_layers, B, num_hiddens)), as check_hidden_state.
void check_encoder_output(const char* fn, const EncoderOutput& enc, const Seq2SeqOptions& o,
                          const torch::nn::GRU& rnn, const char* rnn_name);

/// The module an EncoderDecoder registers as "encoder" ("decoder"): `part`
/// must be non-null and also a torch::nn::Module. Errors start with `fn`.
std::shared_ptr<torch::nn::Module> module_of_encoder(const char* fn,
                                                     const std::shared_ptr<Encoder>& part);
std::shared_ptr<torch::nn::Module> module_of_decoder(const char* fn,
                                                     const std::shared_ptr<Decoder>& part);

/// An EncoderDecoder's forward arguments: enc_X and dec_X (B, steps) with one
/// batch size, on the device of `model`'s parameters; enc_valid_lens
/// undefined or (B) whole non-negative numbers there.
void check_encoder_decoder_inputs(const char* fn, const torch::nn::Module& model,
                                  const torch::Tensor& enc_X, const torch::Tensor& dec_X,
                                  const torch::Tensor& enc_valid_lens);

}  // namespace d2l::detail
