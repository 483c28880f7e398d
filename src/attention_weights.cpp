// Recording and reading attention weights under striped locks: Note
// [Recording attention weights] in attention_weights.h.

#include "attention_weights.h"

#include <torch/csrc/autograd/variable.h>

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

// A tensor of its own (same data, same version counter, same place in the
// autograd graph) rather than `weights` itself, which the graph may hold
// (saved for a bmm's backward) and release from inside uninstrumented
// libtorch in whichever thread frees the graph. The copy's reference count is
// touched only by record_weights, load_weights and their callers, so
// ThreadSanitizer sees every release of the recorded tensor.
torch::Tensor own_tensor(const torch::Tensor& weights) {
  if (!weights.defined()) return weights;
  auto own = weights.tensor_data();
  if (weights.grad_fn()) {
    torch::autograd::impl::set_gradient_edge(own, torch::autograd::impl::gradient_edge(weights));
  }
  return own;
}

}  // namespace

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

}  // namespace d2l::detail
