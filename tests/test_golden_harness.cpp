// The golden harness itself: the fixture loader reads hex floats exactly and
// rejects bad files, the comparison can fail; and the report, at the end of
// the run, of the largest errors the golden tests (test_golden_*.cpp) saw per dtype.

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <unistd.h>

#include "fixture.h"
#include "golden_compare.h"

namespace {

using d2l::testing::Fixture;
using d2l::testing::load_fixture;
using d2l::testing::golden::close_to;
using d2l::testing::golden::error_stats;
using d2l::testing::golden::kDtypes;
using d2l::testing::golden::Tolerance;
using d2l::testing::golden::tolerance_for;

// Prints the largest errors that the golden tests recorded in error_stats().
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

// ---------------------------------------------------------------------------
// The harness itself: the loader rejects bad files, the comparison can fail.
// ---------------------------------------------------------------------------

class TempFixture {
 public:
  explicit TempFixture(const std::string& text) {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() / ("d2l_golden_" + std::to_string(::getpid()) +
                                                       "_" + std::to_string(counter++) + ".txt"))
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
