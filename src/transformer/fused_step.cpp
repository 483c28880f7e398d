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
#include "parallel.h"
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
// packed or few-rows kernels on the calling thread for small products, else
// split over threads), the new keys and values written into the block's
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

// Copies rows (R, h) into row `at` of each of R rows of `capacity` rows of
// h (a cache's buffer).
template <typename T>
void write_rows(const T* rows, int64_t R, int64_t h, T* buffer, int64_t capacity, int64_t at) {
  for (int64_t r = 0; r < R; ++r) std::copy_n(rows + r * h, h, buffer + (r * capacity + at) * h);
}

// The weights of a block's two attentions.
template <typename T>
struct HeadWeightsPair {
  fused::HeadWeights<T> self, cross;
};

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

// Whether the step splits its rows over ATen's threads, each thread taking
// some rows through every block: where the blocks' products are all small
// (each on the calling thread anyway, linear_into) and there are rows for
// every thread. Larger products go to linear_into whole, which splits them.
bool splits_rows(int64_t B, int64_t h, int64_t f) {
  const int64_t threads = at::get_num_threads();
  return threads > 1 && !at::in_parallel_region() && B >= 2 * threads &&
         B * h * std::max(h, f) <= (int64_t{1} << 20);
}

template <typename T>
torch::Tensor fused_step_typed(TransformerDecoderImpl& d, const torch::Tensor& X,
                               const DecoderState& state, DecoderState& next) {
  const auto& bo = d.options.block();
  const int64_t B = X.size(0), h = bo.num_hiddens(), f = bo.ffn_num_hiddens();
  const int64_t heads = bo.num_heads(), layers = d.options.num_layers();
  const auto options = d.embedding->weight.options();

  // What every block reads and writes, set up before any row is computed:
  // the caches with room for the step (the encoder's keys and values
  // projected at a decoding's first step), and where the weights go.
  auto* old = dynamic_cast<const TransformerDecoderCache*>(state.cache.get());
  auto cache = old ? std::make_shared<TransformerDecoderCache>(*old)
                   : std::make_shared<TransformerDecoderCache>();
  cache->blocks.resize(static_cast<size_t>(layers));
  const auto& enc = state.enc_outputs;
  const int64_t* enc_lens =
      state.enc_valid_lens.defined() ? state.enc_valid_lens.data_ptr<int64_t>() : nullptr;
  std::vector<DecoderBlock> blocks;
  std::vector<HeadWeightsPair<T>> weights;
  weights.reserve(static_cast<size_t>(layers));
  std::vector<int64_t> lengths;  // each block's steps before this one
  for (int64_t i = 0; i < layers; ++i) {
    blocks.push_back(d.block(i));
    auto& blk = blocks.back();
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
    lengths.push_back(length);
    block->reserve_inputs(B, length + 1, h, options);
    reserve_keys_values(block->self_attention, m1, B, length + 1);
    // Projected here at a decoding's first step; again if its buffers hold
    // more than its keys (the kernel reads every key of a row without lengths).
    const auto& cross = block->cross_attention;
    if (!block->cross_source.is_same(enc) || cross.empty() ||
        Access::keys(cross).size(1) != cross.size()) {
      project_memory<T>(m2, enc, block->cross_attention);
      block->cross_source = enc;
    }
    check_cache_source(kDecoderFn, m2, block->cross_attention);
    weights.push_back(
        {fused::HeadWeights<T>(m1, B, 1, Access::keys(block->self_attention).size(1), options),
         fused::HeadWeights<T>(m2, B, 1, block->cross_attention.size(), options)});
  }
  // Each block's keys after this step, per row.
  std::vector<std::vector<int64_t>> held;
  for (const auto length : lengths) held.emplace_back(static_cast<size_t>(B), length + 1);

  // The workspace: the rows entering a block (x), after its self-attention
  // (y) and its encoder-decoder attention (z), the queries, the heads
  // joined, a sublayer's output, the FFN's hidden units.
  std::vector<T> workspace(static_cast<size_t>(B * (6 * h + f)));
  T* const x0 = workspace.data();
  const auto tokens = (X.scalar_type() == torch::kLong ? X : X.to(torch::kLong)).contiguous();
  const int64_t* ids = tokens.data_ptr<int64_t>();

  // Rows [r0, r1) through every block, on their own parts of everything.
  const auto rows = [&](int64_t r0, int64_t r1) {
    const int64_t R = r1 - r0;
    T* x = x0 + r0 * h;
    T* y = x0 + B * h + r0 * h;
    T* z = x0 + 2 * B * h + r0 * h;
    T* q = x0 + 3 * B * h + r0 * h;
    T* joined = x0 + 4 * B * h + r0 * h;
    T* t = x0 + 5 * B * h + r0 * h;
    T* hidden = x0 + 6 * B * h + r0 * f;
    // embedding(X) * sqrt(num_hiddens) + P[0]: every call adds positions
    // from 0 to its own tokens, as the book's.
    fused::embed(d.options, d.embedding, d.pos_encoding, ids + r0, R, 1, x);
    for (int64_t i = 0; i < layers; ++i) {
      auto& blk = blocks[static_cast<size_t>(i)];
      auto& m1 = *blk->attention1;
      auto& m2 = *blk->attention2;
      auto& block = *cache->blocks[static_cast<size_t>(i)];
      auto& self = block.self_attention;
      const int64_t length = lengths[static_cast<size_t>(i)];
      const int64_t inputs_capacity = block.inputs.size(1);
      write_rows(x, R, h, block.inputs.data_ptr<T>() + r0 * inputs_capacity * h, inputs_capacity,
                 length);
      const int64_t capacity = Access::keys(self).size(1);
      T* keys = Access::keys(self).data_ptr<T>() + r0 * capacity * h;
      T* values = Access::values(self).data_ptr<T>() + r0 * capacity * h;
      // The step's key and value rows, straight into the cache.
      linear_into<T>(t, x, R, m1.W_k->weight, m1.W_k->bias);
      write_rows(t, R, h, keys, capacity, length);
      linear_into<T>(t, x, R, m1.W_v->weight, m1.W_v->bias);
      write_rows(t, R, h, values, capacity, length);
      linear_into<T>(q, x, R, m1.W_q->weight, m1.W_q->bias);
      fused::heads(heads, q, keys, values, held[static_cast<size_t>(i)].data() + r0, R, 1, capacity,
                   h, weights[static_cast<size_t>(i)].self.data + r0 * heads * capacity, joined);
      linear_into<T>(t, joined, R, m1.W_o->weight, m1.W_o->bias);
      fused::add_layer_norm(blk->addnorm1, t, x, R, h, y);

      const auto& cross = block.cross_attention;
      const int64_t m = cross.size();
      linear_into<T>(q, y, R, m2.W_q->weight, m2.W_q->bias);
      fused::heads(heads, q, Access::keys(cross).data_ptr<T>() + r0 * m * h,
                   Access::values(cross).data_ptr<T>() + r0 * m * h,
                   enc_lens != nullptr ? enc_lens + r0 : nullptr, R, 1, m, h,
                   weights[static_cast<size_t>(i)].cross.data + r0 * heads * m, joined);
      linear_into<T>(t, joined, R, m2.W_o->weight, m2.W_o->bias);
      fused::add_layer_norm(blk->addnorm2, t, y, R, h, z);

      const auto& ffn = blk->ffn;
      linear_into<T>(hidden, z, R, ffn->dense1->weight, ffn->dense1->bias);
      fused::relu(hidden, R * f);
      linear_into<T>(t, hidden, R, ffn->dense2->weight, ffn->dense2->bias);
      fused::add_layer_norm(blk->addnorm3, t, z, R, h, x);
    }
  };
  if (splits_rows(B, h, f)) {
    const int64_t threads = at::get_num_threads();
    at::parallel_for(0, B, (B + threads - 1) / threads, rows);
  } else {
    rows(0, B);
  }

  for (int64_t i = 0; i < layers; ++i) {
    auto& block = *cache->blocks[static_cast<size_t>(i)];
    const int64_t length = lengths[static_cast<size_t>(i)] + 1;
    block.length = length;
    Access::length(block.self_attention) = length;
    next.key_values[static_cast<size_t>(i)] = block.filled_inputs();
    auto& blk = blocks[static_cast<size_t>(i)];
    weights[static_cast<size_t>(i)].self.record(*blk->attention1, length);
    weights[static_cast<size_t>(i)].cross.record(*blk->attention2, block.cross_attention.size());
  }
  next.cache = std::move(cache);
  auto logits = torch::empty({B, 1, d.options.vocab_size()}, options);
  linear_into<T>(logits.data_ptr<T>(), x0, B, d.dense->weight, d.dense->bias);
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
