#pragma once

// The d2l 1.0 fixtures (tests/fixtures/generate_fixtures_v1.py): a case's
// golden file and its torch.save'd state dict, loaded strictly into our
// module, and the comparisons of outputs and gradients with the book's.

#include <d2l/state_dict.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "fixture.h"
#include "golden_compare.h"
#include "state_dict_helpers.h"

namespace d2l::testing::v1 {

/// One case of generate_fixtures_v1.py in one dtype.
struct Case {
  std::string name;   // "v1_transformer_eval"
  std::string dtype;  // "float32" or "float64"
  Fixture f;

  Case(std::string name_, std::string dtype_)
      : name(std::move(name_)), dtype(std::move(dtype_)), f(load_fixture(name + "_" + dtype)) {}

  torch::Dtype torch_dtype() const { return golden::dtype_of(dtype); }
  std::string pt() const { return fixture_path(name + "_" + dtype + ".pt"); }
  torch::Tensor operator[](const std::string& tensor) const { return f.tensor(tensor); }

  /// Moves `module` to this dtype (while lazy: PyTorch's `to` before
  /// materialising) and loads the case's state dict, strict.
  void load_into(torch::nn::Module& module) const {
    module.to(torch_dtype());
    d2l::load_state_dict(module, pt());
  }

  /// `actual` against the golden tensor `tensor`, with the dtype's
  /// tolerance scaled by `slack` (deep stacks accumulate float32 rounding).
  ::testing::AssertionResult close(const torch::Tensor& actual, const std::string& tensor,
                                   double slack = 1) const {
    auto tol = golden::tolerance_for(dtype);
    tol.rtol *= slack;
    tol.atol *= slack;
    return golden::close_to(actual, f.tensor(tensor), tol, name + "_" + dtype + ": " + tensor,
                            "v1 " + dtype);
  }

  /// Every parameter's gradient against grad.<key>.
  void expect_parameter_grads(const torch::nn::Module& module, double slack = 1) const {
    for (const auto& p : module.named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key();
      EXPECT_TRUE(close(p.value().grad(), "grad." + p.key(), slack));
    }
  }
};

/// Both dtypes of a case.
inline std::vector<Case> both_dtypes(const std::string& name) {
  return {Case(name, "float32"), Case(name, "float64")};
}

/// The keys of a torch.save'd state dict, in file order.
inline std::vector<std::string> file_keys(const std::string& path) {
  std::vector<std::string> keys;
  for (const auto& entry : d2l::read_state_dict(path)) keys.push_back(entry.first);
  return keys;
}

/// named_parameters() keys, in order (Python's state_dict order where the
/// module registers as the book's).
inline std::vector<std::string> parameter_keys(const torch::nn::Module& module) {
  std::vector<std::string> keys;
  for (const auto& p : module.named_parameters()) keys.push_back(p.key());
  return keys;
}

inline bool writing_state_fixtures() { return std::getenv("D2L_WRITE_STATE_FIXTURES") != nullptr; }

/// `bytes` must be the committed file `name` (which Python's torch.load read:
/// generate_fixtures_v1.py --verify-cpp); with D2L_WRITE_STATE_FIXTURES set,
/// rewrites it instead.
inline void expect_committed_bytes(const std::string& name, const std::string& bytes) {
  if (writing_state_fixtures()) {
    std::ofstream(fixture_path(name), std::ios::binary) << bytes;
    return;
  }
  EXPECT_TRUE(bytes == read_bytes(fixture_path(name))) << name << " is no longer what we write";
}

}  // namespace d2l::testing::v1
