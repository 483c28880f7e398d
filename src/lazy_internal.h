#pragma once

// What the modules holding lazy layers (include/d2l/lazy.h) use to keep a
// refused call from changing them.

#include <d2l/lazy.h>
#include <torch/nn/module.h>

#include <vector>

namespace d2l::detail {

/// Undoes, when a call is refused, what it did to the lazy layers of a
/// module's tree: made on entry to a forward, it notes the layers still
/// waiting for their width; destroyed by an exception, it empties again
/// those that took one during the call and puts back the CPU generator's
/// state, which drawing their parameters advanced. So a refused first call
/// fixes no width (the next valid call takes its own) and draws nothing.
/// Without lazy layers waiting, it costs one walk of the tree.
class LazyCallGuard {
 public:
  explicit LazyCallGuard(torch::nn::Module& module);
  ~LazyCallGuard();
  LazyCallGuard(const LazyCallGuard&) = delete;
  LazyCallGuard& operator=(const LazyCallGuard&) = delete;

 private:
  int uncaught_;
  std::vector<LazyModule*> waiting_;
  at::Tensor rng_state_;
};

}  // namespace d2l::detail
