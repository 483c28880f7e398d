// Golden parity: the library against fixtures written by the book's own PyTorch
// code (tests/fixtures/generate_fixtures.py). Every fixture exists in float32
// and float64; adding a case is one line in one of the tables below.

#include <torch/torch.h>

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masking.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "fixture.h"

namespace {

using d2l::testing::Fixture;
using d2l::testing::load_fixture;

// ---------------------------------------------------------------------------
// Fixture tables: one line per case. Each runs once per dtype.
// ---------------------------------------------------------------------------

const std::vector<std::string> kMaskedSoftmaxCases = {
    "masked_softmax_lens1d",      // the book's (2, 2, 4) with [2, 3]
    "masked_softmax_lens2d",      // the book's (2, 2, 4) with [[1, 3], [2, 4]]
    "masked_softmax_lens_above",  // [7, 4] for 4 keys
    "masked_softmax_nolens",      // plain softmax
    "masked_softmax_odd",         // (3, 5, 17), 2-D lengths in 1..17
};
const std::vector<std::string> kSequenceMaskCases = {
    "sequence_mask_value0",
    "sequence_mask_value_minus1",
};
const std::vector<std::string> kAdditiveCases = {
    "additive_toy",  // the book's toy shapes, keys normal
    "additive_odd",  // B3 n4 m7, query 5, key 6, h 9, value 3, 2-D lens
};
const std::vector<std::string> kDotProductCases = {
    "dot_toy",     // the book's toy, keys normal
    "dot_odd",     // B3 n4 m7 d5 v3, 2-D lens
    "dot_nolens",  // no valid_lens
};
const std::vector<std::string> kDtypes = {"float32", "float64"};

// ---------------------------------------------------------------------------
// Comparison.
// ---------------------------------------------------------------------------

struct Tolerance {
  double rtol;
  double atol;
};

Tolerance tolerance_for(const std::string& dtype) {
  if (dtype == "float64") return {1e-10, 1e-12};
  if (dtype == "float32") return {2e-5, 1e-6};
  throw std::runtime_error("no tolerance for dtype " + dtype);
}

torch::Dtype dtype_of(const std::string& dtype) {
  if (dtype == "float64") return torch::kFloat64;
  if (dtype == "float32") return torch::kFloat32;
  throw std::runtime_error("unknown dtype " + dtype);
}

// Largest errors seen per dtype, printed once at the end of the run.
struct ErrorStats {
  int comparisons = 0;
  double max_abs = 0;
  double max_rel = 0;          // |a - e| / |e| over entries with e != 0
  double max_tol_ratio = 0;    // |a - e| / (atol + rtol |e|); <= 1 passes
  std::string worst;           // comparison with the largest tolerance ratio
};
std::map<std::string, ErrorStats>& error_stats() {
  static std::map<std::string, ErrorStats> stats;
  return stats;
}

class ErrorReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [dtype, s] : error_stats()) {
      if (s.max_tol_ratio == 0) {
        std::printf("[golden] %s: %d comparisons, all bit-identical to the fixtures\n",
                    dtype.c_str(), s.comparisons);
        continue;
      }
      std::printf(
          "[golden] %s: %d comparisons, max abs err %.3e, max rel err %.3e, "
          "max err/tolerance %.3e (%s)\n",
          dtype.c_str(), s.comparisons, s.max_abs, s.max_rel, s.max_tol_ratio, s.worst.c_str());
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kErrorReport =
    ::testing::AddGlobalTestEnvironment(new ErrorReport);

std::string shape_str(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// `actual` must match `expected` elementwise: |a - e| <= atol + rtol |e|
// (torch::allclose), same dtype and shape. On failure the message gives the
// largest absolute and relative errors and the worst element.
::testing::AssertionResult close_to(const torch::Tensor& actual, const torch::Tensor& expected,
                                    Tolerance tol, const std::string& what,
                                    const std::string& stats_key = "") {
  if (!actual.defined()) return ::testing::AssertionFailure() << what << ": result is undefined";
  if (!expected.defined()) {
    return ::testing::AssertionFailure() << what << ": expected tensor is undefined";
  }
  if (actual.scalar_type() != expected.scalar_type()) {
    return ::testing::AssertionFailure()
           << what << ": dtype " << actual.scalar_type() << ", expected " << expected.scalar_type();
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure()
           << what << ": shape " << shape_str(actual) << ", expected " << shape_str(expected);
  }
  const auto a = actual.detach().to(torch::kFloat64).reshape(-1);
  const auto e = expected.detach().to(torch::kFloat64).reshape(-1);
  const auto diff = (a - e).abs();
  const auto mag = e.abs();
  const double max_abs = diff.numel() ? diff.max().item<double>() : 0.0;
  const auto zero = torch::zeros_like(diff);
  const auto rel = torch::where(mag > 0, diff / mag, zero);
  const double max_rel = rel.numel() ? rel.max().item<double>() : 0.0;
  // With zero tolerance any difference gives an infinite ratio.
  const auto ratio = torch::where(diff > 0, diff / (tol.atol + tol.rtol * mag), zero);
  const double max_ratio = ratio.numel() ? ratio.max().item<double>() : 0.0;
  const bool nan = a.isnan().any().item<bool>() || e.isnan().any().item<bool>();

  if (!stats_key.empty()) {
    auto& s = error_stats()[stats_key];
    ++s.comparisons;
    s.max_abs = std::max(s.max_abs, max_abs);
    s.max_rel = std::max(s.max_rel, max_rel);
    if (max_ratio > s.max_tol_ratio) {
      s.max_tol_ratio = max_ratio;
      s.worst = what;
    }
  }

  const bool ok = !nan && torch::allclose(actual.detach(), expected.detach(), tol.rtol, tol.atol);
  if (ok) return ::testing::AssertionSuccess();
  auto failure = ::testing::AssertionFailure();
  failure << what << " differs from the golden value (rtol " << tol.rtol << ", atol " << tol.atol
          << "): max abs err " << max_abs << ", max rel err " << max_rel
          << ", max err/tolerance " << max_ratio;
  if (nan) failure << "; NaN present";
  if (ratio.numel()) {
    const int64_t worst = ratio.argmax().item<int64_t>();
    failure << std::setprecision(17) << "; worst flat index " << worst << ": got " << a[worst].item<double>() << ", expected "
        << e[worst].item<double>();
    const int64_t bad = (ratio > 1).sum().item<int64_t>();
    failure << "; " << bad << " of " << ratio.numel() << " elements outside tolerance";
  }
  return failure;
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

// ---------------------------------------------------------------------------
// masked_softmax: both the public entry point and composite::masked_softmax.
// ---------------------------------------------------------------------------

enum class Softmax { kPublic, kComposite };

void PrintTo(Softmax which, std::ostream* os) {
  *os << (which == Softmax::kPublic ? "d2l::masked_softmax" : "d2l::composite::masked_softmax");
}

class GoldenMaskedSoftmax
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, Softmax>> {};

TEST_P(GoldenMaskedSoftmax, OutputAndGradMatchBook) {
  const auto& [name, dtype, which] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const Tolerance tol = tolerance_for(dtype);
  const std::string impl =
      which == Softmax::kPublic ? "d2l::masked_softmax" : "d2l::composite::masked_softmax";

  auto X = fx.tensor("X").clone().requires_grad_(true);
  ASSERT_EQ(X.scalar_type(), dtype_of(dtype));
  const torch::Tensor lens = fx.has_tensor("valid_lens") ? fx.tensor("valid_lens") : torch::Tensor();
  const auto out = which == Softmax::kPublic ? d2l::masked_softmax(X, lens)
                                             : d2l::composite::masked_softmax(X, lens);
  EXPECT_TRUE(close_to(out, fx.tensor("output"), tol, impl + " output", dtype));
  (out * fx.tensor("G")).sum().backward();
  EXPECT_TRUE(close_to(X.grad(), fx.tensor("grad.X"), tol, impl + " grad.X", dtype));
}

std::string softmax_param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string, Softmax>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param) +
         (std::get<2>(info.param) == Softmax::kPublic ? "_public" : "_composite");
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenMaskedSoftmax,
                         ::testing::Combine(::testing::ValuesIn(kMaskedSoftmaxCases),
                                            ::testing::ValuesIn(kDtypes),
                                            ::testing::Values(Softmax::kPublic,
                                                              Softmax::kComposite)),
                         softmax_param_name);

// ---------------------------------------------------------------------------
// sequence_mask: a copy with a fill, so it must match exactly.
// ---------------------------------------------------------------------------

class GoldenSequenceMask : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenSequenceMask, MatchesBookExactly) {
  const auto& [name, dtype] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const auto X = fx.tensor("X");
  ASSERT_EQ(X.scalar_type(), dtype_of(dtype));
  const auto before = X.clone();
  const auto out = d2l::sequence_mask(X, fx.tensor("valid_len"), fx.scalar("value"));
  EXPECT_TRUE(close_to(out, fx.tensor("output"), {0.0, 0.0}, "d2l::sequence_mask output", dtype));
  EXPECT_TRUE(torch::equal(X, before)) << "d2l::sequence_mask modified its argument";
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenSequenceMask,
                         ::testing::Combine(::testing::ValuesIn(kSequenceMaskCases),
                                            ::testing::ValuesIn(kDtypes)),
                         param_name);

// ---------------------------------------------------------------------------
// Attention modules.
// ---------------------------------------------------------------------------

// Tensor names of a module fixture that are not parameters (see the generator).
const std::set<std::string> kModuleIO = {"queries", "keys", "values", "valid_lens",
                                         "G", "output", "attention_weights"};

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
  std::set<std::string> known = {"queries", "keys", "values", "G", "output",
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
  EXPECT_TRUE(close_to(in.queries.grad(), fx.tensor("grad.queries"), tol, who + " grad.queries",
                       dtype));
  EXPECT_TRUE(close_to(in.keys.grad(), fx.tensor("grad.keys"), tol, who + " grad.keys", dtype));
  EXPECT_TRUE(close_to(in.values.grad(), fx.tensor("grad.values"), tol, who + " grad.values",
                       dtype));
}

class GoldenAdditiveAttention
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenAdditiveAttention, OutputWeightsAndGradsMatchBook) {
  const auto& [name, dtype] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const Tolerance tol = tolerance_for(dtype);
  const std::string who = "d2l::AdditiveAttention";

  d2l::AdditiveAttention attention(static_cast<int64_t>(fx.scalar("key_size")),
                                   static_cast<int64_t>(fx.scalar("query_size")),
                                   static_cast<int64_t>(fx.scalar("num_hiddens")),
                                   fx.scalar("dropout"));
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
  const auto [out, weights] = d2l::functional::dot_product_attention(
      in.queries, in.keys, in.values, in.valid_lens, fx.scalar("dropout"), /*training=*/false);
  EXPECT_TRUE(close_to(out, fx.tensor("output"), tol, who + " output", dtype));
  EXPECT_TRUE(close_to(weights, fx.tensor("attention_weights"), tol, who + " attention_weights",
                       dtype));
  (out * in.G).sum().backward();
  expect_input_grads(fx, in, tol, who, dtype);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenDotProductAttention,
                         ::testing::Combine(::testing::ValuesIn(kDotProductCases),
                                            ::testing::ValuesIn(kDtypes)),
                         param_name);

// ---------------------------------------------------------------------------
// The harness itself: the loader rejects bad files, the comparison can fail.
// ---------------------------------------------------------------------------

class TempFixture {
 public:
  explicit TempFixture(const std::string& text) {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("d2l_golden_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) +
              ".txt"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFixture() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Expects load_fixture_file(text) to throw a runtime_error whose message names
// the file and contains `needle`.
void expect_rejected(const std::string& text, const std::string& needle) {
  TempFixture file(text);
  try {
    d2l::testing::load_fixture_file(file.path());
    ADD_FAILURE() << "accepted a malformed fixture:\n" << text;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
  }
}

TEST(GoldenFixture, ReadsHexFloatsExactlyAndIntegers) {
  TempFixture file(
      "# comment\n"
      "scalar dropout 0x1.999999999999ap-4\n"
      "scalar num_hiddens 8\n"
      "tensor x float64 2 1 3\n"
      "0x1.999999999999ap-4 -0x0.0p+0 0x1.0000000000001p+0\n"
      "tensor y float32 1 2\n"
      "0x1.99999a0000000p-4 -0x1.0p-149\n"
      "tensor lens int64 1 2\n"
      "7 -4\n"
      "tensor s float64 0\n"
      "0x1.8p+1\n");
  const auto fx = d2l::testing::load_fixture_file(file.path());
  EXPECT_EQ(fx.scalar("dropout"), 0.1);
  EXPECT_EQ(fx.scalar("num_hiddens"), 8.0);
  const auto x = fx.tensor("x");
  ASSERT_EQ(x.scalar_type(), torch::kFloat64);
  ASSERT_EQ(x.sizes(), torch::IntArrayRef({1, 3}));
  EXPECT_EQ(x[0][0].item<double>(), 0.1);
  EXPECT_TRUE(std::signbit(x[0][1].item<double>()));
  EXPECT_EQ(x[0][2].item<double>(), 1.0 + std::ldexp(1.0, -52));
  const auto y = fx.tensor("y");
  ASSERT_EQ(y.scalar_type(), torch::kFloat32);
  EXPECT_EQ(y[0].item<float>(), 0.1f);
  EXPECT_EQ(y[1].item<float>(), -std::numeric_limits<float>::denorm_min());
  const auto lens = fx.tensor("lens");
  ASSERT_EQ(lens.scalar_type(), torch::kInt64);
  EXPECT_EQ(lens[0].item<int64_t>(), 7);
  EXPECT_EQ(lens[1].item<int64_t>(), -4);
  EXPECT_EQ(fx.tensor("s").dim(), 0);
  EXPECT_EQ(fx.tensor("s").item<double>(), 3.0);
}

TEST(GoldenFixture, MissingFileAndEntriesThrow) {
  EXPECT_THROW(load_fixture("no_such_fixture"), std::runtime_error);
  const Fixture fx = load_fixture("masked_softmax_lens1d_float64");
  try {
    fx.tensor("no_such_tensor");
    ADD_FAILURE() << "missing tensor did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such_tensor"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("masked_softmax_lens1d_float64"), std::string::npos);
  }
  EXPECT_THROW(fx.scalar("no_such_scalar"), std::runtime_error);
}

TEST(GoldenFixture, RejectsMalformedFiles) {
  expect_rejected("", "no entries");
  expect_rejected("# only a comment\n", "no entries");
  expect_rejected("tensor x float64 1 3\n0x1p+0 0x1p+1\n", "expected 3 values, got 2");
  expect_rejected("tensor x float64 1 1\n0x1p+0 0x1p+1\n", "expected 1 values, got 2");
  expect_rejected("tensor x float64 1 2\n", "missing the line of values");
  expect_rejected("tensor x float16 1 1\n0x1p+0\n", "unknown dtype");
  expect_rejected("tensor x float64 2 1\n0x1p+0\n", "does not match");
  expect_rejected("tensor x float64 1 1\n0x1p+0z\n", "bad floating-point value");
  expect_rejected("tensor x int64 1 1\n1.5\n", "bad integer");
  expect_rejected("tensor x float32 1 1\n0x1.999999999999ap-4\n", "not exactly representable");
  expect_rejected("scalar a 1\nscalar a 2\n", "duplicate entry 'a'");
  expect_rejected("scalar a\n", "expected 'scalar <name> <value>'");
  expect_rejected("matrix a 1\n", "unknown line kind");
}

TEST(GoldenCompare, DetectsAPerturbationJustOutsideTolerance) {
  for (const auto& dtype : kDtypes) {
    const Fixture fx = load_fixture("masked_softmax_odd_" + dtype);
    const Tolerance tol = tolerance_for(dtype);
    const auto expected = fx.tensor("output");
    EXPECT_TRUE(close_to(expected.clone(), expected, tol, "unchanged copy"));
    // Move the largest weight by 3x the allowed error.
    const int64_t i = expected.reshape(-1).argmax().item<int64_t>();
    const double e = expected.reshape(-1)[i].item<double>();
    auto perturbed = expected.clone();
    perturbed.reshape(-1)[i] = e + 3 * (tol.atol + tol.rtol * std::abs(e));
    EXPECT_FALSE(close_to(perturbed, expected, tol, "perturbed copy")) << dtype;
    EXPECT_FALSE(close_to(expected.unsqueeze(0), expected, tol, "reshaped copy")) << dtype;
    EXPECT_FALSE(close_to(expected.to(torch::kInt64), expected, tol, "retyped copy")) << dtype;
  }
}

}  // namespace
