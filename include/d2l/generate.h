#pragma once

// Generation with a trained encoder-decoder: batched greedy decoding, beam
// search and sampling over every decoder of the library (both editions'
// Transformers and GRU decoders, with and without Bahdanau attention) and
// over a user's Encoder and Decoder. docs/generation.md has the algorithm,
// what a step costs, and where it differs from the book's text.

#include <d2l/encoder_decoder.h>
#include <d2l/v1/encoder_decoder.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace d2l {

/// Called by greedy decoding and sampling after every step, while the
/// decoder still holds that step's state: the step (from 0), the source's
/// index in the call, and the token chosen for it.
using GenerationCallback = std::function<void(int64_t step, int64_t source, int64_t token)>;

/// What `generate` does, LibTorch style: `GenerationOptions().start_id(1)
/// .end_id(2).pad_id(0).beam_size(4)`. start_id, end_id and pad_id have no
/// default: a call without them is refused.
struct GenerationOptions {
  /// Tokens generated at most per hypothesis, the final `<eos>` included
  /// (the book's `num_steps`).
  TORCH_ARG(int64_t, max_length) = 10;
  /// `<eos>` is not chosen before this many tokens.
  TORCH_ARG(int64_t, min_length) = 0;
  /// Hypotheses kept per source at every step; 1 with `sampling_topk` 1 is
  /// greedy decoding. At most kMaxBeamSize.
  TORCH_ARG(int64_t, beam_size) = 1;
  /// The book's α: a finished hypothesis of L tokens scores log P / L^α. Not
  /// negative (docs/generation.md: what keeps the search exact needs α >= 0).
  TORCH_ARG(double, length_penalty) = 0;
  /// Hypotheses returned per source, best first; at most beam_size.
  TORCH_ARG(int64_t, num_hypotheses) = 1;
  /// Sampling: from the `sampling_topk` most likely tokens (0: all of them;
  /// 1: none, the most likely token, as greedy decoding), within the smallest
  /// set whose probabilities reach `sampling_topp`, of the distribution
  /// softmax(logits / temperature). Needs beam_size 1.
  TORCH_ARG(int64_t, sampling_topk) = 1;
  TORCH_ARG(double, sampling_topp) = 1;
  TORCH_ARG(double, temperature) = 1;
  /// The sampler's seed: the same seed, model and sources draw the same
  /// tokens.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Per-token log-probabilities (GenerationHypothesis::log_probs).
  TORCH_ARG(bool, return_log_probs) = false;
  /// Per-token cross-attention weights (GenerationHypothesis::attention);
  /// needs a d2l::AttentionDecoder, whose recorded weights are its last
  /// call's: not with other threads decoding on the same model.
  TORCH_ARG(bool, return_attention) = false;
  /// The target's `<bos>` (the first step's input) and `<eos>`, and the
  /// source's `<pad>`.
  TORCH_ARG(int64_t, start_id) = -1;
  TORCH_ARG(int64_t, end_id) = -1;
  TORCH_ARG(int64_t, pad_id) = -1;
  /// Sources are padded with pad_id to this many steps, longer ones cut to
  /// it (the book pads to num_steps); 0: to the longest source of the call.
  /// The book's GRU encoder reads the padding, so a source's result
  /// depends on its padding: give a length for results that do not depend
  /// on the other sources of a call.
  TORCH_ARG(int64_t, source_length) = 0;
  /// Sources decoded together at most: a call with more sorts them by
  /// length, longest first, and decodes them in batches of this many, so
  /// that a batch holds sources of similar lengths and memory holds one
  /// batch's states; results still come back in the sources' order. 0: all
  /// of them in one batch, in their order.
  TORCH_ARG(int64_t, max_batch_size) = 0;
  /// Greedy decoding and sampling only.
  TORCH_ARG(GenerationCallback, callback) = nullptr;
};

/// The largest beam_size accepted.
inline constexpr int64_t kMaxBeamSize = 256;

struct GenerationHypothesis {
  /// The tokens generated, without the final `<eos>`.
  std::vector<int64_t> tokens;
  /// log P(tokens, <eos> where it ended with one) / L^α, with L the number
  /// of tokens generated (the `<eos>` included) and α the length_penalty.
  double score = 0;
  /// Whether it ended with `<eos>` (else it reached max_length).
  bool finished = false;
  /// With return_log_probs: each generated token's log-probability, the
  /// final `<eos>`'s included.
  std::vector<double> log_probs;
  /// With return_attention: (L, ...) where row t is the decoder's
  /// attention_weights() of step t for this hypothesis (its last step's row):
  /// (L, num_enc_steps) for Seq2SeqAttentionDecoder, (L, num_layers *
  /// num_heads, num_enc_steps) for TransformerDecoder.
  torch::Tensor attention;
};

struct GenerationResult {
  /// num_hypotheses of them, best first.
  std::vector<GenerationHypothesis> hypotheses;
};

/// Decodes every source (token ids, each non-empty, the `<eos>` the book
/// appends included) with `encoder` and `decoder`, in evaluation mode under
/// no-grad: modules in training mode are switched to evaluation for the call
/// and back after it (a model shared by threads must be in evaluation mode
/// already; generate then changes nothing of it). One result per source, in
/// order (none for no sources). Without return_attention the modules record no attention weights
/// during the call (what they recorded before stays): nothing reads them.
/// Bad options or sources are a c10::Error naming them, before any
/// computation.
std::vector<GenerationResult> generate(Encoder& encoder, Decoder& decoder,
                                       const std::vector<std::vector<int64_t>>& sources,
                                       const GenerationOptions& options);
/// The same with the encoder and decoder of `net` (d2l 0.17's or 1.0's).
std::vector<GenerationResult> generate(EncoderDecoderImpl& net,
                                       const std::vector<std::vector<int64_t>>& sources,
                                       const GenerationOptions& options);
std::vector<GenerationResult> generate(v1::EncoderDecoderImpl& net,
                                       const std::vector<std::vector<int64_t>>& sources,
                                       const GenerationOptions& options);

/// The state of the batch rows `index` of `state` ((R) int64 on the
/// state's device; rows may repeat): each batch-dimension tensor selected,
/// and the decoder's cache selected through DecoderCache::select_rows
/// (else dropped, the decoder rebuilding it from the book's fields). With
/// `same_sources`, every row of `index` comes from a row of the same
/// source as the row it replaces (beam search reordering its hypotheses):
/// what depends on the source only (enc_outputs, their lengths and masks,
/// projections of them) is kept as it is, not copied.
DecoderState select_rows(const DecoderState& state, const torch::Tensor& index,
                         bool same_sources = false);

}  // namespace d2l
