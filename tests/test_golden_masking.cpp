// Golden parity of masking: masked_softmax (the public entry point and
// masked_softmax with AttentionBackend::kComposite, output and gradient) and sequence_mask against
// fixtures written by the book's own PyTorch code
// (tests/fixtures/generate_fixtures.py). Adding a case is one line in a table below.

#include <torch/torch.h>

#include <d2l/masked_softmax.h>
#include <d2l/sequence_mask.h>

#include <gtest/gtest.h>

#include <ostream>
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

// ---------------------------------------------------------------------------
// masked_softmax: both the default path and AttentionBackend::kComposite.
// ---------------------------------------------------------------------------

enum class Softmax { kPublic, kComposite };

void PrintTo(Softmax which, std::ostream* os) {
  *os << (which == Softmax::kPublic ? "d2l::masked_softmax"
                                    : "d2l::masked_softmax(AttentionBackend::kComposite)");
}

class GoldenMaskedSoftmax
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, Softmax>> {};

TEST_P(GoldenMaskedSoftmax, OutputAndGradMatchBook) {
  const auto& [name, dtype, which] = GetParam();
  const Fixture fx = load_fixture(name + "_" + dtype);
  const Tolerance tol = tolerance_for(dtype);
  const std::string path = which == Softmax::kPublic
                               ? "d2l::masked_softmax"
                               : "d2l::masked_softmax(AttentionBackend::kComposite)";

  auto X = fx.tensor("X").clone().requires_grad_(true);
  ASSERT_EQ(X.scalar_type(), dtype_of(dtype));
  const torch::Tensor lens =
      fx.has_tensor("valid_lens") ? fx.tensor("valid_lens") : torch::Tensor();
  const auto out = which == Softmax::kPublic
                       ? d2l::masked_softmax(X, lens)
                       : d2l::masked_softmax(X, lens, d2l::AttentionBackend::kComposite);
  EXPECT_TRUE(close_to(out, fx.tensor("output"), tol, path + " output", dtype));
  (out * fx.tensor("G")).sum().backward();
  EXPECT_TRUE(close_to(X.grad(), fx.tensor("grad.X"), tol, path + " grad.X", dtype));
}

std::string softmax_param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string, Softmax>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param) +
         (std::get<2>(info.param) == Softmax::kPublic ? "_public" : "_composite");
}

INSTANTIATE_TEST_SUITE_P(
    Golden, GoldenMaskedSoftmax,
    ::testing::Combine(::testing::ValuesIn(kMaskedSoftmaxCases), ::testing::ValuesIn(kDtypes),
                       ::testing::Values(Softmax::kPublic, Softmax::kComposite)),
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

}  // namespace
