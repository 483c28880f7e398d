// Recording and reading attention weights under striped locks: Note
// [Recording attention weights] in attention_weights.h.

#include "attention_weights.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <utility>

namespace d2l::detail {
namespace {

// Modules in different threads rarely share a stripe, and a store or a load
// holds its lock for a reference-count swap or increment.
std::mutex& lock_for(const torch::Tensor& slot) {
  static std::array<std::mutex, 64> locks;
  // Tensors are 8-byte aligned and modules far apart: drop the low bits.
  const auto stripe = (reinterpret_cast<std::uintptr_t>(&slot) >> 4) % locks.size();
  return locks[stripe];
}

// A tensor of its own (same data and version counter, outside the autograd
// graph) rather than `weights` itself. The graph may hold `weights` (saved for
// a bmm's backward), and a recorded tensor that kept the graph would make
// whichever thread drops it last free another call's whole graph; libtorch,
// uninstrumented, would then release tensors whose last use ThreadSanitizer
// saw in the other thread. The copy's reference count is touched only by
// record_weights, load_weights and their callers, so every release is seen.
torch::Tensor own_tensor(const torch::Tensor& weights) {
  return weights.defined() ? weights.tensor_data() : weights;
}

}  // namespace

namespace {
thread_local bool weights_unread = false;
}  // namespace

bool records_weights(bool option) { return option && !weights_unread; }

WeightsUnread::WeightsUnread() : previous_(std::exchange(weights_unread, true)) {}

WeightsUnread::~WeightsUnread() { weights_unread = previous_; }

torch::Tensor dropout_weights(const torch::Tensor& weights, double p, bool training) {
  return training && p > 0 ? torch::dropout(weights, p, training) : weights;
}

void record_weights(torch::Tensor& slot, torch::Tensor weights) {
  auto own = own_tensor(weights);
  weights.reset();
  torch::Tensor previous;
  {
    std::lock_guard<std::mutex> lock(lock_for(slot));
    previous = std::exchange(slot, std::move(own));
  }
  // The previous weights are released outside the lock.
}

torch::Tensor load_weights(const torch::Tensor& slot) {
  std::lock_guard<std::mutex> lock(lock_for(slot));
  return slot;
}

torch::Tensor dropout_noise(at::IntArrayRef sizes, double p, const torch::TensorOptions& options) {
  if (p >= 1) return torch::zeros(sizes, options);
  auto noise = torch::empty(sizes, options);
  noise.bernoulli_(1 - p);
  noise.div_(1 - p);
  return noise;
}

}  // namespace d2l::detail
