#pragma once

// The Bahdanau decoders' projected keys (both editions' Seq2SeqAttentionDecoder).

#include <d2l/encoder_decoder.h>
#include <torch/types.h>

#include <memory>

#include "weight_signature.h"

namespace d2l::detail {

/// The attention's keys, W_k(enc_outputs): they never change while a
/// sequence is decoded, unless W_k does (Note [Caches keyed on weights]:
/// checked at every step but for its bytes).
struct AttentionKeysCache : DecoderCache {
  torch::Tensor source, projected_keys;
  WeightSignature weights;

  AttentionKeysCache(torch::Tensor source_, torch::Tensor projected_keys_, const torch::Tensor& W_k)
      : source(std::move(source_)),
        projected_keys(std::move(projected_keys_)),
        weights({W_k}, /*bytes=*/false) {}

  /// Whether the keys are W_k's projection of `enc_outputs` (the same
  /// tensor, W_k unchanged).
  bool serves(const torch::Tensor& enc_outputs, const torch::Tensor& W_k) const {
    return source.is_same(enc_outputs) &&
           weights.match({W_k}, /*values=*/false) == WeightSignature::Match::kSame;
  }

  /// The keys of the selected rows (kept with same_sources: a source's rows
  /// have the same keys), for the selected enc_outputs.
  std::shared_ptr<DecoderCache> select_rows(const DecoderState& state, const torch::Tensor& index,
                                            DecoderState& selected,
                                            bool same_sources) const override {
    if (!source.is_same(state.enc_outputs)) return nullptr;
    auto out = std::make_shared<AttentionKeysCache>(*this);
    out->source = selected.enc_outputs;
    if (!same_sources) out->projected_keys = projected_keys.index_select(0, index);
    return out;
  }
};

}  // namespace d2l::detail
