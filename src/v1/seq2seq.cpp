// d2l 1.0's RNN sequence-to-sequence modules (include/d2l/v1/seq2seq.h):
// GRU, init_seq2seq, Seq2SeqEncoder, Seq2SeqDecoder and the Bahdanau
// Seq2SeqAttentionDecoder, with the checks the 0.17 modules make
// (seq2seq/sequence_checks.h).

#include <d2l/v1/seq2seq.h>

#include <fmt/format.h>

#include <torch/nn/init.h>
#include <torch/utils.h>

#include <ostream>
#include <utility>

#include "../additive_attention_internal.h"
#include "../attention_weights.h"
#include "../checked_load.h"
#include "../checks.h"
#include "../lazy_internal.h"
#include "../seq2seq/attention_keys_cache.h"
#include "../seq2seq/sequence_checks.h"

namespace d2l::v1 {
namespace {

using d2l::detail::check_enc_valid_lens;
using d2l::detail::checked_tokens;
using d2l::detail::shape_of;

torch::nn::GRU make_gru(int64_t input_size, int64_t num_hiddens, int64_t num_layers,
                        double dropout) {
  return torch::nn::GRU(
      torch::nn::GRUOptions(input_size, num_hiddens).num_layers(num_layers).dropout(dropout));
}

d2l::Seq2SeqOptions seq2seq_options(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                                    int64_t num_layers, double dropout) {
  return d2l::Seq2SeqOptions(vocab_size, embed_size, num_hiddens, num_layers).dropout(dropout);
}

// The book's `context = enc_output[-1]` and the attention decoder's keys:
// state.enc_outputs (B, num_enc_steps, num_hiddens), batch-first, with at
// least one step, in the dtype and on the device of `weight`.
void check_enc_outputs(const char* fn, const DecoderState& state, int64_t batch,
                       const d2l::Seq2SeqOptions& o, const char* weight_name,
                       const torch::Tensor& weight) {
  const auto& enc = state.enc_outputs;
  d2l::detail::check_strided_layout(fn, "state.enc_outputs", enc);
  TORCH_CHECK(enc.defined() && enc.dim() == 3 && enc.size(0) == batch && enc.size(1) > 0 &&
                  enc.size(2) == o.num_hiddens(),
              fmt::format("{}: state must come from init_state: state.enc_outputs must be "
                          "[batch_size={}, num_enc_steps, num_hiddens={}] with at least one step, "
                          "got {}",
                          fn, batch, o.num_hiddens(), shape_of(enc)));
  d2l::detail::check_same_device(fn, weight_name, weight, "state.enc_outputs", enc);
  d2l::detail::check_same_dtype(fn, weight_name, weight, "state.enc_outputs", enc);
}

}  // namespace

void init_seq2seq(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    torch::nn::init::xavier_uniform_(linear->weight);
  }
  if (auto* gru = dynamic_cast<torch::nn::GRUImpl*>(&module)) {
    for (auto& p : gru->named_parameters(/*recurse=*/false)) {
      if (p.key().find("weight") != std::string::npos) torch::nn::init::xavier_uniform_(p.value());
    }
  }
}

// ---------------------------------------------------------------------------
// GRU

GRUImpl::GRUImpl(int64_t num_inputs_, int64_t num_hiddens_, int64_t num_layers_, double dropout)
    : num_inputs(num_inputs_),
      num_hiddens(num_hiddens_),
      num_layers(num_layers_),
      dropout_p(dropout) {
  reset();
}

void GRUImpl::reset() {
  constexpr const char* fn = "d2l::v1::GRU";
  TORCH_CHECK(num_inputs > 0 && num_hiddens > 0 && num_layers > 0,
              fmt::format("{}: num_inputs, num_hiddens and num_layers must be positive, got "
                          "num_inputs={}, num_hiddens={}, num_layers={}",
                          fn, num_inputs, num_hiddens, num_layers));
  d2l::detail::check_dropout(fn, dropout_p);
  rnn = register_module("rnn", make_gru(num_inputs, num_hiddens, num_layers, dropout_p));
}

void GRUImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::v1::GRU(num_inputs={}, num_hiddens={}, num_layers={}, dropout={})",
                        num_inputs, num_hiddens, num_layers, dropout_p);
}

std::tuple<torch::Tensor, torch::Tensor> GRUImpl::forward(const torch::Tensor& inputs,
                                                          const torch::Tensor& H) {
  constexpr const char* fn = "d2l::v1::GRU";
  d2l::detail::check_floating(fn, "inputs", inputs, 3);
  TORCH_CHECK(inputs.size(2) == num_inputs,
              fmt::format("{}: inputs must have shape [num_steps, batch_size, num_inputs={}], "
                          "got {}",
                          fn, num_inputs, shape_of(inputs)));
  if (H.defined()) {
    d2l::detail::check_strided_layout(fn, "H", H);
    TORCH_CHECK(H.dim() == 3 && H.size(0) == num_layers && H.size(1) == inputs.size(1) &&
                    H.size(2) == num_hiddens,
                fmt::format("{}: H must have shape [num_layers={}, batch_size={}, "
                            "num_hiddens={}], got {}",
                            fn, num_layers, inputs.size(1), num_hiddens, shape_of(H)));
    d2l::detail::check_same_dtype(fn, "inputs", inputs, "H", H);
  }
  return rnn(inputs, H);
}

// ---------------------------------------------------------------------------
// Seq2SeqEncoder

Seq2SeqEncoderImpl::Seq2SeqEncoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                                       int64_t num_layers, double dropout)
    : options(seq2seq_options(vocab_size, embed_size, num_hiddens, num_layers, dropout)) {
  reset();
}

void Seq2SeqEncoderImpl::reset() {
  d2l::detail::check_seq2seq_options("d2l::v1::Seq2SeqEncoder", options);
  embedding = register_module("embedding",
                              torch::nn::Embedding(options.vocab_size(), options.embed_size()));
  rnn = register_module("rnn", GRU(options.embed_size(), options.num_hiddens(),
                                   options.num_layers(), options.dropout()));
  apply(init_seq2seq);
}

void Seq2SeqEncoderImpl::pretty_print(std::ostream& stream) const {
  stream << d2l::detail::describe_seq2seq("d2l::v1::Seq2SeqEncoder", options);
}

void Seq2SeqEncoderImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::Seq2SeqEncoder::load");
}

EncoderOutput Seq2SeqEncoderImpl::forward(const torch::Tensor& X, const torch::Tensor& valid_lens) {
  constexpr const char* fn = "d2l::v1::Seq2SeqEncoder";
  const auto tokens = checked_tokens(fn, X, embedding);
  check_enc_valid_lens(fn, "valid_lens", valid_lens, X.size(0), X, "X");
  // embs: (num_steps, batch_size, embed_size)
  auto [outputs, state] = rnn(embedding(tokens.t()));
  return {std::move(outputs), std::move(state)};
}

// ---------------------------------------------------------------------------
// Seq2SeqDecoder

Seq2SeqDecoderImpl::Seq2SeqDecoderImpl(int64_t vocab_size, int64_t embed_size, int64_t num_hiddens,
                                       int64_t num_layers, double dropout)
    : options(seq2seq_options(vocab_size, embed_size, num_hiddens, num_layers, dropout)) {
  reset();
}

void Seq2SeqDecoderImpl::reset() {
  d2l::detail::check_seq2seq_options("d2l::v1::Seq2SeqDecoder", options);
  embedding = register_module("embedding",
                              torch::nn::Embedding(options.vocab_size(), options.embed_size()));
  rnn = register_module("rnn", GRU(options.embed_size() + options.num_hiddens(),
                                   options.num_hiddens(), options.num_layers(), options.dropout()));
  dense = register_module("dense", LazyLinear(options.vocab_size()));
  apply(init_seq2seq);
}

void Seq2SeqDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << d2l::detail::describe_seq2seq("d2l::v1::Seq2SeqDecoder", options);
}

void Seq2SeqDecoderImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::Seq2SeqDecoder::load");
}

DecoderState Seq2SeqDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                            const torch::Tensor& enc_valid_lens) {
  constexpr const char* fn = "d2l::v1::Seq2SeqDecoder::init_state";
  d2l::detail::check_encoder_output(fn, enc_outputs, options, rnn->rnn, "rnn.rnn");
  check_enc_valid_lens(fn, "enc_valid_lens", enc_valid_lens, enc_outputs.outputs.size(1),
                       enc_outputs.outputs, "enc_outputs.outputs");
  DecoderState state;
  state.enc_outputs = enc_outputs.outputs.permute({1, 0, 2});
  state.hidden_state = enc_outputs.hidden_state;
  return state;
}

std::tuple<torch::Tensor, DecoderState> Seq2SeqDecoderImpl::forward(const torch::Tensor& X,
                                                                    const DecoderState& state) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  constexpr const char* fn = "d2l::v1::Seq2SeqDecoder";
  const auto tokens = checked_tokens(fn, X, embedding);
  const int64_t batch = X.size(0);
  d2l::detail::check_hidden_state(fn, "state.hidden_state", state.hidden_state, batch, options,
                                  rnn->rnn, "rnn.rnn");
  check_enc_outputs(fn, state, batch, options, "rnn.rnn.weight_hh_l0",
                    rnn->rnn->named_parameters(false)["weight_hh_l0"]);
  const auto embs = embedding(tokens.t());
  // The encoder's top-layer output at its last step, at every step.
  const auto context = state.enc_outputs.select(1, -1).repeat({embs.size(0), 1, 1});
  auto [outputs, hidden_state] = rnn(torch::cat({embs, context}, -1), state.hidden_state);
  DecoderState next = state;
  next.hidden_state = std::move(hidden_state);
  return {dense(outputs).transpose(0, 1), std::move(next)};
}

// ---------------------------------------------------------------------------
// Seq2SeqAttentionDecoder

Seq2SeqAttentionDecoderImpl::Seq2SeqAttentionDecoderImpl(int64_t vocab_size, int64_t embed_size,
                                                         int64_t num_hiddens, int64_t num_layers,
                                                         double dropout)
    : options(seq2seq_options(vocab_size, embed_size, num_hiddens, num_layers, dropout)) {
  reset();
}

void Seq2SeqAttentionDecoderImpl::reset() {
  d2l::detail::check_seq2seq_options("d2l::v1::Seq2SeqAttentionDecoder", options);
  const int64_t h = options.num_hiddens();
  attention = register_module("attention", AdditiveAttention(h, options.dropout()));
  embedding = register_module("embedding",
                              torch::nn::Embedding(options.vocab_size(), options.embed_size()));
  rnn = register_module(
      "rnn", make_gru(options.embed_size() + h, h, options.num_layers(), options.dropout()));
  dense = register_module("dense", LazyLinear(options.vocab_size()));
  apply(init_seq2seq);
}

void Seq2SeqAttentionDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << d2l::detail::describe_seq2seq("d2l::v1::Seq2SeqAttentionDecoder", options);
}

void Seq2SeqAttentionDecoderImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::Seq2SeqAttentionDecoder::load");
}

DecoderState Seq2SeqAttentionDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                                     const torch::Tensor& enc_valid_lens) {
  constexpr const char* fn = "d2l::v1::Seq2SeqAttentionDecoder::init_state";
  d2l::detail::check_encoder_output(fn, enc_outputs, options, rnn, "rnn");
  check_enc_valid_lens(fn, "enc_valid_lens", enc_valid_lens, enc_outputs.outputs.size(1),
                       enc_outputs.outputs, "enc_outputs.outputs");
  DecoderState state;
  state.enc_outputs = enc_outputs.outputs.permute({1, 0, 2});
  state.hidden_state = enc_outputs.hidden_state;
  state.enc_valid_lens = enc_valid_lens;
  return state;
}

std::tuple<torch::Tensor, DecoderState> Seq2SeqAttentionDecoderImpl::forward(
    const torch::Tensor& X, const DecoderState& state) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  constexpr const char* fn = "d2l::v1::Seq2SeqAttentionDecoder";
  const auto tokens = checked_tokens(fn, X, embedding);
  const int64_t batch = X.size(0);
  d2l::detail::check_hidden_state(fn, "state.hidden_state", state.hidden_state, batch, options, rnn,
                                  "rnn");
  check_enc_outputs(fn, state, batch, options, "rnn.weight_hh_l0",
                    rnn->named_parameters(false)["weight_hh_l0"]);
  check_enc_valid_lens(fn, "state.enc_valid_lens", state.enc_valid_lens, batch, state.enc_outputs,
                       "state.enc_outputs");
  const auto& enc_outputs = state.enc_outputs;
  // The book's attention(query, enc_outputs, enc_outputs, enc_valid_lens) at
  // every step, with the keys W_k(enc_outputs) projected once a call (the
  // lazy layers take their widths as the first step's call would fix them),
  // and without autograd once a decoding: kept in the state's cache, as the
  // 0.17 decoder's init_state keeps them (1.0's makes the cache at the first
  // step, when W_k has its width).
  const auto* cache = dynamic_cast<const d2l::detail::AttentionKeysCache*>(state.cache.get());
  const bool grad = torch::GradMode::is_enabled();
  const bool cached =
      !grad && cache != nullptr && cache->serves(enc_outputs, attention->W_k->weight);
  const auto keys = cached ? cache->projected_keys : attention->W_k(enc_outputs);
  if (attention->w_v->has_uninitialized_params())
    attention->w_v->materialize(attention->num_hiddens);
  const auto embs = embedding(tokens).permute({1, 0, 2});
  auto hidden_state = state.hidden_state;
  std::vector<torch::Tensor> outputs, weights;
  for (int64_t t = 0; t < embs.size(0); ++t) {
    const auto query = hidden_state[-1].unsqueeze(1);
    auto [context, step_weights] = d2l::detail::additive_attention_projected(
        attention->W_q(query), keys, enc_outputs, attention->w_v->weight, state.enc_valid_lens,
        attention->dropout->options.p(), attention->dropout->is_training(), attention->backend);
    const auto x = torch::cat({context, embs[t].unsqueeze(1)}, -1);
    torch::Tensor out;
    std::tie(out, hidden_state) = rnn(x.permute({1, 0, 2}), hidden_state);
    outputs.push_back(std::move(out));
    weights.push_back(std::move(step_weights));
  }
  if (d2l::detail::records_weights(true)) {
    d2l::detail::record_weights(attention->attention_weights, weights.back());
    d2l::detail::record_weights(attention_weights_, torch::cat(weights, 1));
  }
  DecoderState next = state;
  next.hidden_state = std::move(hidden_state);
  if (!grad && !cached) {
    next.cache = std::make_shared<d2l::detail::AttentionKeysCache>(enc_outputs, keys,
                                                                   attention->W_k->weight);
  }
  return {dense(torch::cat(outputs, 0)).permute({1, 0, 2}), std::move(next)};
}

std::vector<torch::Tensor> Seq2SeqAttentionDecoderImpl::attention_weights() const {
  const auto weights = d2l::detail::load_weights(attention_weights_);
  if (!weights.defined()) return {};
  return weights.split(1, 1);
}

}  // namespace d2l::v1
