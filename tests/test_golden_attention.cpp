// Golden parity of the attention scorers: AdditiveAttention and
// DotProductAttention (module and functional) against fixtures written by the
// book's own PyTorch code (tests/fixtures/generate_fixtures.py): parameter
// names, outputs, attention weights and every gradient. Adding a case is one
// line in a table below.

#include <torch/torch.h>

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fixture.h"
#include "golden_compare.h"

namespace {

using d2l::testing::Fixture;
using d2l::testing::load_fixture;
using d2l::testing::golden::close_to;
using d2l::testing::golden::dtype_of;
using d2l::testing::golden::kDtypes;
using d2l::testing::golden::param_name;
using d2l::testing::golden::Tolerance;
using d2l::testing::golden::tolerance_for;

// ---------------------------------------------------------------------------
// Fixture tables: one line per case. Each runs once per dtype.
// ---------------------------------------------------------------------------

const std::vector<std::string> kAdditiveCases = {
    "additive_toy",  // the book's toy shapes, keys normal
    "additive_odd",  // B3 n4 m7, query 5, key 6, h 9, value 3, 2-D lens
};
const std::vector<std::string> kDotProductCases = {
    "dot_toy",     // the book's toy, keys normal
    "dot_odd",     // B3 n4 m7 d5 v3, 2-D lens
    "dot_nolens",  // no valid_lens
};

// ---------------------------------------------------------------------------
// Attention modules.
// ---------------------------------------------------------------------------

// Tensor names of a module fixture that are not parameters (see the generator).
const std::set<std::string> kModuleIO = {"queries", "keys",   "values",           "valid_lens",
                                         "G",       "output", "attention_weights"};

// The state_dict keys stored in a module fixture: every tensor that is neither
// an input/output nor a gradient.
std::set<std::string> fixture_parameter_keys(const Fixture& fx) {
  std::set<std::string> keys;
  for (const auto& name : fx.tensor_names()) {
    if (kModuleIO.count(name) == 0 && name.rfind("grad.", 0) != 0) keys.insert(name);
  }
  return keys;
}

// Every tensor in the fixture is one the test reads: nothing goes unchecked.
void expect_only_known_entries(const Fixture& fx, const std::set<std::string>& params) {
  std::set<std::string> known = {
      "queries",           "keys",         "values",    "G",          "output",
      "attention_weights", "grad.queries", "grad.keys", "grad.values"};
  if (fx.has_tensor("valid_lens")) known.insert("valid_lens");
  for (const auto& p : params) {
    known.insert(p);
    known.insert("grad." + p);
  }
  const auto names = fx.tensor_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), known) << fx.path();
}

struct ModuleInputs {
  torch::Tensor queries, keys, values, valid_lens, G;
};

ModuleInputs module_inputs(const Fixture& fx, torch::Dtype dtype) {
  ModuleInputs in;
  in.queries = fx.tensor("queries").clone().requires_grad_(true);
  in.keys = fx.tensor("keys").clone().requires_grad_(true);
  in.values = fx.tensor("values").clone().requires_grad_(true);
  in.valid_lens = fx.has_tensor("valid_lens") ? fx.tensor("valid_lens") : torch::Tensor();
  in.G = fx.tensor("G");
  EXPECT_EQ(in.queries.scalar_type(), dtype);
  return in;
}

void expect_input_grads(const Fixture& fx, const ModuleInputs& in, Tolerance tol,
                        const std::string& who, const std::string& dtype) {
  EXPECT_TRUE(
      close_to(in.queries.grad(), fx.tensor("grad.queries"), tol, who + " grad.queries", dtype));
  EXPECT_TRUE(close_to(in.keys.grad(), fx.tensor("grad.keys"), tol, who + " grad.keys", dtype));
  EXPECT_TRUE(
      close_to(in.values.grad(), fx.tensor("grad.values"), tol, who + " grad.values", dtype));
}

class GoldenAdditiveAttention
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenAdditiveAttention, OutputWeightsAndGradsMatchBook) {
  const auto& [name, dtype] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const Tolerance tol = tolerance_for(dtype);
  const std::string who = "d2l::AdditiveAttention";

  d2l::AdditiveAttention attention(
      static_cast<int64_t>(fx.scalar("key_size")), static_cast<int64_t>(fx.scalar("query_size")),
      static_cast<int64_t>(fx.scalar("num_hiddens")), fx.scalar("dropout"));
  attention->to(dtype_of(dtype));
  attention->eval();
  ASSERT_FALSE(attention->is_training());

  // State_dict key parity: our parameter names are exactly the book's keys.
  const auto params = attention->named_parameters();
  std::set<std::string> ours;
  for (const auto& p : params) ours.insert(p.key());
  const auto theirs = fixture_parameter_keys(fx);
  ASSERT_EQ(ours, theirs) << "named_parameters() keys differ from the book's state_dict keys";
  expect_only_known_entries(fx, theirs);

  {
    torch::NoGradGuard no_grad;
    for (const auto& p : params) {
      const auto value = fx.tensor(p.key());
      ASSERT_EQ(p.value().sizes(), value.sizes()) << p.key();
      ASSERT_EQ(p.value().scalar_type(), value.scalar_type()) << p.key();
      p.value().copy_(value);
    }
  }

  const auto in = module_inputs(fx, dtype_of(dtype));
  const auto out = attention(in.queries, in.keys, in.values, in.valid_lens);
  EXPECT_TRUE(close_to(out, fx.tensor("output"), tol, who + " output", dtype));
  EXPECT_TRUE(close_to(attention->attention_weights, fx.tensor("attention_weights"), tol,
                       who + " attention_weights", dtype));
  (out * in.G).sum().backward();
  expect_input_grads(fx, in, tol, who, dtype);
  for (const auto& p : params) {
    EXPECT_TRUE(close_to(p.value().grad(), fx.tensor("grad." + p.key()), tol,
                         who + " grad." + p.key(), dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenAdditiveAttention,
                         ::testing::Combine(::testing::ValuesIn(kAdditiveCases),
                                            ::testing::ValuesIn(kDtypes)),
                         param_name);

class GoldenDotProductAttention
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenDotProductAttention, ModuleMatchesBook) {
  const auto& [name, dtype] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const Tolerance tol = tolerance_for(dtype);
  const std::string who = "d2l::DotProductAttention";

  d2l::DotProductAttention attention(fx.scalar("dropout"));
  attention->eval();
  ASSERT_FALSE(attention->is_training());
  std::set<std::string> ours;
  for (const auto& p : attention->named_parameters()) ours.insert(p.key());
  const auto theirs = fixture_parameter_keys(fx);
  ASSERT_EQ(ours, theirs) << "named_parameters() keys differ from the book's state_dict keys";
  expect_only_known_entries(fx, theirs);

  const auto in = module_inputs(fx, dtype_of(dtype));
  const auto out = attention(in.queries, in.keys, in.values, in.valid_lens);
  EXPECT_TRUE(close_to(out, fx.tensor("output"), tol, who + " output", dtype));
  EXPECT_TRUE(close_to(attention->attention_weights, fx.tensor("attention_weights"), tol,
                       who + " attention_weights", dtype));
  (out * in.G).sum().backward();
  expect_input_grads(fx, in, tol, who, dtype);
}

TEST_P(GoldenDotProductAttention, FunctionalMatchesBook) {
  const auto& [name, dtype] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const Tolerance tol = tolerance_for(dtype);
  const std::string who = "d2l::functional::dot_product_attention";

  const auto in = module_inputs(fx, dtype_of(dtype));
  const auto [out, weights] =
      d2l::functional::dot_product_attention(in.queries, in.keys, in.values,
                                             d2l::functional::DotProductAttentionFuncOptions()
                                                 .valid_lens(in.valid_lens)
                                                 .dropout(fx.scalar("dropout"))
                                                 .training(false));
  EXPECT_TRUE(close_to(out, fx.tensor("output"), tol, who + " output", dtype));
  EXPECT_TRUE(
      close_to(weights, fx.tensor("attention_weights"), tol, who + " attention_weights", dtype));
  (out * in.G).sum().backward();
  expect_input_grads(fx, in, tol, who, dtype);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenDotProductAttention,
                         ::testing::Combine(::testing::ValuesIn(kDotProductCases),
                                            ::testing::ValuesIn(kDtypes)),
                         param_name);

}  // namespace
