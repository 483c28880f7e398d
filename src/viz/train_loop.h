#pragma once

// The one training loop behind d2l::train_seq2seq and
// d2l::distributed::train_seq2seq: what differs between one process and a
// group is behind Seq2SeqSync.

#include <d2l/train.h>

namespace d2l::detail {

/// What a data-parallel loop adds to the single-process one.
class Seq2SeqSync {
 public:
  virtual ~Seq2SeqSync() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  /// After initialisation, before the optimiser: make every rank's weights
  /// rank 0's.
  virtual void after_init(torch::nn::Module& net) = 0;
  /// Around every backward pass (called on ranks with no rows as well).
  virtual void before_backward() = 0;
  virtual void after_backward() = 0;
  /// Sums `values` (CPU, float64) across the ranks in place.
  virtual void sum(torch::Tensor& values) = 0;
};

/// `train_seq2seq`; `sync` null: one process. `fn` names the caller in errors.
TrainSeq2SeqResult train_seq2seq_loop(EncoderDecoderImpl& net, ArrayLoader& data_iter, double lr,
                                      int64_t num_epochs, const Vocab& tgt_vocab,
                                      torch::Device device, const TrainSeq2SeqOptions& options,
                                      Seq2SeqSync* sync, const char* fn);

}  // namespace d2l::detail
