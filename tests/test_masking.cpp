#include <d2l/masked_softmax.h>
#include <d2l/sequence_mask.h>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using d2l::testing::reference_masked_softmax;
using ::testing::HasSubstr;

// ---------------------------------------------------------------- sequence_mask

TEST(SequenceMask, BookValues) {
  const auto X = torch::tensor({{1, 2, 3}, {4, 5, 6}}, torch::kFloat);
  const auto out = d2l::sequence_mask(X, torch::tensor({1, 2}));
  EXPECT_TRUE(torch::equal(out, torch::tensor({{1, 0, 0}, {4, 5, 0}}, torch::kFloat)));
  const auto filled = d2l::sequence_mask(X, torch::tensor({0, 3}), -1);
  EXPECT_TRUE(torch::equal(filled, torch::tensor({{-1, -1, -1}, {4, 5, 6}}, torch::kFloat)));
}

TEST(SequenceMask, NeverModifiesItsInput) {
  const auto X = torch::ones({2, 4});
  const auto before = X.clone();
  const auto out = d2l::sequence_mask(X, torch::tensor({1, 2}));
  EXPECT_TRUE(torch::equal(X, before));
  EXPECT_NE(out.data_ptr(), X.data_ptr());
}

TEST(SequenceMask, TrailingDimensionsFollowTheMask) {
  const auto X = torch::ones({2, 3, 2});
  const auto out = d2l::sequence_mask(X, torch::tensor({1, 3}));
  EXPECT_EQ(out.sum().item<double>(), 2 * (1 + 3));
  EXPECT_EQ(out[0][1].sum().item<double>(), 0);
}

TEST(SequenceMask, LengthsAboveTheRowLengthKeepEverything) {
  const auto X = torch::randn({2, 3});
  EXPECT_TRUE(torch::equal(d2l::sequence_mask(X, torch::tensor({9, 3})), X));
}

// ATen compares an int64 position with a bfloat16 length in bfloat16, where
// position 275 rounds to 276: a length of 276 once let 275 columns through.
TEST(SequenceMask, ReducedPrecisionLengthsAreComparedExactly) {
  const auto X = torch::ones({4, 600});
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    const auto lens = torch::tensor({276, 304, 512, 600}).to(dtype);
    const auto kept = d2l::sequence_mask(X, lens).sum(1);
    EXPECT_TRUE(torch::equal(kept, torch::tensor({276.0f, 304.0f, 512.0f, 600.0f})))
        << c10::toString(dtype) << ": " << kept;
  }
}

TEST(SequenceMask, RejectsBadArguments) {
  EXPECT_THAT(error_message([] { d2l::sequence_mask(torch::ones({3}), torch::tensor({1})); }),
              HasSubstr("d2l::sequence_mask: X must be a tensor of at least 2 dimensions (N, L, "
                        "...), got [3]"));
  EXPECT_THAT(error_message([] {
                d2l::sequence_mask(torch::ones({2, 3}), torch::tensor({1, 2, 3}));
              }),
              HasSubstr("d2l::sequence_mask: valid_len must have shape [2] for X [2, 3], got [3]"));
  EXPECT_THAT(error_message([] {
                d2l::sequence_mask(torch::ones({2, 3}), torch::tensor({1, -2}));
              }),
              HasSubstr("d2l::sequence_mask: valid_len must hold non-negative lengths, got -2"));
  EXPECT_THAT(error_message([] {
                d2l::sequence_mask(torch::ones({2, 3}, torch::kHalf), torch::tensor({1, 2}), -1e6);
              }),
              HasSubstr("d2l::sequence_mask: value -1000000 does not fit X's dtype Half"));
  // Found by the fuzzer: ATen threw std::runtime_error here, and took NaN.
  for (double value : {300.0, -129.0, std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_THAT(
        error_message([&] {
          d2l::sequence_mask(torch::ones({2, 3}, torch::kChar), torch::tensor({1, 2}), value);
        }),
        HasSubstr("does not fit X's dtype Char (range [-128, 127])"));
  }
  EXPECT_THAT(error_message([] {
                d2l::sequence_mask(torch::ones({2, 3}, torch::kLong), torch::tensor({1, 2}), 1e19);
              }),
              HasSubstr("d2l::sequence_mask: value 1e+19 does not fit X's dtype Long"));
  EXPECT_EQ(d2l::sequence_mask(torch::ones({2, 3}, torch::kByte), torch::tensor({1, 2}), 255)[0][2]
                .item<int64_t>(),
            255);
}

// ---------------------------------------------------------------- masked_softmax

struct Implementation {
  const char* name;
  d2l::AttentionBackend path;
  const char* function;  // as named in its error messages
};

void PrintTo(const Implementation& impl, std::ostream* os) { *os << impl.name; }

class MaskedSoftmax : public ::testing::TestWithParam<Implementation> {
 protected:
  torch::Tensor run(const torch::Tensor& X, const torch::Tensor& lens = {}) const {
    return d2l::masked_softmax(X, lens, GetParam().path);
  }
};

TEST_P(MaskedSoftmax, BookExamplesMatchARowByRowReference) {
  torch::manual_seed(1);
  const auto X = torch::rand({2, 2, 4}, torch::kDouble);
  for (const auto& lens : {torch::tensor({2, 3}), torch::tensor({{1, 3}, {2, 4}})}) {
    const auto out = run(X, lens);
    EXPECT_LT(max_rel_error(out, reference_masked_softmax(X, lens)), 1e-14);
  }
  const auto expected_zeros = run(X, torch::tensor({2, 3})).narrow(2, 3, 1);
  EXPECT_EQ(expected_zeros.abs().sum().item<double>(), 0);
}

TEST_P(MaskedSoftmax, UndefinedLengthsIsAPlainSoftmax) {
  const auto X = torch::randn({3, 4, 5}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(run(X), torch::softmax(X, -1), 1e-14, 0));
}

TEST_P(MaskedSoftmax, LengthsAboveTheKeyCountMeanAllValid) {
  const auto X = torch::randn({2, 3, 5}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(run(X, torch::tensor({5, 100})), torch::softmax(X, -1), 1e-14, 0));
}

// Whole floating-point lengths beyond int64 (found by fuzz_attention: the
// fused kernel once converted 1e20 to a negative length and wrote out of bounds).
TEST_P(MaskedSoftmax, FloatingLengthsBeyondInt64MeanAllValid) {
  const auto X = torch::randn({2, 3, 5}, torch::kDouble);
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
    for (double huge : {1e20, 9223372036854775808.0, 3e38}) {
      const auto lens = torch::tensor({huge, 2.0}).to(dtype);
      EXPECT_TRUE(torch::allclose(run(X, lens), run(X, torch::tensor({5, 2})), 1e-14, 0))
          << c10::toString(dtype) << " " << huge;
    }
  }
}

TEST_P(MaskedSoftmax, ZeroLengthRowsGetZeroWeightsAndNoNaN) {
  const auto X = torch::randn({2, 3, 4});
  const auto out = run(X, torch::tensor({{0, 2, 0}, {4, 0, 1}}));
  EXPECT_EQ(out[0][0].abs().sum().item<float>(), 0);
  EXPECT_EQ(out[1][1].abs().sum().item<float>(), 0);
  EXPECT_NEAR(out[0][1].sum().item<float>(), 1, 1e-6);
  EXPECT_FALSE(out.isnan().any().item<bool>());
}

TEST_P(MaskedSoftmax, MaskedScoresNeverLeakEvenWhenInfOrNaN) {
  auto X = torch::randn({1, 3, 6}, torch::kDouble);
  const auto clean = run(X, torch::tensor({3}));
  X.narrow(2, 3, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  X.narrow(2, 4, 1).fill_(std::numeric_limits<double>::infinity());
  X.narrow(2, 5, 1).fill_(1e30);
  EXPECT_TRUE(torch::equal(run(X, torch::tensor({3})), clean));
}

TEST_P(MaskedSoftmax, EveryIntegerLengthDtypeGivesTheSameResult) {
  const auto X = torch::randn({2, 3, 7});
  const auto expected = run(X, torch::tensor({{1, 7, 3}, {0, 2, 5}}));
  for (auto dtype : {torch::kUInt8, torch::kInt8, torch::kInt16, torch::kInt32, torch::kInt64,
                     torch::kFloat, torch::kDouble}) {
    const auto lens = torch::tensor({{1, 7, 3}, {0, 2, 5}}).to(dtype);
    EXPECT_TRUE(torch::equal(run(X, lens), expected)) << c10::toString(dtype);
  }
}

TEST_P(MaskedSoftmax, ReducedPrecisionLengthsAreComparedExactly) {
  const auto X = torch::randn({2, 3, 600}, torch::kDouble);
  const auto lens = torch::tensor({{276, 304, 0}, {512, 596, 600}});
  const auto expected = run(X, lens);
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    EXPECT_TRUE(torch::equal(run(X, lens.to(dtype)), expected)) << c10::toString(dtype);
    EXPECT_TRUE(torch::equal(run(X, lens.select(1, 1).to(dtype)), run(X, lens.select(1, 1))))
        << c10::toString(dtype) << ", (B) lengths";
  }
}

TEST_P(MaskedSoftmax, ReducedPrecisionMatchesADoubleReference) {
  torch::manual_seed(2);
  // Scores near float16's limit: the book's -1e6 fill cannot even be stored.
  const auto X = torch::randn({3, 4, 33}, torch::kDouble) * 8 + 6e4;
  const auto lens = torch::randint(0, 34, {3, 4});
  for (auto [dtype, tol] : {std::pair{torch::kHalf, 2e-3}, std::pair{torch::kBFloat16, 1e-2},
                            std::pair{torch::kFloat, 1e-6}}) {
    const auto Xr = X.to(dtype);
    const auto out = run(Xr, lens);
    EXPECT_EQ(out.scalar_type(), dtype);
    EXPECT_FALSE(out.isnan().any().item<bool>()) << c10::toString(dtype);
    // Compare against the reference on the rounded inputs: rounding 6e4 to
    // half moves a score by up to 16, far more than the kernel's own error.
    EXPECT_LT(
        (out.to(torch::kDouble) - reference_masked_softmax(Xr, lens)).abs().max().item<double>(),
        tol)
        << c10::toString(dtype);
  }
}

TEST_P(MaskedSoftmax, NonContiguousAndExpandedInputs) {
  const auto base = torch::randn({5, 3, 2}, torch::kDouble);
  const auto X = base.transpose(0, 2);  // (2, 3, 5), not contiguous
  const auto lens = torch::tensor({4}).expand({2, 3});
  ASSERT_FALSE(X.is_contiguous());
  EXPECT_LT(max_rel_error(run(X, lens), reference_masked_softmax(X, lens)), 1e-14);
  EXPECT_TRUE(torch::equal(run(X, lens), run(X.contiguous(), lens.contiguous())));
}

TEST_P(MaskedSoftmax, EmptyShapes) {
  EXPECT_EQ(run(torch::randn({0, 3, 4}), torch::zeros({0}, torch::kLong)).sizes(),
            (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(run(torch::randn({2, 0, 4}), torch::tensor({1, 2})).sizes(),
            (std::vector<int64_t>{2, 0, 4}));
  EXPECT_EQ(run(torch::randn({2, 3, 0}), torch::tensor({0, 0})).sizes(),
            (std::vector<int64_t>{2, 3, 0}));
}

TEST_P(MaskedSoftmax, NeverModifiesItsInput) {
  const auto X = torch::randn({2, 3, 4});
  const auto before = X.clone();
  run(X, torch::tensor({1, 2}));
  EXPECT_TRUE(torch::equal(X, before));
}

TEST_P(MaskedSoftmax, GradientsMatchFiniteDifferences) {
  torch::manual_seed(3);
  const auto lens = torch::tensor({{1, 5, 0}, {3, 2, 9}});
  d2l::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) { return run(in[0], lens); },
      {torch::randn({2, 3, 5}, torch::kDouble)});
}

TEST_P(MaskedSoftmax, GradientsStayFiniteWithPoisonedMaskedScores) {
  auto X = torch::randn({2, 2, 4});
  X.narrow(2, 2, 2).fill_(std::numeric_limits<float>::quiet_NaN());
  X.set_requires_grad(true);
  run(X, torch::tensor({{2, 0}, {1, 2}})).pow(2).sum().backward();
  EXPECT_TRUE(X.grad().isfinite().all().item<bool>());
  EXPECT_EQ(X.grad().narrow(2, 2, 2).abs().sum().item<float>(), 0);
  EXPECT_EQ(X.grad()[0][1].abs().sum().item<float>(), 0);
}

TEST_P(MaskedSoftmax, RejectsBadArguments) {
  const auto X = torch::randn({2, 3, 4});
  const std::string fn = std::string(GetParam().function) + ": ";
  EXPECT_THAT(error_message([&] {
                run(torch::randn({2, 4}), torch::tensor({1, 2}));
              }),
              HasSubstr(fn + "X must be a 3-D tensor, got [2, 4]"));
  EXPECT_THAT(error_message([&] {
                run(torch::ones({2, 3, 4}, torch::kLong), torch::tensor({1, 2}));
              }),
              HasSubstr(fn + "X must have a floating-point dtype, got Long"));
  EXPECT_THAT(error_message([&] {
                run(torch::ones({2, 3}, torch::kInt));
              }),
              HasSubstr(fn + "X must have a floating-point dtype, got Int"));
  EXPECT_THAT(error_message([&] {
                run(X, torch::tensor({1, 2, 3}));
              }),
              HasSubstr(fn + "valid_lens must have shape [2] or [2, 3] for X [2, 3, 4], got [3]"));
  EXPECT_THAT(
      error_message([&] {
        run(X, torch::ones({2, 4}, torch::kLong));
      }),
      HasSubstr(fn + "valid_lens must have shape [2] or [2, 3] for X [2, 3, 4], got [2, 4]"));
  EXPECT_THAT(error_message([&] {
                run(X, torch::tensor({1, -1}));
              }),
              HasSubstr(fn + "valid_lens must hold non-negative lengths, got -1 at flat index 1"));
  EXPECT_THAT(error_message([&] {
                run(X, torch::tensor({1.0, 2.5}));
              }),
              HasSubstr(fn + "valid_lens must hold whole numbers, got 2.5 at flat index 1"));
  EXPECT_THAT(error_message([&] {
                run(X, torch::tensor({1.0, std::numeric_limits<double>::quiet_NaN()}));
              }),
              HasSubstr(fn + "valid_lens must hold whole numbers, got nan"));
  EXPECT_THAT(error_message([&] {
                run(X, torch::tensor({true, false}));
              }),
              HasSubstr(fn + "valid_lens must have an integer dtype (or a floating-point one "
                             "holding whole numbers), got Bool"));
}

TEST_P(MaskedSoftmax, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto X = torch::randn({3, 4, 37});
  const auto lens = torch::tensor({{0, 5, 37, 40}, {1, 2, 3, 4}, {9, 9, 9, 9}});
  if (std::string(GetParam().name) == "fused") {
    EXPECT_THAT(
        error_message([&] { run(X.cuda(), lens.cuda()); }),
        HasSubstr("d2l::masked_softmax: AttentionBackend::kFused runs on the CPU, got tensors on "
                  "cuda:0"));
    return;
  }
  const auto out = run(X.cuda(), lens.cuda());
  EXPECT_TRUE(out.is_cuda());
  EXPECT_LT(max_rel_error(out.cpu(), reference_masked_softmax(X, lens)), 1e-6);
  EXPECT_THAT(error_message([&] { run(X.cuda(), lens); }),
              HasSubstr("d2l::masked_softmax: valid_lens must be on the same device as X (cuda:0), "
                        "got cpu"));
}

INSTANTIATE_TEST_SUITE_P(
    Implementations, MaskedSoftmax,
    ::testing::Values(
        Implementation{"default", d2l::AttentionBackend::kAuto, "d2l::masked_softmax"},
        Implementation{"composite", d2l::AttentionBackend::kComposite, "d2l::masked_softmax"},
        Implementation{"fused", d2l::AttentionBackend::kFused, "d2l::masked_softmax"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
