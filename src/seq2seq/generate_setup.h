#pragma once

// d2l::generate's set-up (generate_setup.cpp): its options' and inputs'
// checks before any computation, and evaluation mode for the call.

#include <d2l/generate.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace d2l::detail {

/// Each option in its range and the combinations generate supports; a
/// c10::Error naming `fn`, the option and its value otherwise.
void check_generation_options(const char* fn, const GenerationOptions& options);

/// The sources (not empty, each non-empty, ids inside the encoder's
/// embedding) and the ids of `options` inside the encoder's and decoder's
/// vocabularies, where their `embedding.weight` tells them; a c10::Error
/// naming `fn` and the value otherwise.
void check_generation_inputs(const char* fn, const torch::nn::Module& encoder,
                             const torch::nn::Module& decoder,
                             const std::vector<std::vector<int64_t>>& sources,
                             const GenerationOptions& options);

// Evaluation mode for the call, each module's own mode restored after it.
// Module::train sets a module's children too, so the modes are restored
// parents first (modules() lists a module before its children): each
// module's own call comes after its ancestors'. A model already in
// evaluation mode is not written to at all (threads may share it).
class EvalGuard {
 public:
  explicit EvalGuard(const std::vector<torch::nn::Module*>& roots) {
    bool training = false;
    for (auto* root : roots) {
      for (const auto& m : root->modules(/*include_self=*/true)) {
        modes_.emplace_back(m, m->is_training());
        training = training || m->is_training();
      }
    }
    if (!training) {
      modes_.clear();
      return;
    }
    for (auto* root : roots) root->eval();
  }
  ~EvalGuard() {
    for (const auto& [m, training] : modes_) m->train(training);
  }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  std::vector<std::pair<std::shared_ptr<torch::nn::Module>, bool>> modes_;
};

}  // namespace d2l::detail
