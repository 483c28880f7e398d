#pragma once

// The 0.17 Transformer's fused passes (Note [The fused decoder step]): the
// decoder's decoding step (fused_step.cpp), under TransformerDecoder::forward,
// and the encoder (fused_encoder.cpp), under TransformerEncoder::forward.

#include <d2l/transformer.h>
#include <torch/types.h>

#include <string>

namespace d2l::detail {

/// Why TransformerDecoder::forward(X, state) does not run the fused step,
/// as "<reason>"; empty when it does. Builds no string when it does.
std::string why_not_fused_step(const TransformerDecoderImpl& decoder, const torch::Tensor& X,
                               const DecoderState& state);

/// One decoding step of every row of X (B, 1) token ids from `state`, where
/// why_not_fused_step is empty: the logits (B, 1, vocab_size), and in `next`
/// the state after the step, as the blocks give them (the same caches, the
/// same key_values, the same attention weights recorded).
torch::Tensor fused_step(TransformerDecoderImpl& decoder, const torch::Tensor& X,
                         const DecoderState& state, DecoderState& next);

/// Why TransformerEncoder::forward_masked(X, mask) does not run the fused
/// pass; empty when it does.
std::string why_not_fused_encoder(const TransformerEncoderImpl& encoder, const torch::Tensor& X,
                                  const AttentionMask& mask);

/// The encoder's outputs (B, n, num_hiddens) for X (B, n) token ids and
/// `mask` (valid_lens or none) in one pass, where why_not_fused_encoder is
/// empty; the blocks' attention weights recorded as the blocks record them.
torch::Tensor fused_encoder(TransformerEncoderImpl& encoder, const torch::Tensor& X,
                            const AttentionMask& mask);

}  // namespace d2l::detail
