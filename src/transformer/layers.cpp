// The Transformer's layers (d2l 0.17): PositionalEncoding, PositionWiseFFN,
// AddNorm, EncoderBlock and TransformerEncoder.

#include <d2l/transformer.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "attention_mask_internal.h"
#include "checked_load.h"
#include "checks.h"
#include "linear.h"
#include "seq2seq/sequence_checks.h"
#include "transformer/fused_step.h"
#include "transformer/options.h"

namespace d2l {

// ---------------------------------------------------------------------------
// PositionalEncoding

PositionalEncodingImpl::PositionalEncodingImpl(int64_t num_hiddens_, double dropout_,
                                               int64_t max_len_)
    : num_hiddens(num_hiddens_), dropout_p(dropout_), max_len(max_len_) {
  reset();
}

void PositionalEncodingImpl::reset() {
  constexpr const char* fn = "d2l::PositionalEncoding";
  TORCH_CHECK(num_hiddens > 0 && max_len > 0,
              fmt::format("{}: num_hiddens and max_len must be positive, got num_hiddens={}, "
                          "max_len={}",
                          fn, num_hiddens, max_len));
  detail::check_dropout(fn, dropout_p);
  dropout = register_module("dropout", torch::nn::Dropout(dropout_p));
  // As the book: float32 positions over float32 powers of 10000.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  const auto X = torch::arange(max_len, f32).reshape({-1, 1}) /
                 torch::pow(10000, torch::arange(0, num_hiddens, 2, f32) / num_hiddens);
  P = torch::zeros({1, max_len, num_hiddens}, f32);
  P.slice(2, 0, num_hiddens, 2).copy_(torch::sin(X).unsqueeze(0));
  // An odd num_hiddens has one cosine column fewer than sine columns.
  P.slice(2, 1, num_hiddens, 2).copy_(torch::cos(X).slice(1, 0, num_hiddens / 2).unsqueeze(0));
}

void PositionalEncodingImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::PositionalEncoding(num_hiddens={}, dropout={}, max_len={})",
                        num_hiddens, dropout_p, max_len);
}

torch::Tensor PositionalEncodingImpl::forward(const torch::Tensor& X) {
  constexpr const char* fn = "d2l::PositionalEncoding";
  detail::check_floating(fn, "X", X, 3);
  TORCH_CHECK(X.size(2) == num_hiddens,
              fmt::format("{}: X must have shape [batch_size, num_steps, num_hiddens={}], got {}",
                          fn, num_hiddens, detail::shape_of(X)));
  TORCH_CHECK(X.size(1) <= max_len,
              fmt::format("{}: X has {} steps, more than the positional table's max_len={} (X {})",
                          fn, X.size(1), max_len, detail::shape_of(X)));
  const auto Z = X + P.narrow(1, 0, X.size(1)).to(X.options());
  return dropout->is_training() ? dropout(Z) : Z;
}

// ---------------------------------------------------------------------------
// PositionWiseFFN

PositionWiseFFNImpl::PositionWiseFFNImpl(int64_t ffn_num_input_, int64_t ffn_num_hiddens_,
                                         int64_t ffn_num_outputs_)
    : ffn_num_input(ffn_num_input_),
      ffn_num_hiddens(ffn_num_hiddens_),
      ffn_num_outputs(ffn_num_outputs_) {
  reset();
}

void PositionWiseFFNImpl::reset() {
  TORCH_CHECK(ffn_num_input > 0 && ffn_num_hiddens > 0 && ffn_num_outputs > 0,
              fmt::format("d2l::PositionWiseFFN: ffn_num_input, ffn_num_hiddens and "
                          "ffn_num_outputs must be positive, got {}, {} and {}",
                          ffn_num_input, ffn_num_hiddens, ffn_num_outputs));
  dense1 = register_module("dense1", torch::nn::Linear(ffn_num_input, ffn_num_hiddens));
  relu = register_module("relu", torch::nn::ReLU());
  dense2 = register_module("dense2", torch::nn::Linear(ffn_num_hiddens, ffn_num_outputs));
}

void PositionWiseFFNImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::PositionWiseFFN(ffn_num_input={}, ffn_num_hiddens={}, "
                        "ffn_num_outputs={})",
                        ffn_num_input, ffn_num_hiddens, ffn_num_outputs);
}

torch::Tensor PositionWiseFFNImpl::forward(const torch::Tensor& X) {
  constexpr const char* fn = "d2l::PositionWiseFFN";
  detail::check_strided_layout(fn, "X", X);
  TORCH_CHECK(X.defined() && X.dim() >= 1 && X.size(-1) == ffn_num_input,
              fmt::format("{}: X must end in ffn_num_input={} features, got {}", fn,
                          ffn_num_input, detail::shape_of(X)));
  // dense2(relu(dense1(X))), the products split over ATen's threads where
  // BLAS would run them on one (linear.h): a decoding step's few rows.
  const auto H = relu(detail::linear(X, dense1->weight, dense1->bias));
  return detail::linear(H, dense2->weight, dense2->bias);
}

// ---------------------------------------------------------------------------
// AddNorm

AddNormImpl::AddNormImpl(std::vector<int64_t> normalized_shape_, double dropout_)
    : normalized_shape(std::move(normalized_shape_)), dropout_p(dropout_) {
  reset();
}

void AddNormImpl::reset() {
  constexpr const char* fn = "d2l::AddNorm";
  TORCH_CHECK(!normalized_shape.empty() &&
                  std::all_of(normalized_shape.begin(), normalized_shape.end(),
                              [](int64_t s) { return s > 0; }),
              fmt::format("{}: normalized_shape must be non-empty and positive, got [{}]", fn,
                          fmt::join(normalized_shape, ", ")));
  detail::check_dropout(fn, dropout_p);
  dropout = register_module("dropout", torch::nn::Dropout(dropout_p));
  ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions(normalized_shape)));
}

void AddNormImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::AddNorm(normalized_shape=[{}], dropout={})",
                        fmt::join(normalized_shape, ", "), dropout_p);
}

torch::Tensor AddNormImpl::forward(const torch::Tensor& X, const torch::Tensor& Y) {
  constexpr const char* fn = "d2l::AddNorm";
  detail::check_strided_layout(fn, "X", X);
  detail::check_strided_layout(fn, "Y", Y);
  const auto n = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK(X.defined() && Y.defined() && X.sizes() == Y.sizes() && X.dim() >= n &&
                  X.sizes().slice(X.dim() - n).vec() == normalized_shape,
              fmt::format("{}: X and Y must have the same shape, ending in normalized_shape=[{}]; "
                          "got X {} and Y {}",
                          fn, fmt::join(normalized_shape, ", "), detail::shape_of(X),
                          detail::shape_of(Y)));
  // In evaluation the dropout is the identity: not dispatched.
  return ln((dropout->is_training() ? dropout(Y) : Y) + X);
}

// ---------------------------------------------------------------------------
// EncoderBlock

EncoderBlockImpl::EncoderBlockImpl(int64_t key_size, int64_t query_size, int64_t value_size,
                                   int64_t num_hiddens, std::vector<int64_t> norm_shape,
                                   int64_t ffn_num_input, int64_t ffn_num_hiddens,
                                   int64_t num_heads, double dropout, bool use_bias)
    : EncoderBlockImpl(detail::block_options(key_size, query_size, value_size, num_hiddens,
                                             std::move(norm_shape), ffn_num_input, ffn_num_hiddens,
                                             num_heads, dropout, use_bias)) {}

EncoderBlockImpl::EncoderBlockImpl(const TransformerBlockOptions& options_) : options(options_) {
  reset();
}

void EncoderBlockImpl::reset() {
  const auto& o = options;
  detail::check_block_options("d2l::EncoderBlock", o);
  attention = register_module("attention", detail::make_block_attention(o, o.use_bias()));
  addnorm1 = register_module("addnorm1", AddNorm(o.norm_shape(), o.dropout()));
  ffn = register_module("ffn", PositionWiseFFN(o.ffn_num_input(), o.ffn_num_hiddens(),
                                               o.num_hiddens()));
  addnorm2 = register_module("addnorm2", AddNorm(o.norm_shape(), o.dropout()));
}

void EncoderBlockImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_block("d2l::EncoderBlock", options);
}

torch::Tensor EncoderBlockImpl::forward(const torch::Tensor& X, const AttentionMask& mask) {
  const auto Y = addnorm1(X, attention->forward(X, X, X, mask));
  return addnorm2(Y, ffn(Y));
}

void EncoderBlockImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::EncoderBlock::load");
}

// ---------------------------------------------------------------------------
// TransformerEncoder

TransformerEncoderImpl::TransformerEncoderImpl(
    int64_t vocab_size, int64_t key_size, int64_t query_size, int64_t value_size,
    int64_t num_hiddens, std::vector<int64_t> norm_shape, int64_t ffn_num_input,
    int64_t ffn_num_hiddens, int64_t num_heads, int64_t num_layers, double dropout, bool use_bias)
    : TransformerEncoderImpl(TransformerOptions(
          vocab_size,
          detail::block_options(key_size, query_size, value_size, num_hiddens,
                                std::move(norm_shape), ffn_num_input, ffn_num_hiddens, num_heads,
                                dropout, use_bias),
          num_layers)) {}

TransformerEncoderImpl::TransformerEncoderImpl(const TransformerOptions& options_)
    : options(options_) {
  reset();
}

void TransformerEncoderImpl::reset() {
  constexpr const char* fn = "d2l::TransformerEncoder";
  detail::check_transformer_options(fn, options);
  embedding = register_module("embedding", detail::make_embedding(options));
  pos_encoding = register_module("pos_encoding", detail::make_positional_encoding(options));
  blks = register_module("blks", torch::nn::Sequential());
  for (int64_t i = 0; i < options.num_layers(); ++i) {
    blks->push_back("block" + std::to_string(i), EncoderBlock(options.block()));
  }
}

void TransformerEncoderImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_transformer("d2l::TransformerEncoder", options);
}

EncoderBlock TransformerEncoderImpl::block(int64_t i) const {
  return detail::block_at<EncoderBlock>("d2l::TransformerEncoder::block", blks, i,
                                        options.num_layers());
}

EncoderOutput TransformerEncoderImpl::forward(const torch::Tensor& X,
                                              const torch::Tensor& valid_lens) {
  return forward_masked(X, valid_lens);
}

EncoderOutput TransformerEncoderImpl::forward_masked(const torch::Tensor& X,
                                                     const AttentionMask& mask) {
  constexpr const char* fn = "d2l::TransformerEncoder";
  const auto tokens = detail::checked_tokens(fn, X, embedding);
  detail::check_enc_valid_lens(fn, "valid_lens", mask.valid_lens(), X.size(0), X, "X");
  // The masks against n queries and keys of the embedding's dtype and
  // device, once for all blocks, with errors in the encoder's name.
  const auto& weight = embedding->weight;
  const auto steps = torch::empty({1}, weight.options())
                         .expand({X.size(0), X.size(1), options.block().num_hiddens()});
  detail::check_masks(fn, mask, steps, steps, options.block().num_heads());
  if (detail::why_not_fused_encoder(*this, tokens, mask).empty()) {
    EncoderOutput out;
    out.outputs = detail::fused_encoder(*this, tokens, mask);
    return out;
  }
  // The positional encoding lies in [-1, 1]: the embedding is scaled up first.
  auto H = pos_encoding(embedding(tokens) *
                        std::sqrt(static_cast<double>(options.block().num_hiddens())));
  for (int64_t i = 0; i < options.num_layers(); ++i) H = block(i)->forward(H, mask);
  EncoderOutput out;
  out.outputs = std::move(H);
  return out;
}

PathExplanation TransformerEncoderImpl::explain_forward(const torch::Tensor& X,
                                                        const AttentionMask& mask) const {
  PathExplanation out{"d2l::TransformerEncoder", AttentionBackend::kAuto, "fused_pass", {}};
  const auto why =
      X.defined() && X.dim() == 2
          ? detail::why_not_fused_encoder(*this, X, mask)
          : fmt::format("X {} is not (batch_size, steps) token ids", detail::shape_of(X));
  if (!why.empty()) {
    out.path = "blocks";
    out.reasons.push_back("fused_pass: " + why);
  }
  return out;
}

std::vector<torch::Tensor> TransformerEncoderImpl::attention_weights() const {
  std::vector<torch::Tensor> weights;
  for (int64_t i = 0; i < options.num_layers(); ++i) {
    weights.push_back(block(i)->attention->last_attention_weights());
  }
  return weights;
}

void TransformerEncoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::TransformerEncoder::load");
}

}  // namespace d2l
