#pragma once

// What every attention op and module does with its weights after the
// softmax: dropout, and recording them in the module, and reading them back.
//
// Note [Recording attention weights]: sharing a module between threads
// This is the one statement of the thread-safety contract; module doc
// comments and the README ("Threads") point here.
//
// * Every d2l module may be shared by threads that call its forward (and a
//   decoder's init_state, and EncoderDecoder::forward) at once, with autograd
//   on or under c10::InferenceMode. In eval mode (the tested case) every call
//   returns what it would return alone, bit for bit. Training mode adds only
//   dropout, whose generator LibTorch locks; it is not tested under threads.
// * Modules that record the weights of their last call (AdditiveAttention,
//   DotProductAttention, MultiHeadAttention in `attention->attention_weights`,
//   NWKernelRegression, Seq2SeqAttentionDecoder, and so EncoderDecoder through
//   its decoder) store them with record_weights: under a lock chosen by the
//   member's address from a fixed set, so that no module holds a mutex of its
//   own (nothing to copy in clone(), nothing in the public headers) and a
//   module can record into a submodule's member. Afterwards the member holds
//   the whole weights of one of the calls, as a tensor of its own sharing
//   their data but outside the autograd graph (a shared module must not keep
//   one caller's graph alive, nor free it from another thread); the
//   functional forms return the weights with their graph.
// * While forwards run, read the weights only through an accessor that loads
//   them under the same lock: NWKernelRegression::last_attention_weights(),
//   MultiHeadAttention::last_attention_weights(),
//   Seq2SeqAttentionDecoder::attention_weights(), or load_weights below. The
//   public members named as in the book (`attention_weights`) may be read or
//   assigned directly only when no forward runs.
// * Seq2SeqEncoder and Seq2SeqDecoder keep no state between calls; the
//   decoders' DecoderState is a value owned by the caller.
// * record_attention_weights(false) (AdditiveAttention, DotProductAttention,
//   MultiHeadAttention) stores nothing and takes no lock; nor does any call
//   on a thread that holds a WeightsUnread guard (d2l::generate without
//   return_attention).
// * Not covered: anything that changes the module (to(), train()/eval(),
//   reset(), loading, assigning parameters, an optimizer step) or copies it
//   (clone(), which copies the recorded member without the lock) while a
//   forward runs on it. Clone the module first, then share or hand out copies.

#include <torch/types.h>

namespace d2l::detail {

/// Dropout of attention weights; no dispatcher call when it is the identity.
torch::Tensor dropout_weights(const torch::Tensor& weights, double p, bool training);

/// The multipliers torch::dropout draws on the CPU for weights of `sizes`
/// (ATen's _dropout: bernoulli_(1 - p), divided by 1 - p; nothing drawn at
/// p = 1), for the kernels that apply dropout themselves: the same random
/// stream as the composite path.
torch::Tensor dropout_noise(at::IntArrayRef sizes, double p, const torch::TensorOptions& options);

/// `slot = weights`, safe against concurrent record_weights and load_weights
/// on the same slot (Note [Recording attention weights]).
void record_weights(torch::Tensor& slot, torch::Tensor weights);

/// A copy of `slot` (the same tensor, not its data), read under the lock that
/// record_weights takes: safe while other threads record into it.
torch::Tensor load_weights(const torch::Tensor& slot);

/// Whether a module whose record_attention_weights option is `option`
/// records the weights of a call on this thread: not while a
/// WeightsUnread guard lives on it.
bool records_weights(bool option);

/// While alive, the modules' calls on this thread record no attention
/// weights, as if record_attention_weights were off (their recorded
/// weights stay as they were): d2l::generate holds one when
/// return_attention is off, since nothing reads them then, and recording
/// costs a step allocations and a lock.
class WeightsUnread {
 public:
  WeightsUnread();
  ~WeightsUnread();
  WeightsUnread(const WeightsUnread&) = delete;
  WeightsUnread& operator=(const WeightsUnread&) = delete;

 private:
  bool previous_;
};

}  // namespace d2l::detail
