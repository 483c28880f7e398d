// The Transformer's decoder (d2l 0.17): DecoderBlock and TransformerDecoder,
// with the step cache of evaluation mode (Note [The decoder's step cache]).

#include <d2l/transformer.h>

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "checked_load.h"
#include "checks.h"
#include "linear.h"
#include "packed_weights.h"
#include "seq2seq/sequence_checks.h"
#include "transformer/cache.h"
#include "transformer/fused_step.h"
#include "transformer/options.h"

namespace d2l {
namespace {

// The encoder-side entries of a state: enc_outputs (B, m, key_size) and
// enc_valid_lens, in the dtype and on the device of `weight`.
void check_encoder_state(const char* fn, const DecoderState& state, int64_t batch,
                         const TransformerBlockOptions& o, const torch::Tensor& weight) {
  const auto& enc = state.enc_outputs;
  detail::check_strided_layout(fn, "state.enc_outputs", enc);
  TORCH_CHECK(enc.defined() && enc.dim() == 3 && enc.size(0) == batch && enc.size(1) > 0 &&
                  enc.size(2) == o.key_size() && enc.size(2) == o.value_size(),
              fmt::format("{}: state.enc_outputs must have shape [batch_size={}, num_enc_steps, "
                          "key_size={}] (value_size={}) with at least one step, got {}: a state "
                          "from TransformerDecoder::init_state of this model?",
                          fn, batch, o.key_size(), o.value_size(), detail::shape_of(enc)));
  detail::check_same_dtype(fn, "the decoder's weights", weight, "state.enc_outputs", enc);
  detail::check_same_device(fn, "the decoder's weights", weight, "state.enc_outputs", enc);
  detail::check_enc_valid_lens(fn, "state.enc_valid_lens", state.enc_valid_lens, batch, enc,
                               "state.enc_outputs");
  const auto& padding = state.enc_key_padding_mask;
  if (!padding.defined()) return;
  detail::check_strided_layout(fn, "state.enc_key_padding_mask", padding);
  TORCH_CHECK(padding.scalar_type() == torch::kBool && padding.dim() == 2 &&
                  padding.size(0) == batch && padding.size(1) == enc.size(1),
              fmt::format("{}: state.enc_key_padding_mask must be a torch::kBool tensor of shape "
                          "[batch_size={}, num_enc_steps={}] like state.enc_outputs {}, got {} {}",
                          fn, batch, enc.size(1), detail::shape_of(enc),
                          c10::toString(padding.scalar_type()), detail::shape_of(padding)));
  detail::check_same_device(fn, "state.enc_outputs", enc, "state.enc_key_padding_mask", padding);
}

// Block i's past inputs: undefined, or (B, steps so far, num_hiddens) like X.
void check_key_values(const char* fn, const DecoderState& state, int64_t i,
                      const torch::Tensor& X) {
  TORCH_CHECK(static_cast<int64_t>(state.key_values.size()) > i,
              fmt::format("{}: state.key_values has {} entries, block {} needs one of its own: a "
                          "state from TransformerDecoder::init_state of a decoder with more blocks?",
                          fn, state.key_values.size(), i));
  const auto& past = state.key_values[static_cast<size_t>(i)];
  if (!past.defined()) return;
  detail::check_strided_layout(fn, "state.key_values[i]", past);
  TORCH_CHECK(past.dim() == 3 && past.size(0) == X.size(0) && past.size(2) == X.size(2),
              fmt::format("{}: state.key_values[{}] must have shape [batch_size={}, steps, "
                          "num_hiddens={}] like X, got {}",
                          fn, i, X.size(0), X.size(2), detail::shape_of(past)));
  detail::check_same_dtype(fn, "X", X, "state.key_values[i]", past);
  detail::check_same_device(fn, "X", X, "state.key_values[i]", past);
}

// What the encoder-decoder attention masks: the encoder's padding.
AttentionMask source_mask(const DecoderState& state) {
  return AttentionMask()
      .valid_lens(state.enc_valid_lens)
      .key_padding_mask(state.enc_key_padding_mask);
}

}  // namespace

// ---------------------------------------------------------------------------
// DecoderBlock

DecoderBlockImpl::DecoderBlockImpl(int64_t key_size, int64_t query_size, int64_t value_size,
                                   int64_t num_hiddens, std::vector<int64_t> norm_shape,
                                   int64_t ffn_num_input, int64_t ffn_num_hiddens,
                                   int64_t num_heads, double dropout, int64_t i_)
    : DecoderBlockImpl(detail::block_options(key_size, query_size, value_size, num_hiddens,
                                             std::move(norm_shape), ffn_num_input, ffn_num_hiddens,
                                             num_heads, dropout, /*use_bias=*/false),
                       i_) {}

DecoderBlockImpl::DecoderBlockImpl(const TransformerBlockOptions& options_, int64_t i_)
    : options(options_), i(i_) {
  reset();
}

void DecoderBlockImpl::reset() {
  constexpr const char* fn = "d2l::DecoderBlock";
  const auto& o = options;
  detail::check_block_options(fn, o);
  TORCH_CHECK(i >= 0, fmt::format("{}: the block index i must be non-negative, got {}", fn, i));
  attention1 = register_module("attention1", detail::make_block_attention(o, o.use_bias()));
  addnorm1 = register_module("addnorm1", AddNorm(o.norm_shape(), o.dropout()));
  attention2 = register_module("attention2", detail::make_block_attention(o, o.use_bias()));
  addnorm2 = register_module("addnorm2", AddNorm(o.norm_shape(), o.dropout()));
  ffn = register_module("ffn", PositionWiseFFN(o.ffn_num_input(), o.ffn_num_hiddens(),
                                               o.num_hiddens()));
  addnorm3 = register_module("addnorm3", AddNorm(o.norm_shape(), o.dropout()));
}

void DecoderBlockImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_block("d2l::DecoderBlock", options) << " i=" << i;
}

std::tuple<torch::Tensor, DecoderState> DecoderBlockImpl::forward(const torch::Tensor& X,
                                                                  const DecoderState& state) {
  return forward_checked(X, state, /*check_encoder=*/true);
}

std::tuple<torch::Tensor, DecoderState> DecoderBlockImpl::forward_checked(
    const torch::Tensor& X, const DecoderState& state, bool check_encoder) {
  constexpr const char* fn = "d2l::DecoderBlock";
  detail::check_floating(fn, "X", X, 3);
  TORCH_CHECK(X.size(0) > 0 && X.size(1) > 0 && X.size(2) == options.query_size(),
              fmt::format("{}: X must have shape [batch_size, steps, query_size={}] with at least "
                          "one example and one step, got {}",
                          fn, options.query_size(), detail::shape_of(X)));
  // Reading the lengths is a synchronisation on CUDA: once a step, not once a block.
  if (check_encoder) check_encoder_state(fn, state, X.size(0), options, attention2->W_k->weight);
  check_key_values(fn, state, i, X);

  DecoderState next = state;
  const auto slot = static_cast<size_t>(i);
  const auto& past = state.key_values[slot];
  // In training, as the book, the lengths 1..steps; in evaluation, every
  // key, or with `causal` each query's own and earlier ones.
  AttentionMask self_mask;
  if (is_training()) {
    self_mask.valid_lens(
        torch::arange(1, X.size(1) + 1, X.options().dtype(torch::kLong)).repeat({X.size(0), 1}));
  } else if (options.causal()) {
    self_mask.is_causal(true);
  }
  torch::Tensor Y, Y2;
  if (!is_training() && !torch::GradMode::is_enabled()) {
    // Note [The decoder's step cache]: the same numbers as the branch below.
    auto* old = dynamic_cast<const detail::TransformerDecoderCache*>(state.cache.get());
    auto cache = old ? std::make_shared<detail::TransformerDecoderCache>(*old)
                     : std::make_shared<detail::TransformerDecoderCache>();
    if (cache->blocks.size() <= slot) cache->blocks.resize(slot + 1);
    auto& block = cache->blocks[slot];
    if (!block || !block->serves(past)) {
      auto fresh = std::make_shared<detail::BlockCache>();
      fresh->self_attention.set_check_weight_bytes(false);  // Note [Caches keyed on weights]
      if (block) {  // The encoder's projections do not depend on the branch.
        fresh->cross_source = block->cross_source;
        fresh->cross_attention = block->cross_attention;
      }
      if (past.defined()) {
        fresh->append_inputs(past);
        attention1->extend_cache(fresh->self_attention, past, past);
      }
      block = std::move(fresh);
    }
    block->append_inputs(X);
    next.key_values[slot] = block->filled_inputs();
    Y = addnorm1(X, attention1->forward_cached(X, X, X, block->self_attention, self_mask));
    if (!block->cross_source.is_same(state.enc_outputs)) {
      block->cross_attention = attention2->project_memory(state.enc_outputs, state.enc_outputs);
      block->cross_attention.set_check_weight_bytes(false);
      block->cross_source = state.enc_outputs;
    }
    Y2 = attention2->forward_cached(Y, {}, {}, block->cross_attention, source_mask(state));
    next.cache = std::move(cache);
  } else {
    // The book's code.
    const auto key_values = past.defined() ? torch::cat({past, X}, 1) : X;
    next.key_values[slot] = key_values;
    Y = addnorm1(X, attention1->forward(X, key_values, key_values, self_mask));
    Y2 = attention2->forward(Y, state.enc_outputs, state.enc_outputs, source_mask(state));
  }
  const auto Z = addnorm2(Y, Y2);
  return {addnorm3(Z, ffn(Z)), std::move(next)};
}

void DecoderBlockImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::DecoderBlock::load");
}

// ---------------------------------------------------------------------------
// TransformerDecoder

TransformerDecoderImpl::TransformerDecoderImpl(int64_t vocab_size, int64_t key_size,
                                               int64_t query_size, int64_t value_size,
                                               int64_t num_hiddens, std::vector<int64_t> norm_shape,
                                               int64_t ffn_num_input, int64_t ffn_num_hiddens,
                                               int64_t num_heads, int64_t num_layers,
                                               double dropout)
    : TransformerDecoderImpl(TransformerOptions(
          vocab_size,
          detail::block_options(key_size, query_size, value_size, num_hiddens,
                                std::move(norm_shape), ffn_num_input, ffn_num_hiddens, num_heads,
                                dropout, /*use_bias=*/false),
          num_layers)) {}

TransformerDecoderImpl::TransformerDecoderImpl(const TransformerOptions& options_)
    : options(options_) {
  reset();
}

void TransformerDecoderImpl::reset() {
  constexpr const char* fn = "d2l::TransformerDecoder";
  detail::check_transformer_options(fn, options);
  embedding = register_module("embedding", detail::make_embedding(options));
  pos_encoding = register_module("pos_encoding", detail::make_positional_encoding(options));
  blks = register_module("blks", torch::nn::Sequential());
  for (int64_t i = 0; i < options.num_layers(); ++i) {
    blks->push_back("block" + std::to_string(i), DecoderBlock(options.block(), i));
  }
  dense = register_module("dense",
                          torch::nn::Linear(options.block().num_hiddens(), options.vocab_size()));
}

void TransformerDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << detail::describe_transformer("d2l::TransformerDecoder", options);
}

DecoderBlock TransformerDecoderImpl::block(int64_t i) const {
  return detail::block_at<DecoderBlock>("d2l::TransformerDecoder::block", blks, i,
                                        options.num_layers());
}

DecoderState TransformerDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                                const torch::Tensor& enc_valid_lens) {
  return init_state(enc_outputs, AttentionMask().valid_lens(enc_valid_lens));
}

DecoderState TransformerDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                                const AttentionMask& src_mask) {
  constexpr const char* fn = "d2l::TransformerDecoder::init_state";
  const auto& out = enc_outputs.outputs;
  TORCH_CHECK(!enc_outputs.hidden_state.defined() && out.defined() && out.dim() == 3,
              fmt::format("{}: enc_outputs must be a TransformerEncoder's output: outputs "
                          "batch-first (batch_size, num_enc_steps, num_hiddens) and no "
                          "hidden_state, got outputs {} and hidden_state {}{}",
                          fn, detail::shape_of(out), detail::shape_of(enc_outputs.hidden_state),
                          enc_outputs.hidden_state.defined() ? " (an RNN encoder's?)" : ""));
  DecoderState state;
  state.enc_outputs = out;
  state.enc_valid_lens = src_mask.valid_lens();
  state.enc_key_padding_mask = src_mask.key_padding_mask();
  check_encoder_state(fn, state, out.size(0), options.block(), embedding->weight);
  // A new decoding: packed weights check their bytes again (Note [Packed weights]).
  detail::recheck_packed_weights();
  state.key_values.resize(static_cast<size_t>(options.num_layers()));
  return state;
}

std::tuple<torch::Tensor, DecoderState> TransformerDecoderImpl::forward(const torch::Tensor& X,
                                                                        const DecoderState& state) {
  constexpr const char* fn = "d2l::TransformerDecoder";
  const auto tokens = detail::checked_tokens(fn, X, embedding);
  TORCH_CHECK(static_cast<int64_t>(state.key_values.size()) == options.num_layers(),
              fmt::format("{}: state.key_values must have one entry per block (num_layers={}), "
                          "got {}: a state from init_state of another decoder?",
                          fn, options.num_layers(), state.key_values.size()));
  check_encoder_state(fn, state, X.size(0), options.block(), embedding->weight);
  if (detail::why_not_fused_step(*this, tokens, state).empty()) {
    // Note [The fused decoder step]: a decoding step in one pass.
    DecoderState next = state;
    auto Y = detail::fused_step(*this, tokens, state, next);
    return {std::move(Y), std::move(next)};
  }
  // As the book: every call adds positions 0, 1, ... to its own tokens, also
  // when it decodes one token after others.
  auto H = pos_encoding(embedding(tokens) *
                        std::sqrt(static_cast<double>(options.block().num_hiddens())));
  DecoderState next = state;
  for (int64_t i = 0; i < options.num_layers(); ++i) {
    std::tie(H, next) = block(i)->forward_checked(H, next, /*check_encoder=*/false);
  }
  // dense(H), split over threads where BLAS would not (linear.h).
  return {detail::linear(H, dense->weight, dense->bias), std::move(next)};
}

PathExplanation TransformerDecoderImpl::explain_step(const torch::Tensor& X,
                                                     const DecoderState& state) const {
  PathExplanation out{"d2l::TransformerDecoder", AttentionBackend::kAuto, "fused_step", {}};
  std::string why;
  if (!X.defined() || X.dim() != 2 || X.size(0) == 0) {
    why = fmt::format("X {} is not (batch_size, steps) token ids", detail::shape_of(X));
  } else if (static_cast<int64_t>(state.key_values.size()) != options.num_layers()) {
    why = "state.key_values without one entry per block: not this decoder's init_state";
  } else {
    why = detail::why_not_fused_step(*this, X, state);
  }
  if (!why.empty()) {
    out.path = "blocks";
    out.reasons.push_back("fused_step: " + why);
  }
  return out;
}

std::array<std::vector<torch::Tensor>, 2> TransformerDecoderImpl::block_attention_weights() const {
  std::array<std::vector<torch::Tensor>, 2> weights;
  for (int64_t i = 0; i < options.num_layers(); ++i) {
    const auto blk = block(i);
    weights[0].push_back(blk->attention1->last_attention_weights());
    weights[1].push_back(blk->attention2->last_attention_weights());
  }
  return weights;
}

torch::Tensor TransformerDecoderImpl::attention_weights() const {
  const int64_t heads = options.block().num_heads();
  const auto weights = block_attention_weights();
  std::vector<torch::Tensor> cross;
  for (const auto& w : weights[1]) {
    if (!w.defined()) return {};
    // (B * heads, steps, m) -> (B, 1, heads, steps, m)
    cross.push_back(w.reshape({-1, heads, w.size(1), w.size(2)}).unsqueeze(1));
  }
  const auto stacked = torch::cat(cross, 1);
  return stacked.reshape({stacked.size(0), -1, stacked.size(3), stacked.size(4)});
}

void TransformerDecoderImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::TransformerDecoder::load");
}

}  // namespace d2l
