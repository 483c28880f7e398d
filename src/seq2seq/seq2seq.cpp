// The book's RNN sequence-to-sequence modules: Seq2SeqEncoder,
// Seq2SeqDecoder and Seq2SeqAttentionDecoder, with the checks of their
// arguments and of the decoder states they are handed back.

#include <d2l/seq2seq.h>

#include <fmt/format.h>

#include <utility>
#include <vector>

#include "additive_attention_internal.h"
#include "attention_weights.h"
#include "checked_load.h"
#include "checks.h"
#include "seq2seq/attention_keys_cache.h"
#include "seq2seq/sequence_checks.h"

namespace d2l {
namespace {

using detail::check_enc_valid_lens;
using detail::checked_tokens;

torch::nn::GRU make_gru(int64_t input_size, const Seq2SeqOptions& o) {
  return torch::nn::GRU(torch::nn::GRUOptions(input_size, o.num_hiddens())
                            .num_layers(o.num_layers())
                            .dropout(o.dropout()));
}

// The attention decoder's state as init_state makes it, whatever the caller
// did to it since: enc_outputs (B, m, h) in the dtype and on the device of
// the attention's weights, enc_valid_lens undefined or (B) whole non-negative
// numbers. (hidden_state is checked by check_hidden_state.)
void check_attention_state(const char* fn, const DecoderState& state, int64_t batch,
                           const Seq2SeqOptions& o, const AdditiveAttention& attention) {
  detail::check_strided_layout(fn, "state.enc_outputs", state.enc_outputs);
  TORCH_CHECK(state.enc_outputs.defined() && state.enc_outputs.dim() == 3 &&
                  state.enc_outputs.size(0) == batch &&
                  state.enc_outputs.size(2) == o.num_hiddens(),
              fmt::format("{}: state must come from init_state: state.enc_outputs must be "
                          "[batch_size={}, num_enc_steps, num_hiddens={}], got {}",
                          fn, batch, o.num_hiddens(), detail::shape_of(state.enc_outputs)));
  const auto& weight = attention->W_q->weight;
  detail::check_same_device(fn, "attention.W_q.weight", weight, "state.enc_outputs",
                            state.enc_outputs);
  detail::check_same_dtype(fn, "attention.W_q.weight", weight, "state.enc_outputs",
                           state.enc_outputs);
  check_enc_valid_lens(fn, "state.enc_valid_lens", state.enc_valid_lens, batch, state.enc_outputs,
                       "state.enc_outputs");
}

// The state's projected keys: its cache's when made from its enc_outputs,
// else projected now (a state whose enc_outputs the caller replaced).
torch::Tensor projected_keys(const char* fn, const DecoderState& state,
                             AdditiveAttention attention) {
  const auto* cache = dynamic_cast<const detail::AttentionKeysCache*>(state.cache.get());
  TORCH_CHECK(cache != nullptr,
              fmt::format("{}: state must come from init_state: state.cache holds no projected "
                          "keys of this decoder (a state made by hand, or by another decoder?)",
                          fn));
  if (cache->serves(state.enc_outputs, attention->W_k->weight)) return cache->projected_keys;
  return attention->W_k(state.enc_outputs);
}

}  // namespace

Seq2SeqOptions::Seq2SeqOptions(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                               int64_t num_layers)
    : vocab_size_(vocab_size),
      embed_size_(embed_size),
      num_hiddens_(num_hiddens),
      num_layers_(num_layers) {}

// ---------------------------------------------------------------------------
// Seq2SeqEncoder

Seq2SeqEncoderImpl::Seq2SeqEncoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                                       int64_t num_layers, double dropout)
    : Seq2SeqEncoderImpl(
          Seq2SeqEncoderOptions(vocab_size, embed_size, num_hiddens, num_layers).dropout(dropout)) {
}

Seq2SeqEncoderImpl::Seq2SeqEncoderImpl(const Seq2SeqEncoderOptions& options_) : options(options_) {
  reset();
}

void Seq2SeqEncoderImpl::reset() {
  detail::check_seq2seq_options("d2l::Seq2SeqEncoder", options);
  embedding = register_module("embedding",
                              torch::nn::Embedding(options.vocab_size(), options.embed_size()));
  rnn = register_module("rnn", make_gru(options.embed_size(), options));
}

void Seq2SeqEncoderImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_seq2seq("d2l::Seq2SeqEncoder", options);
}

EncoderOutput Seq2SeqEncoderImpl::forward(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  constexpr const char* fn = "d2l::Seq2SeqEncoder";
  const auto tokens = checked_tokens(fn, X, embedding);
  check_enc_valid_lens(fn, "valid_lens", valid_lens, X.size(0), X, "X");
  // The GRU is time-major: (num_steps, B, embed_size).
  auto [outputs, hidden_state] = rnn(embedding(tokens).permute({1, 0, 2}));
  return {std::move(outputs), std::move(hidden_state)};
}

// ---------------------------------------------------------------------------
// Seq2SeqDecoder

Seq2SeqDecoderImpl::Seq2SeqDecoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                                       int64_t num_layers, double dropout)
    : Seq2SeqDecoderImpl(
          Seq2SeqDecoderOptions(vocab_size, embed_size, num_hiddens, num_layers).dropout(dropout)) {
}

Seq2SeqDecoderImpl::Seq2SeqDecoderImpl(const Seq2SeqDecoderOptions& options_) : options(options_) {
  reset();
}

void Seq2SeqDecoderImpl::reset() {
  detail::check_seq2seq_options("d2l::Seq2SeqDecoder", options);
  embedding = register_module("embedding",
                              torch::nn::Embedding(options.vocab_size(), options.embed_size()));
  rnn = register_module("rnn", make_gru(options.embed_size() + options.num_hiddens(), options));
  dense = register_module("dense", torch::nn::Linear(options.num_hiddens(), options.vocab_size()));
}

void Seq2SeqDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_seq2seq("d2l::Seq2SeqDecoder", options);
}

DecoderState Seq2SeqDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                            const torch::Tensor& enc_valid_lens) {
  constexpr const char* fn = "d2l::Seq2SeqDecoder::init_state";
  detail::check_encoder_output(fn, enc_outputs, options, rnn, "rnn");
  // Unused, as in the book, but a malformed one is a caller's bug all the same.
  check_enc_valid_lens(fn, "enc_valid_lens", enc_valid_lens, enc_outputs.outputs.size(1),
                       enc_outputs.outputs, "enc_outputs.outputs");
  DecoderState state;
  state.hidden_state = enc_outputs.hidden_state;
  return state;
}

std::tuple<torch::Tensor, DecoderState> Seq2SeqDecoderImpl::forward(const torch::Tensor& X,
                                                                    const DecoderState& state) {
  constexpr const char* fn = "d2l::Seq2SeqDecoder";
  const auto tokens = checked_tokens(fn, X, embedding);
  detail::check_hidden_state(fn, "state.hidden_state", state.hidden_state, X.size(0), options, rnn,
                             "rnn");
  const auto embedded = embedding(tokens).permute({1, 0, 2});
  // The top layer of the state is the context of every step.
  const auto context = state.hidden_state[-1].repeat({embedded.size(0), 1, 1});
  auto [output, hidden_state] = rnn(torch::cat({embedded, context}, 2), state.hidden_state);
  DecoderState next = state;
  next.hidden_state = std::move(hidden_state);
  return {dense(output).permute({1, 0, 2}), std::move(next)};
}

// ---------------------------------------------------------------------------
// Seq2SeqAttentionDecoder

Seq2SeqAttentionDecoderImpl::Seq2SeqAttentionDecoderImpl(int64_t vocab_size, int64_t embed_size,
                                                         int64_t num_hiddens, int64_t num_layers,
                                                         double dropout)
    : Seq2SeqAttentionDecoderImpl(
          Seq2SeqAttentionDecoderOptions(vocab_size, embed_size, num_hiddens, num_layers)
              .dropout(dropout)) {}

Seq2SeqAttentionDecoderImpl::Seq2SeqAttentionDecoderImpl(
    const Seq2SeqAttentionDecoderOptions& options_)
    : options(options_) {
  reset();
}

void Seq2SeqAttentionDecoderImpl::reset() {
  detail::check_seq2seq_options("d2l::Seq2SeqAttentionDecoder", options);
  const int64_t h = options.num_hiddens();
  attention = register_module("attention", AdditiveAttention(h, h, h, options.dropout()));
  embedding = register_module("embedding",
                              torch::nn::Embedding(options.vocab_size(), options.embed_size()));
  rnn = register_module("rnn", make_gru(options.embed_size() + h, options));
  dense = register_module("dense", torch::nn::Linear(h, options.vocab_size()));
}

void Seq2SeqAttentionDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_seq2seq("d2l::Seq2SeqAttentionDecoder", options);
}

DecoderState Seq2SeqAttentionDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                                     const torch::Tensor& enc_valid_lens) {
  constexpr const char* fn = "d2l::Seq2SeqAttentionDecoder::init_state";
  detail::check_encoder_output(fn, enc_outputs, options, rnn, "rnn");
  check_enc_valid_lens(fn, "enc_valid_lens", enc_valid_lens, enc_outputs.outputs.size(1),
                       enc_outputs.outputs, "enc_outputs.outputs");
  DecoderState state;
  state.enc_outputs = enc_outputs.outputs.permute({1, 0, 2});
  state.hidden_state = enc_outputs.hidden_state;
  state.enc_valid_lens = enc_valid_lens;
  auto cache = std::make_shared<detail::AttentionKeysCache>(
      state.enc_outputs, attention->W_k(state.enc_outputs), attention->W_k->weight);
  // The deprecated field, still filled for readers until it goes.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  state.projected_keys = cache->projected_keys;
#pragma GCC diagnostic pop
  state.cache = std::move(cache);
  return state;
}

std::tuple<torch::Tensor, DecoderState> Seq2SeqAttentionDecoderImpl::forward(
    const torch::Tensor& X, const DecoderState& state) {
  constexpr const char* fn = "d2l::Seq2SeqAttentionDecoder";
  const auto tokens = checked_tokens(fn, X, embedding);
  const int64_t batch = X.size(0);
  detail::check_hidden_state(fn, "state.hidden_state", state.hidden_state, batch, options, rnn,
                             "rnn");
  check_attention_state(fn, state, batch, options, attention);
  const auto keys = projected_keys(fn, state, attention);

  const auto embedded = embedding(tokens).permute({1, 0, 2});
  auto hidden_state = state.hidden_state;
  std::vector<torch::Tensor> outputs, weights;
  outputs.reserve(embedded.size(0));
  weights.reserve(embedded.size(0));
  for (int64_t t = 0; t < embedded.size(0); ++t) {
    const auto query = hidden_state[-1].unsqueeze(1);
    // Same as attention(query, enc_outputs, enc_outputs, enc_valid_lens), with
    // the keys projected once by init_state.
    auto [context, step_weights] = detail::additive_attention_projected(
        attention->W_q(query), keys, state.enc_outputs, attention->w_v->weight,
        state.enc_valid_lens, attention->dropout->options.p(), attention->dropout->is_training(),
        attention->options.backend());
    if (detail::records_weights(attention->options.record_attention_weights())) {
      detail::record_weights(attention->attention_weights, step_weights);
    }
    const auto x = torch::cat({context, embedded[t].unsqueeze(1)}, -1);
    torch::Tensor out;
    std::tie(out, hidden_state) = rnn(x.permute({1, 0, 2}), hidden_state);
    outputs.push_back(std::move(out));
    weights.push_back(std::move(step_weights));
  }
  if (detail::records_weights(true)) {
    detail::record_weights(attention_weights_, torch::cat(weights, 1));
  }
  DecoderState next = state;
  next.hidden_state = std::move(hidden_state);
  return {dense(torch::cat(outputs, 0)).permute({1, 0, 2}), std::move(next)};
}

torch::Tensor Seq2SeqAttentionDecoderImpl::attention_weights() const {
  return detail::load_weights(attention_weights_);
}

// Loads through detail::checked_load: a mismatched archive changes nothing.
void Seq2SeqEncoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::Seq2SeqEncoder::load");
}

void Seq2SeqDecoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::Seq2SeqDecoder::load");
}

void Seq2SeqAttentionDecoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::Seq2SeqAttentionDecoder::load");
}

}  // namespace d2l
