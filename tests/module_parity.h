#pragma once

// Parity of a module with a fixture written by the book's PyTorch code
// (tests/fixtures/generate_fixtures.py): the fixture's parameters loaded by
// state_dict key, outputs and gradients compared in the fixture's dtype.
// Shared by test_nadaraya_watson.cpp and test_multi_head_attention*.cpp.

#include <fmt/format.h>

#include <set>
#include <string>

#include "fixture.h"
#include "test_utils.h"

namespace d2l::testing {

// Parity tolerance: both sides compute in the fixture's dtype, in different orders.
inline double tolerance(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat ? 1e-5 : 1e-12;
}

inline void expect_matches(const torch::Tensor& got, const d2l::testing::Fixture& fixture,
                           const std::string& name) {
  const auto want = fixture.tensor(name);
  ASSERT_EQ(got.sizes(), want.sizes()) << fixture.path() << ": " << name;
  EXPECT_EQ(got.scalar_type(), want.scalar_type()) << fixture.path() << ": " << name;
  const double error = max_rel_error(got, want);
  EXPECT_LT(error, tolerance(want)) << fixture.path() << ": " << name;
  ::testing::Test::RecordProperty(fixture.path() + ":" + name, fmt::format("{:.3g}", error));
}

// Loads the fixture's parameters into `module`, after checking that the
// fixture's parameters are exactly the module's (by state_dict key).
inline void load_parameters(torch::nn::Module& module, const d2l::testing::Fixture& fixture) {
  static const std::set<std::string> reserved = {
      "queries", "keys", "values", "valid_lens", "G", "output", "attention_weights"};
  std::set<std::string> in_fixture;
  for (const auto& name : fixture.tensor_names()) {
    if (reserved.count(name) == 0 && name.rfind("grad.", 0) != 0) in_fixture.insert(name);
  }
  EXPECT_EQ(in_fixture, parameter_name_set(module)) << fixture.path();
  torch::NoGradGuard no_grad;
  for (auto& p : module.named_parameters()) p.value().copy_(fixture.tensor(p.key()));
}

struct Inputs {
  torch::Tensor queries, keys, values;
};

inline Inputs leaf_inputs(const d2l::testing::Fixture& fixture) {
  return {fixture.tensor("queries").requires_grad_(true),
          fixture.tensor("keys").requires_grad_(true),
          fixture.tensor("values").requires_grad_(true)};
}

inline void expect_input_gradients(const Inputs& in, const d2l::testing::Fixture& fixture) {
  expect_matches(in.queries.grad(), fixture, "grad.queries");
  expect_matches(in.keys.grad(), fixture, "grad.keys");
  expect_matches(in.values.grad(), fixture, "grad.values");
}

inline const char* const kParityDtypes[] = {"float32", "float64"};

}  // namespace d2l::testing
