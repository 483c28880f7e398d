// d2l 1.0's Transformer decoder (include/d2l/v1/transformer.h):
// TransformerDecoderBlock and TransformerDecoder, the book's code with the
// checks of the state they are handed back.

#include <d2l/scaled_dot_product_attention.h>
#include <d2l/v1/transformer.h>

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <ostream>
#include <string>
#include <utility>

#include "../attention_weights.h"
#include "../checked_load.h"
#include "../checks.h"
#include "../lazy_internal.h"
#include "../linear.h"
#include "../multi_head_attention_cache_internal.h"
#include "../seq2seq/sequence_checks.h"
#include "../transformer/cache.h"
#include "../transformer/options.h"
#include "transformer_internal.h"

// Note [The 1.0 decoder's step cache]
// The book's 1.0 TransformerDecoderBlock keeps each block's inputs so far
// (state[2][i]) and passes them all through the self-attention's W_k and W_v
// again at every step, and the encoder's outputs through the
// encoder-decoder attention's W_k and W_v: a step's cost grows with the
// steps before it. In evaluation mode, without autograd, and where no
// attention weights are recorded (d2l::generate without return_attention,
// or modules whose record_attention_weights is off), a block keeps instead
// what the 0.17 decoder keeps (Note [The decoder's step cache] in
// src/transformer/cache.h): its inputs in a buffer that grows by doubling,
// their keys and values projected once, and the encoder's projected once per
// decoding, in the same TransformerDecoderCache, so that d2l::select_rows
// reorders them for beam search. A step projects its own rows and attends
// over the cached rows with scaled_dot_product_attention, heads as the
// book's transpose_qkv splits them (a source with no valid step gets zero
// weights there, as from the library's masked_softmax). Elsewhere
// (training, autograd, weights recorded for heatmaps) the book's code runs.

namespace d2l::v1 {
namespace {

using d2l::detail::shape_of;

// The encoder's entries of a state: enc_outputs (B, m, any width) with at
// least one step, in the dtype and on the device of `weight`, and
// enc_valid_lens (B) or undefined.
void check_encoder_state(const char* fn, const DecoderState& state, int64_t batch,
                         const torch::Tensor& weight) {
  const auto& enc = state.enc_outputs;
  d2l::detail::check_strided_layout(fn, "state.enc_outputs", enc);
  TORCH_CHECK(enc.defined() && enc.dim() == 3 && enc.size(0) == batch && enc.size(1) > 0,
              fmt::format("{}: state.enc_outputs must have shape [batch_size={}, num_enc_steps, "
                          "features] with at least one step, got {}: a state from "
                          "TransformerDecoder::init_state of this model?",
                          fn, batch, shape_of(enc)));
  d2l::detail::check_same_dtype(fn, "the decoder's weights", weight, "state.enc_outputs", enc);
  d2l::detail::check_same_device(fn, "the decoder's weights", weight, "state.enc_outputs", enc);
  d2l::detail::check_enc_valid_lens(fn, "state.enc_valid_lens", state.enc_valid_lens, batch, enc,
                                    "state.enc_outputs");
}

// Block i's past inputs (the book's state[2][i]): undefined, or
// (B, steps so far, num_hiddens) like X.
void check_key_values(const char* fn, const DecoderState& state, int64_t i,
                      const torch::Tensor& X) {
  TORCH_CHECK(static_cast<int64_t>(state.key_values.size()) > i,
              fmt::format("{}: state.key_values has {} entries, block {} needs one of its own: a "
                          "state from TransformerDecoder::init_state of a decoder with more "
                          "blocks?",
                          fn, state.key_values.size(), i));
  const auto& past = state.key_values[static_cast<size_t>(i)];
  if (!past.defined()) return;
  d2l::detail::check_strided_layout(fn, "state.key_values[i]", past);
  TORCH_CHECK(past.dim() == 3 && past.size(0) == X.size(0) && past.size(2) == X.size(2),
              fmt::format("{}: state.key_values[{}] must have shape [batch_size={}, steps, "
                          "num_hiddens={}] like X, got {}",
                          fn, i, X.size(0), X.size(2), shape_of(past)));
  d2l::detail::check_same_dtype(fn, "X", X, "state.key_values[i]", past);
  d2l::detail::check_same_device(fn, "X", X, "state.key_values[i]", past);
}

// Appends K and V (B, s, num_hiddens), already projected, to `cache`,
// doubling its buffers (at least 8 rows) when full.
void append_projected(MultiHeadAttentionCache& cache, const torch::Tensor& K,
                      const torch::Tensor& V) {
  using Access = d2l::detail::MultiHeadAttentionCacheAccess;
  auto& keys = Access::keys(cache);
  auto& values = Access::values(cache);
  auto& length = Access::length(cache);
  const int64_t steps = K.size(1), needed = length + steps;
  if (!keys.defined() || needed > keys.size(1)) {
    const int64_t capacity = std::max<int64_t>({needed, keys.defined() ? 2 * keys.size(1) : 0, 8});
    const auto grow = [&](torch::Tensor& buffer, const torch::Tensor& like) {
      auto grown = torch::empty({like.size(0), capacity, like.size(2)}, like.options());
      if (length > 0) grown.narrow(1, 0, length).copy_(buffer.narrow(1, 0, length));
      buffer = std::move(grown);
    };
    grow(keys, K);
    grow(values, V);
  }
  keys.narrow(1, length, steps).copy_(K);
  values.narrow(1, length, steps).copy_(V);
  length = needed;
}

// x through W, one of m's projections, as m's forward projects it
// (detail::linear: the same kernels, whose rows' sums do not depend on the
// rows beside them, so that a source decodes alone as in a batch).
torch::Tensor project(const MultiHeadAttentionImpl& m, const LazyLinear& W,
                      const torch::Tensor& x) {
  return d2l::detail::linear(x, W->weight, W->bias, m.attention->options.backend());
}

// The cache of K and V projected by m's W_k and W_v.
MultiHeadAttentionCache projected(MultiHeadAttentionImpl& m, const torch::Tensor& K,
                                  const torch::Tensor& V) {
  MultiHeadAttentionCache cache;
  append_projected(cache, project(m, m.W_k, K), project(m, m.W_v, V));
  return cache;
}

// The book's MultiHeadAttention.forward after W_k and W_v, on a cache of
// their outputs: queries (B, n, q), valid_lens (B) or undefined.
torch::Tensor attend_cached(MultiHeadAttentionImpl& m, const torch::Tensor& queries,
                            const MultiHeadAttentionCache& cache, const torch::Tensor& valid_lens) {
  const int64_t B = queries.size(0), n = queries.size(1), t = cache.size();
  const int64_t heads = m.num_heads, width = m.num_hiddens / heads;
  const auto split = [&](const torch::Tensor& x, int64_t steps) {
    return x.view({B, steps, heads, width}).transpose(1, 2);
  };
  nn::functional::ScaledDotProductAttentionFuncOptions options;
  if (valid_lens.defined()) {
    options.attn_mask(
        torch::arange(t, valid_lens.options().dtype(torch::kLong)).view({1, 1, 1, t}) <
        valid_lens.view({B, 1, 1, 1}));
  }
  const auto out = nn::functional::scaled_dot_product_attention(
      split(project(m, m.W_q, queries), n), split(cache.keys(), t), split(cache.values(), t),
      options);
  return project(m, m.W_o, out.transpose(1, 2).reshape({B, n, m.num_hiddens}));
}

// Whether the block's attention runs on the step cache (Note [The 1.0
// decoder's step cache]).
bool uses_step_cache(const TransformerDecoderBlockImpl& block) {
  const auto records = [](const MultiHeadAttention& m) {
    return d2l::detail::records_weights(m->attention->options.record_attention_weights());
  };
  return !block.is_training() && !torch::GradMode::is_enabled() && !records(block.attention1) &&
         !records(block.attention2) && !has_uninitialized_params(block);
}

// Note [The 1.0 decoder's step cache]: the book's numbers, up to rounding.
std::tuple<torch::Tensor, DecoderState> forward_cached(TransformerDecoderBlockImpl& blk,
                                                       const torch::Tensor& X,
                                                       const DecoderState& state) {
  const auto slot = static_cast<size_t>(blk.i);
  const auto& past = state.key_values[slot];
  DecoderState next = state;
  auto* old = dynamic_cast<const d2l::detail::TransformerDecoderCache*>(state.cache.get());
  auto cache = old ? std::make_shared<d2l::detail::TransformerDecoderCache>(*old)
                   : std::make_shared<d2l::detail::TransformerDecoderCache>();
  if (cache->blocks.size() <= slot) cache->blocks.resize(slot + 1);
  auto& block = cache->blocks[slot];
  if (!block || !block->serves(past)) {
    auto fresh = std::make_shared<d2l::detail::BlockCache>();
    if (block) {  // The encoder's projections do not depend on the branch.
      fresh->cross_source = block->cross_source;
      fresh->cross_attention = block->cross_attention;
    }
    if (past.defined()) {
      fresh->append_inputs(past);
      fresh->self_attention = projected(*blk.attention1, past, past);
    }
    block = std::move(fresh);
  }
  block->append_inputs(X);
  next.key_values[slot] = block->filled_inputs();
  const auto& self = *blk.attention1;
  append_projected(block->self_attention, project(self, self.W_k, X), project(self, self.W_v, X));
  // In evaluation the book gives the self-attention no mask.
  const auto Y = blk.addnorm1(X, attend_cached(*blk.attention1, X, block->self_attention, {}));
  if (!block->cross_source.is_same(state.enc_outputs)) {
    block->cross_attention = projected(*blk.attention2, state.enc_outputs, state.enc_outputs);
    block->cross_source = state.enc_outputs;
  }
  const auto Y2 = attend_cached(*blk.attention2, Y, block->cross_attention, state.enc_valid_lens);
  next.cache = std::move(cache);
  const auto Z = blk.addnorm2(Y, Y2);
  return {blk.addnorm3(Z, blk.ffn(Z)), std::move(next)};
}

}  // namespace

// ---------------------------------------------------------------------------
// TransformerDecoderBlock

TransformerDecoderBlockImpl::TransformerDecoderBlockImpl(int64_t num_hiddens_,
                                                         int64_t ffn_num_hiddens_,
                                                         int64_t num_heads_, double dropout,
                                                         int64_t i_)
    : num_hiddens(num_hiddens_),
      ffn_num_hiddens(ffn_num_hiddens_),
      num_heads(num_heads_),
      dropout_p(dropout),
      i(i_) {
  reset();
}

void TransformerDecoderBlockImpl::reset() {
  constexpr const char* fn = "d2l::v1::TransformerDecoderBlock";
  detail::check_block_arguments(fn, num_hiddens, ffn_num_hiddens, num_heads, dropout_p);
  TORCH_CHECK(i >= 0, fmt::format("{}: the block index i must be non-negative, got {}", fn, i));
  attention1 = register_module("attention1", MultiHeadAttention(num_hiddens, num_heads, dropout_p));
  addnorm1 = register_module("addnorm1", AddNorm(num_hiddens, dropout_p));
  attention2 = register_module("attention2", MultiHeadAttention(num_hiddens, num_heads, dropout_p));
  addnorm2 = register_module("addnorm2", AddNorm(num_hiddens, dropout_p));
  ffn = register_module("ffn", PositionWiseFFN(ffn_num_hiddens, num_hiddens));
  addnorm3 = register_module("addnorm3", AddNorm(num_hiddens, dropout_p));
}

void TransformerDecoderBlockImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::v1::TransformerDecoderBlock(num_hiddens={}, ffn_num_hiddens={}, "
      "num_heads={}, dropout={}, i={})",
      num_hiddens, ffn_num_hiddens, num_heads, dropout_p, i);
}

void TransformerDecoderBlockImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::TransformerDecoderBlock::load");
}

std::tuple<torch::Tensor, DecoderState> TransformerDecoderBlockImpl::forward(
    const torch::Tensor& X, const DecoderState& state) {
  return forward_checked(X, state, /*check_encoder=*/true);
}

std::tuple<torch::Tensor, DecoderState> TransformerDecoderBlockImpl::forward_checked(
    const torch::Tensor& X, const DecoderState& state, bool check_encoder) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  constexpr const char* fn = "d2l::v1::TransformerDecoderBlock";
  detail::check_hidden_input(fn, X, num_hiddens);
  if (check_encoder) check_encoder_state(fn, state, X.size(0), X);
  check_key_values(fn, state, i, X);
  if (uses_step_cache(*this)) return forward_cached(*this, X, state);
  const auto slot = static_cast<size_t>(i);
  const auto& past = state.key_values[slot];
  DecoderState next = state;
  next.key_values[slot] = past.defined() ? torch::cat({past, X}, 1) : X;
  const auto& key_values = next.key_values[slot];
  // As the book: in training every row of dec_valid_lens is [1, ..., steps]
  // (causal); in evaluation no mask, the keys being the steps decoded so far.
  torch::Tensor dec_valid_lens;
  if (is_training()) {
    dec_valid_lens =
        torch::arange(1, X.size(1) + 1, X.options().dtype(torch::kLong)).repeat({X.size(0), 1});
  }
  const auto Y = addnorm1(X, attention1(X, key_values, key_values, dec_valid_lens));
  const auto Y2 = attention2(Y, state.enc_outputs, state.enc_outputs, state.enc_valid_lens);
  const auto Z = addnorm2(Y, Y2);
  return {addnorm3(Z, ffn(Z)), std::move(next)};
}

// ---------------------------------------------------------------------------
// TransformerDecoder

TransformerDecoderImpl::TransformerDecoderImpl(int64_t vocab_size_, int64_t num_hiddens_,
                                               int64_t ffn_num_hiddens_, int64_t num_heads_,
                                               int64_t num_blks_, double dropout)
    : vocab_size(vocab_size_),
      num_hiddens(num_hiddens_),
      ffn_num_hiddens(ffn_num_hiddens_),
      num_heads(num_heads_),
      num_blks(num_blks_),
      dropout_p(dropout) {
  reset();
}

void TransformerDecoderImpl::reset() {
  detail::check_stack_arguments("d2l::v1::TransformerDecoder", vocab_size, num_hiddens,
                                ffn_num_hiddens, num_heads, num_blks, dropout_p);
  embedding = register_module("embedding", torch::nn::Embedding(vocab_size, num_hiddens));
  pos_encoding = register_module("pos_encoding", PositionalEncoding(num_hiddens, dropout_p));
  blks = register_module("blks", torch::nn::Sequential());
  for (int64_t b = 0; b < num_blks; ++b) {
    blks->push_back("block" + std::to_string(b),
                    TransformerDecoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout_p, b));
  }
  dense = register_module("dense", LazyLinear(vocab_size));
}

void TransformerDecoderImpl::pretty_print(std::ostream& stream) const {
  stream << fmt::format(
      "d2l::v1::TransformerDecoder(vocab_size={}, num_hiddens={}, "
      "ffn_num_hiddens={}, num_heads={}, num_blks={}, dropout={})",
      vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout_p);
}

void TransformerDecoderImpl::load(torch::serialize::InputArchive& archive) {
  d2l::detail::checked_load(*this, archive, "d2l::v1::TransformerDecoder::load");
}

TransformerDecoderBlock TransformerDecoderImpl::block(int64_t i) const {
  return d2l::detail::block_at<TransformerDecoderBlock>("d2l::v1::TransformerDecoder::block", blks,
                                                        i, num_blks);
}

DecoderState TransformerDecoderImpl::init_state(const EncoderOutput& enc_outputs,
                                                const torch::Tensor& enc_valid_lens) {
  constexpr const char* fn = "d2l::v1::TransformerDecoder::init_state";
  const auto& out = enc_outputs.outputs;
  TORCH_CHECK(!enc_outputs.hidden_state.defined() && out.defined() && out.dim() == 3,
              fmt::format("{}: enc_outputs must be a TransformerEncoder's output: outputs "
                          "batch-first (batch_size, num_enc_steps, num_hiddens) and no "
                          "hidden_state, got outputs {} and hidden_state {}{}",
                          fn, shape_of(out), shape_of(enc_outputs.hidden_state),
                          enc_outputs.hidden_state.defined() ? " (an RNN encoder's?)" : ""));
  DecoderState state;
  state.enc_outputs = out;
  state.enc_valid_lens = enc_valid_lens;
  check_encoder_state(fn, state, out.size(0), embedding->weight);
  state.key_values.resize(static_cast<size_t>(num_blks));
  return state;
}

std::tuple<torch::Tensor, DecoderState> TransformerDecoderImpl::forward(const torch::Tensor& X,
                                                                        const DecoderState& state) {
  d2l::detail::LazyCallGuard lazy_guard(*this);  // a refused call fixes no width
  constexpr const char* fn = "d2l::v1::TransformerDecoder";
  const auto tokens = d2l::detail::checked_tokens(fn, X, embedding);
  TORCH_CHECK(static_cast<int64_t>(state.key_values.size()) == num_blks,
              fmt::format("{}: state.key_values must have one entry per block (num_blks={}), "
                          "got {}: a state from init_state of another decoder?",
                          fn, num_blks, state.key_values.size()));
  check_encoder_state(fn, state, X.size(0), embedding->weight);
  auto H = detail::embed(tokens, embedding, pos_encoding, num_hiddens);
  DecoderState next = state;
  for (int64_t b = 0; b < num_blks; ++b) {
    std::tie(H, next) = block(b)->forward_checked(H, next, /*check_encoder=*/false);
  }
  return {dense(H), std::move(next)};
}

std::array<std::vector<torch::Tensor>, 2> TransformerDecoderImpl::attention_weights() const {
  std::array<std::vector<torch::Tensor>, 2> weights;
  for (int64_t b = 0; b < num_blks; ++b) {
    const auto blk = block(b);
    weights[0].push_back(blk->attention1->last_attention_weights());
    weights[1].push_back(blk->attention2->last_attention_weights());
  }
  return weights;
}

}  // namespace d2l::v1
