#pragma once

// The comparison of the golden tests (test_golden_*.cpp) with the fixtures
// written by the book's own PyTorch code (tests/fixtures/generate_fixtures.py):
// per-dtype tolerances, an elementwise check that explains its failures, and
// the largest errors seen per dtype, which test_golden_harness.cpp prints at
// the end of the run.

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace d2l::testing::golden {

// Every fixture exists in float32 and float64; each case runs once per dtype.
inline const std::vector<std::string> kDtypes = {"float32", "float64"};

// ---------------------------------------------------------------------------
// Comparison.
// ---------------------------------------------------------------------------

struct Tolerance {
  double rtol;
  double atol;
};

inline Tolerance tolerance_for(const std::string& dtype) {
  if (dtype == "float64") return {1e-10, 1e-12};
  if (dtype == "float32") return {2e-5, 1e-6};
  throw std::runtime_error("no tolerance for dtype " + dtype);
}

inline torch::Dtype dtype_of(const std::string& dtype) {
  if (dtype == "float64") return torch::kFloat64;
  if (dtype == "float32") return torch::kFloat32;
  throw std::runtime_error("unknown dtype " + dtype);
}

// Largest errors seen per dtype, printed once at the end of the run.
struct ErrorStats {
  int comparisons = 0;
  double max_abs = 0;
  double max_rel = 0;        // |a - e| / |e| over entries with e != 0
  double max_tol_ratio = 0;  // |a - e| / (atol + rtol |e|); <= 1 passes
  std::string worst;         // comparison with the largest tolerance ratio
};
inline std::map<std::string, ErrorStats>& error_stats() {
  static std::map<std::string, ErrorStats> stats;
  return stats;
}

inline std::string shape_str(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// `actual` must match `expected` elementwise: |a - e| <= atol + rtol |e|
// (torch::allclose), same dtype and shape. On failure the message gives the
// largest absolute and relative errors and the worst element.
inline ::testing::AssertionResult close_to(const torch::Tensor& actual,
                                           const torch::Tensor& expected, Tolerance tol,
                                           const std::string& what,
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
          << "): max abs err " << max_abs << ", max rel err " << max_rel << ", max err/tolerance "
          << max_ratio;
  if (nan) failure << "; NaN present";
  if (ratio.numel()) {
    const int64_t worst = ratio.argmax().item<int64_t>();
    failure << std::setprecision(17) << "; worst flat index " << worst << ": got "
            << a[worst].item<double>() << ", expected " << e[worst].item<double>();
    const int64_t bad = (ratio > 1).sum().item<int64_t>();
    failure << "; " << bad << " of " << ratio.numel() << " elements outside tolerance";
  }
  return failure;
}

inline std::string param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param);
}

}  // namespace d2l::testing::golden
