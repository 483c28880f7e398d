// d2l 1.0's Transformer layers (include/d2l/v1/transformer.h):
// PositionWiseFFN, AddNorm, TransformerEncoderBlock and TransformerEncoder,
// on the lazy layers and 1.0's MultiHeadAttention; and the checks the
// decoder shares (transformer_internal.h).

#include <d2l/v1/transformer.h>

#include <fmt/format.h>

#include <cmath>
#include <ostream>
#include <string>

#include "../checked_load.h"
#include "../checks.h"
#include "../lazy_internal.h"
#include "../seq2seq/sequence_checks.h"
#include "../transformer/options.h"
#include "transformer_internal.h"

namespace d2l::v1 {
namespace detail {

void check_block_arguments(const char* fn, int64_t num_hiddens, int64_t ffn_num_hiddens,
                           int64_t num_heads, double dropout) {
  TORCH_CHECK(num_hiddens > 0 && ffn_num_hiddens > 0 && num_heads > 0,
              fmt::format("{}: num_hiddens, ffn_num_hiddens and num_heads must be positive, got "
                          "num_hiddens={}, ffn_num_hiddens={}, num_heads={}",
                          fn, num_hiddens, ffn_num_hiddens, num_heads));
  TORCH_CHECK(num_hiddens % num_heads == 0,
              fmt::format("{}: num_hiddens={} must be a multiple of num_heads={}", fn, num_hiddens,
                          num_heads));
  d2l::detail::check_dropout(fn, dropout);
}

void check_stack_arguments(const char* fn, int64_t vocab_size, int64_t num_hiddens,
                           int64_t ffn_num_hiddens, int64_t num_heads, int64_t num_blks,
                           double dropout) {
  TORCH_CHECK(vocab_size > 0 && num_blks > 0,
              fmt::format("{}: vocab_size and num_blks must be positive, got vocab_size={}, "
                          "num_blks={}",
                          fn, vocab_size, num_blks));
  check_block_arguments(fn, num_hiddens, ffn_num_hiddens, num_heads, dropout);
}

void check_hidden_input(const char* fn, const torch::Tensor& X, int64_t num_hiddens) {
  d2l::detail::check_floating(fn, "X", X, 3);
  TORCH_CHECK(X.size(0) > 0 && X.size(1) > 0 && X.size(2) == num_hiddens,
              fmt::format("{}: X must have shape [batch_size, num_steps, num_hiddens={}] with at "
                          "least one example and one step, got {}",
                          fn, num_hiddens, d2l::detail::shape_of(X)));
}

torch::Tensor embed(const torch::Tensor& tokens, torch::nn::Embedding& embedding,
                    PositionalEncoding& pos_encoding, int64_t num_hiddens) {
  return pos_encoding(embedding(tokens) * std::sqrt(static_cast<double>(num_hiddens)));
}

}  // namespace detail

// ---------------------------------------------------------------------------
// PositionWiseFFN

PositionWiseFFNImpl::PositionWiseFFNImpl(int64_t ffn_num_hiddens_, int64_t ffn_num_outputs_)
    : ffn_num_hiddens(ffn_num_hiddens_), ffn_num_outputs(ffn_num_outputs_) {
  reset();
}

void PositionWiseFFNImpl::reset() {
  TORCH_CHECK(ffn_num_hiddens > 0 && ffn_num_outputs > 0,
              fmt::format("d2l::v1::PositionWiseFFN: ffn_num_hiddens and ffn_num_outputs must be "
                          "positive, got {} and {}",
                          ffn_num_hiddens, ffn_num_outputs));
  dense1 = register_module("dense1", LazyLinear(ffn_num_hiddens));
  relu = register_module("relu", torch::nn::ReLU());
  dense2 = register_module("dense2", LazyLinear(ffn_num_outputs));
}

void PositionWiseFFNImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format("d2l::v1::PositionWiseFFN(ffn_num_hiddens={}, ffn_num_outputs={})",
                        ffn_num_hiddens, ffn_num_outputs);
}

void PositionWiseFFNImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::PositionWiseFFN::load");
}

torch::Tensor PositionWiseFFNImpl::forward(const torch::Tensor& X) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  // Checked in this module's name before dense1 takes its width from X.
  dense1->ensure_width("d2l::v1::PositionWiseFFN", "X", X);
  return dense2(relu(dense1(X)));
}

// ---------------------------------------------------------------------------
// AddNorm

AddNorm::AddNorm(int64_t norm_shape, double dropout)
    : torch::nn::ModuleHolder<Impl>(
          std::make_shared<Impl>(std::vector<int64_t>{norm_shape}, dropout)) {}

// ---------------------------------------------------------------------------
// TransformerEncoderBlock

TransformerEncoderBlockImpl::TransformerEncoderBlockImpl(int64_t num_hiddens_,
                                                         int64_t ffn_num_hiddens_,
                                                         int64_t num_heads_, double dropout,
                                                         bool use_bias_)
    : num_hiddens(num_hiddens_),
      ffn_num_hiddens(ffn_num_hiddens_),
      num_heads(num_heads_),
      dropout_p(dropout),
      use_bias(use_bias_) {
  reset();
}

void TransformerEncoderBlockImpl::reset() {
  detail::check_block_arguments("d2l::v1::TransformerEncoderBlock", num_hiddens, ffn_num_hiddens,
                                num_heads, dropout_p);
  attention =
      register_module("attention", MultiHeadAttention(num_hiddens, num_heads, dropout_p, use_bias));
  addnorm1 = register_module("addnorm1", AddNorm(num_hiddens, dropout_p));
  ffn = register_module("ffn", PositionWiseFFN(ffn_num_hiddens, num_hiddens));
  addnorm2 = register_module("addnorm2", AddNorm(num_hiddens, dropout_p));
}

void TransformerEncoderBlockImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::v1::TransformerEncoderBlock(num_hiddens={}, ffn_num_hiddens={}, "
      "num_heads={}, dropout={}, use_bias={})",
      num_hiddens, ffn_num_hiddens, num_heads, dropout_p, use_bias);
}

void TransformerEncoderBlockImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::TransformerEncoderBlock::load");
}

torch::Tensor TransformerEncoderBlockImpl::forward(const torch::Tensor& X,
                                                   const AttentionMask& valid_lens) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  detail::check_hidden_input("d2l::v1::TransformerEncoderBlock", X, num_hiddens);
  const auto Y = addnorm1(X, attention(X, X, X, valid_lens));
  return addnorm2(Y, ffn(Y));
}

// ---------------------------------------------------------------------------
// TransformerEncoder

TransformerEncoderImpl::TransformerEncoderImpl(int64_t vocab_size_, int64_t num_hiddens_,
                                               int64_t ffn_num_hiddens_, int64_t num_heads_,
                                               int64_t num_blks_, double dropout, bool use_bias_)
    : vocab_size(vocab_size_),
      num_hiddens(num_hiddens_),
      ffn_num_hiddens(ffn_num_hiddens_),
      num_heads(num_heads_),
      num_blks(num_blks_),
      dropout_p(dropout),
      use_bias(use_bias_) {
  reset();
}

void TransformerEncoderImpl::reset() {
  detail::check_stack_arguments("d2l::v1::TransformerEncoder", vocab_size, num_hiddens,
                                ffn_num_hiddens, num_heads, num_blks, dropout_p);
  embedding = register_module("embedding", torch::nn::Embedding(vocab_size, num_hiddens));
  pos_encoding = register_module("pos_encoding", PositionalEncoding(num_hiddens, dropout_p));
  blks = register_module("blks", torch::nn::Sequential());
  for (int64_t i = 0; i < num_blks; ++i) {
    blks->push_back(
        "block" + std::to_string(i),
        TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout_p, use_bias));
  }
}

void TransformerEncoderImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::v1::TransformerEncoder(vocab_size={}, num_hiddens={}, "
      "ffn_num_hiddens={}, num_heads={}, num_blks={}, dropout={}, use_bias={})",
      vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout_p, use_bias);
}

void TransformerEncoderImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::TransformerEncoder::load");
}

TransformerEncoderBlock TransformerEncoderImpl::block(int64_t i) const {
  return d2l::detail::block_at<TransformerEncoderBlock>("d2l::v1::TransformerEncoder::block", blks,
                                                        i, num_blks);
}

EncoderOutput TransformerEncoderImpl::forward(const torch::Tensor& X,
                                              const torch::Tensor& valid_lens) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  constexpr const char* fn = "d2l::v1::TransformerEncoder";
  const auto tokens = d2l::detail::checked_tokens(fn, X, embedding);
  d2l::detail::check_enc_valid_lens(fn, "valid_lens", valid_lens, X.size(0), X, "X");
  auto H = detail::embed(tokens, embedding, pos_encoding, num_hiddens);
  for (int64_t i = 0; i < num_blks; ++i) H = block(i)->forward(H, valid_lens);
  EncoderOutput out;
  out.outputs = std::move(H);
  return out;
}

std::vector<torch::Tensor> TransformerEncoderImpl::attention_weights() const {
  std::vector<torch::Tensor> weights;
  for (int64_t i = 0; i < num_blks; ++i) {
    weights.push_back(block(i)->attention->last_attention_weights());
  }
  return weights;
}

}  // namespace d2l::v1
