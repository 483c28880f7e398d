#pragma once

// Shared by test_nn.cpp and test_nn_layers.cpp: copying parameters between a
// d2l::nn module and its torch::nn twin key for key, the gradients of
// sum(output * G), and the masks of the Python fixtures
// (tests/fixtures/generate_fixtures_nn.py).

#include <torch/torch.h>

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fixture.h"
#include "test_utils.h"

namespace d2l::testing::nn {

/// Copies every parameter of `from` into the parameter of `to` with the same
/// key; both must have exactly the same keys and shapes.
inline void copy_parameters(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  const auto source = from.named_parameters();
  auto target = to.named_parameters();
  EXPECT_EQ(source.keys(), target.keys());
  for (const auto& item : source) {
    auto* t = target.find(item.key());
    if (t == nullptr) continue;
    t->copy_(item.value());
  }
}

/// Random parameters, the same for every module with these keys and shapes.
inline void randomize(torch::nn::Module& module, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : module.parameters()) p.copy_(at::normal(0, 0.5, p.sizes(), gen));
}

/// Gradients of every parameter (by key) and of `inputs` after `output`'s
/// backward of sum(output * G); clears them first.
struct Grads {
  std::map<std::string, torch::Tensor> params;
  std::vector<torch::Tensor> inputs;
};

inline Grads backward(torch::nn::Module& module, const torch::Tensor& output,
                      const torch::Tensor& G, const std::vector<torch::Tensor>& inputs) {
  for (auto& p : module.parameters()) p.mutable_grad() = torch::Tensor();
  for (auto t : inputs) t.mutable_grad() = torch::Tensor();
  (output * G).sum().backward();
  Grads g;
  for (const auto& p : module.named_parameters()) g.params[p.key()] = p.value().grad();
  for (const auto& t : inputs) g.inputs.push_back(t.grad());
  return g;
}

/// Largest max_rel_error over every gradient of `a` against `b`; an
/// undefined gradient counts as zeros.
inline double max_grad_error(const Grads& a, const Grads& b) {
  double worst = 0;
  const auto err = [](const torch::Tensor& x, const torch::Tensor& y) {
    if (!x.defined() && !y.defined()) return 0.0;
    if (!x.defined()) return max_rel_error(torch::zeros_like(y), y);
    if (!y.defined()) return max_rel_error(x, torch::zeros_like(x));
    return max_rel_error(x, y);
  };
  EXPECT_EQ(a.params.size(), b.params.size());
  for (const auto& [key, g] : a.params) {
    const auto it = b.params.find(key);
    if (it == b.params.end()) {
      ADD_FAILURE() << "no gradient " << key;
      continue;
    }
    worst = std::max(worst, err(g, it->second));
  }
  EXPECT_EQ(a.inputs.size(), b.inputs.size());
  for (size_t i = 0; i < a.inputs.size() && i < b.inputs.size(); ++i) {
    worst = std::max(worst, err(a.inputs[i], b.inputs[i]));
  }
  return worst;
}

/// The fixture's mask `name`: `<name>.bool` as torch::kBool, or
/// `<name>.float` with -inf where `<name>.neginf`; undefined when absent.
inline torch::Tensor fixture_mask(const Fixture& f, const std::string& name) {
  const auto has = [&](const std::string& n) { return f.has_tensor(n); };
  if (has(name + ".bool")) return f.tensor(name + ".bool").to(torch::kBool);
  if (!has(name + ".float")) return {};
  return f.tensor(name + ".float")
      .masked_fill(f.tensor(name + ".neginf").to(torch::kBool),
                   -std::numeric_limits<double>::infinity());
}

/// Loads every state_dict key of the fixture into `module`'s parameter of
/// that key; the module's keys must be exactly the fixture's parameters.
inline void load_fixture_parameters(const Fixture& f, torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.named_parameters()) p.value().copy_(f.tensor(p.key()));
}

/// Gradients from a fixture, in the order of `module`'s keys and `inputs`.
inline Grads fixture_grads(const Fixture& f, const torch::nn::Module& module,
                           const std::vector<std::string>& inputs) {
  Grads g;
  for (const auto& p : module.named_parameters()) g.params[p.key()] = f.tensor("grad." + p.key());
  for (const auto& name : inputs) g.inputs.push_back(f.tensor("grad." + name));
  return g;
}

}  // namespace d2l::testing::nn
