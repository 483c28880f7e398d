#include "attention_weights.h"

#include <array>
#include <cstdint>
#include <mutex>
#include <utility>

namespace d2l::detail {

torch::Tensor dropout_weights(const torch::Tensor& weights, double p, bool training) {
  return training && p > 0 ? torch::dropout(weights, p, training) : weights;
}

void record_weights(torch::Tensor& slot, torch::Tensor weights) {
  // Note [Recording attention weights]. Modules in different threads rarely
  // share a stripe, and a store holds its lock for a reference-count swap.
  static std::array<std::mutex, 64> locks;
  // Tensors are 8-byte aligned and modules far apart: drop the low bits.
  const auto stripe = (reinterpret_cast<std::uintptr_t>(&slot) >> 4) % locks.size();
  torch::Tensor previous;
  {
    std::lock_guard<std::mutex> lock(locks[stripe]);
    previous = std::exchange(slot, std::move(weights));
  }
  // The previous weights are released outside the lock.
}

}  // namespace d2l::detail
