// The 0.17 Transformer decoder's decoding step in one pass
// (Note [The fused decoder step]).

#include "transformer/fused_step.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/modules/container/sequential.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "linear.h"
#include "multi_head_attention_cache_internal.h"
#include "select.h"
#include "transformer/cache.h"
#include "transformer/fused_parts.h"

// Note [The fused decoder step]
// At the book's sizes (32 hidden units, 4 heads, 2 blocks) a decoding step
// of one sentence is a few tens of thousands of multiply-adds, and through
// the modules it is about 400 ATen calls (views, allocations, the
// dispatcher's lookups, dropout's identities), each costing more than its
// arithmetic: 270 µs a token where CTranslate2 takes 33 (docs/generation.md).
// So in evaluation mode under no-grad, on the CPU in float or double, one
// step of tokens (B, 1) runs here as one pass: the embedding and position,
// then per block the projections of the step's rows (linear_into: the
// few-rows kernel on the calling thread for small products, else the
// products linear() runs), the new keys and values written into the block's
// MultiHeadAttentionCache, the small-heads kernel over the cache in place
// (the one the modules' cached path runs), residual and layer norm, the
// encoder-decoder attention over its projected memory and the FFN; then the
// output layer. Everything lives in one workspace of the step; the only
// tensors made are the logits, the weights recorded (where the modules
// record them) and, now and then, a cache growing.
//
// It reads and writes the caches the blocks' cached path keeps (Note [The
// decoder's step cache]) in the same way, so steps of either kind may follow
// each other, select_rows reorders both, and the states are the blocks':
// key_values[i] the block's inputs so far. What it does not do it leaves to
// the blocks: a state whose key_values are not its cache's (advanced twice,
// or set by the caller) needs the past projected again; masks other than
// lengths (a key padding mask); other backends than kAuto and kFused
// (kComposite is the book's oracle); more than one step a call. The numbers
// are the cached path's up to the order of float sums: the same kernels for
// the products and the heads, the layer norm's moments in double.

namespace d2l::detail {

namespace {

using Access = MultiHeadAttentionCacheAccess;

constexpr const char* kDecoderFn = "d2l::TransformerDecoder";

// Copies rows (B, h) of `rows` into row `at` of a (B, capacity, h) buffer.
template <typename T>
void write_rows(const T* rows, int64_t B, int64_t h, const torch::Tensor& buffer, int64_t at) {
  T* base = buffer.data_ptr<T>();
  const int64_t capacity = buffer.size(1);
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(rows + b * h, h, base + (b * capacity + at) * h);
  }
}

// The encoder-decoder attention's keys and values of the encoder's outputs
// `enc` (B, m, h), projected by m's W_k and W_v into a cache of their own (as
// MultiHeadAttention::project_memory, without a tensor per product).
template <typename T>
void project_memory(MultiHeadAttentionImpl& m, const torch::Tensor& enc,
                    MultiHeadAttentionCache& cache) {
  const auto source = enc.contiguous();
  const int64_t B = source.size(0), steps = source.size(1);
  cache = MultiHeadAttentionCache();
  cache.set_check_weight_bytes(false);  // Note [Caches keyed on weights]
  reserve_keys_values(cache, m, B, steps, /*minimum=*/0);
  const T* rows = source.data_ptr<T>();
  linear_into<T>(Access::keys(cache).data_ptr<T>(), rows, B * steps, m.W_k->weight, m.W_k->bias);
  linear_into<T>(Access::values(cache).data_ptr<T>(), rows, B * steps, m.W_v->weight, m.W_v->bias);
  Access::length(cache) = steps;
}

template <typename T>
torch::Tensor fused_step_typed(TransformerDecoderImpl& d, const torch::Tensor& X,
                               const DecoderState& state, DecoderState& next) {
  const auto& bo = d.options.block();
  const int64_t B = X.size(0), h = bo.num_hiddens(), f = bo.ffn_num_hiddens();
  const int64_t layers = d.options.num_layers();
  const auto options = d.embedding->weight.options();

  // The workspace: the rows entering a block (x), after its self-attention
  // (y) and its encoder-decoder attention (z), the queries, the heads
  // joined, a sublayer's output, the FFN's hidden units.
  std::vector<T> workspace(static_cast<size_t>(B * (6 * h + f)));
  T* x = workspace.data();
  T* y = x + B * h;
  T* z = y + B * h;
  T* q = z + B * h;
  T* joined = q + B * h;
  T* t = joined + B * h;
  T* hidden = t + B * h;

  // embedding(X) * sqrt(num_hiddens) + P[0]: every call adds positions from
  // 0 to its own tokens, as the book's.
  const auto tokens = (X.scalar_type() == torch::kLong ? X : X.to(torch::kLong)).contiguous();
  fused::embed(d.options, d.embedding, d.pos_encoding, tokens.data_ptr<int64_t>(), B, 1, x);

  auto* old = dynamic_cast<const TransformerDecoderCache*>(state.cache.get());
  auto cache = old ? std::make_shared<TransformerDecoderCache>(*old)
                   : std::make_shared<TransformerDecoderCache>();
  cache->blocks.resize(static_cast<size_t>(layers));
  const auto& enc = state.enc_outputs;
  static const auto all_keys = torch::empty({0}, torch::kLong);
  const at::TensorBase& enc_lens = state.enc_valid_lens.defined() ? state.enc_valid_lens : all_keys;
  std::vector<int64_t> held(static_cast<size_t>(B));
  for (int64_t i = 0; i < layers; ++i) {
    auto blk = d.block(i);
    auto& m1 = *blk->attention1;
    auto& m2 = *blk->attention2;
    auto& block = cache->blocks[static_cast<size_t>(i)];
    if (!block || !block->serves(state.key_values[static_cast<size_t>(i)])) {
      // No past (why_not_fused_step refuses a past the cache does not hold):
      // a new cache, the encoder's projections kept.
      auto fresh = std::make_shared<BlockCache>();
      fresh->self_attention.set_check_weight_bytes(false);  // Note [Caches keyed on weights]
      if (block) {
        fresh->cross_source = block->cross_source;
        fresh->cross_attention = block->cross_attention;
      }
      block = std::move(fresh);
    }
    check_cache_source(kDecoderFn, m1, block->self_attention);
    const int64_t length = block->length;
    block->reserve_inputs(B, length + 1, h, options);
    reserve_keys_values(block->self_attention, m1, B, length + 1);
    write_rows(x, B, h, block->inputs, length);
    // The step's key and value rows, straight into the cache.
    linear_into<T>(t, x, B, m1.W_k->weight, m1.W_k->bias);
    write_rows(t, B, h, Access::keys(block->self_attention), length);
    linear_into<T>(t, x, B, m1.W_v->weight, m1.W_v->bias);
    write_rows(t, B, h, Access::values(block->self_attention), length);
    block->length = length + 1;
    Access::length(block->self_attention) = length + 1;
    next.key_values[static_cast<size_t>(i)] = block->filled_inputs();

    linear_into<T>(q, x, B, m1.W_q->weight, m1.W_q->bias);
    std::fill(held.begin(), held.end(), length + 1);
    const auto& self = block->self_attention;
    fused::heads(m1, torch::from_blob(q, {B, 1, h}, options), Access::keys(self),
                 Access::values(self), torch::from_blob(held.data(), {B}, torch::kLong), length + 1,
                 joined);
    linear_into<T>(t, joined, B, m1.W_o->weight, m1.W_o->bias);
    fused::add_layer_norm(blk->addnorm1, t, x, B, h, y);

    if (!block->cross_source.is_same(enc)) {
      project_memory<T>(m2, enc, block->cross_attention);
      block->cross_source = enc;
    }
    check_cache_source(kDecoderFn, m2, block->cross_attention);
    linear_into<T>(q, y, B, m2.W_q->weight, m2.W_q->bias);
    const auto& cross = block->cross_attention;
    fused::heads(m2, torch::from_blob(q, {B, 1, h}, options), Access::keys(cross),
                 Access::values(cross), enc_lens, cross.size(), joined);
    linear_into<T>(t, joined, B, m2.W_o->weight, m2.W_o->bias);
    fused::add_layer_norm(blk->addnorm2, t, y, B, h, z);

    const auto& ffn = blk->ffn;
    linear_into<T>(hidden, z, B, ffn->dense1->weight, ffn->dense1->bias);
    fused::relu(hidden, B * f);
    linear_into<T>(t, hidden, B, ffn->dense2->weight, ffn->dense2->bias);
    fused::add_layer_norm(blk->addnorm3, t, z, B, h, x);
  }
  next.cache = std::move(cache);
  auto logits = torch::empty({B, 1, d.options.vocab_size()}, options);
  linear_into<T>(logits.data_ptr<T>(), x, B, d.dense->weight, d.dense->bias);
  return logits;
}

}  // namespace

std::string why_not_fused_step(const TransformerDecoderImpl& d, const torch::Tensor& X,
                               const DecoderState& state) {
  if (torch::GradMode::is_enabled()) return "autograd records (the fused step has no backward)";
  if (d.is_training() || fused::draws(d.pos_encoding->dropout)) return "training mode";
  const auto& weight = d.embedding->weight;
  const auto type = weight.scalar_type();
  if (!weight.device().is_cpu() || !X.device().is_cpu()) {
    return fmt::format("tensors on {} (the fused step runs on the CPU)",
                       (weight.device().is_cpu() ? X : weight).device().str());
  }
  if (type != torch::kFloat && type != torch::kDouble) {
    return fmt::format("dtype {} (the fused step runs float and double)", c10::toString(type));
  }
  if (X.size(1) != 1)
    return fmt::format("{} steps in one call (the fused step takes one)", X.size(1));
  if (state.enc_key_padding_mask.defined()) {
    return "state.enc_key_padding_mask (the fused step masks by lengths)";
  }
  const auto& lens = state.enc_valid_lens;
  if (lens.defined() &&
      (lens.dim() != 1 || lens.scalar_type() != torch::kLong || !lens.is_contiguous())) {
    return "state.enc_valid_lens not a contiguous int64 (batch_size) tensor";
  }
  if (d.embedding->options.max_norm().has_value()) return "an embedding with max_norm";
  if (!weight.is_contiguous() || !d.dense->weight.is_contiguous() ||
      !d.dense->bias.is_contiguous()) {
    return "parameters not contiguous";
  }
  const auto* cache = dynamic_cast<const TransformerDecoderCache*>(state.cache.get());
  std::vector<torch::Tensor> parameters;
  for (int64_t i = 0; i < d.options.num_layers(); ++i) {
    const auto blk = d.block(i);
    parameters.clear();
    fused::append_parameters(*blk->attention1, parameters);
    fused::append_parameters(*blk->attention2, parameters);
    for (const auto* a : {&blk->addnorm1, &blk->addnorm2, &blk->addnorm3}) {
      fused::append_parameters(**a, parameters);
    }
    fused::append_parameters(*blk->ffn, parameters);
    auto why =
        fused::why_not_modules(blk->options,
                               {blk.get(), blk->addnorm1->dropout.get(),
                                blk->addnorm2->dropout.get(), blk->addnorm3->dropout.get()},
                               {blk->attention1.get(), blk->attention2.get()}, parameters, type, i);
    if (!why.empty()) return why;
    const auto slot = static_cast<size_t>(i);
    const auto& past = state.key_values[slot];
    const bool served = cache != nullptr && cache->blocks.size() > slot && cache->blocks[slot] &&
                        cache->blocks[slot]->serves(past);
    if (past.defined() && !served) {
      return fmt::format(
          "state.key_values[{}] is not the cache's (a state advanced twice, or set "
          "by the caller): the blocks project it again",
          i);
    }
  }
  return {};
}

torch::Tensor fused_step(TransformerDecoderImpl& decoder, const torch::Tensor& X,
                         const DecoderState& state, DecoderState& next) {
  if (logging_paths()) log_path(kDecoderFn, AttentionBackend::kAuto, "fused_step", {});
  if (decoder.embedding->weight.scalar_type() == torch::kDouble) {
    return fused_step_typed<double>(decoder, X, state, next);
  }
  return fused_step_typed<float>(decoder, X, state, next);
}

}  // namespace d2l::detail
