// d2l 1.0's kernels and nadaraya_watson (d2l::v1): the book's numbers
// (fixtures from tests/fixtures/generate_fixtures_v1_pooling.py), the kernels
// point by point, gradients, the refused 0/0 columns and bad arguments.

#include <d2l/v1.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fixture.h"
#include "golden_compare.h"
#include "test_utils.h"

namespace v1_pooling_test {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using d2l::testing::golden::close_to;
using d2l::testing::golden::tolerance_for;
using ::testing::HasSubstr;

// The kernels of the fixtures, by the names the generator writes them under.
std::vector<std::pair<std::string, d2l::v1::Kernel>> fixture_kernels() {
  std::vector<std::pair<std::string, d2l::v1::Kernel>> kernels = {
      {"gaussian", d2l::v1::gaussian},
      {"boxcar", d2l::v1::boxcar},
      {"constant", d2l::v1::constant},
      {"epanechikov", d2l::v1::epanechikov}};
  for (const auto& [name, sigma] : std::vector<std::pair<std::string, double>>{
           {"0.1", 0.1}, {"0.2", 0.2}, {"0.5", 0.5}, {"1", 1.0}, {"0.7", 0.7}}) {
    kernels.emplace_back("sigma_" + name, d2l::v1::gaussian_with_width(sigma));
  }
  return kernels;
}

class V1NadarayaWatsonGolden
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(V1NadarayaWatsonGolden, MatchesTheBook) {
  const auto& [fixture_case, dtype] = GetParam();
  const auto fx = d2l::testing::load_fixture(fixture_case + "_" + dtype);
  const auto tol = tolerance_for(dtype);
  const auto G = fx.tensor("G");
  int kernels_run = 0;
  for (const auto& [name, kernel] : fixture_kernels()) {
    if (!fx.has_tensor(name + ".y_hat")) continue;
    ++kernels_run;
    std::vector<torch::Tensor> inputs;
    for (const char* input : {"x_train", "y_train", "x_val"}) {
      inputs.push_back(fx.tensor(input).clone().requires_grad_(true));
    }
    auto [y_hat, attention_w] = d2l::v1::nadaraya_watson(inputs[0], inputs[1], inputs[2], kernel);
    const std::string who = fx.path() + " " + name;
    EXPECT_TRUE(close_to(y_hat, fx.tensor(name + ".y_hat"), tol, who + " y_hat", dtype));
    EXPECT_TRUE(
        close_to(attention_w, fx.tensor(name + ".attention_w"), tol, who + " attention_w", dtype));
    (y_hat * G).sum().backward();
    const char* names[] = {"x_train", "y_train", "x_val"};
    for (int i = 0; i < 3; ++i) {
      const std::string key = name + ".grad." + names[i];
      if (fx.has_tensor(key)) {
        // A gradient entry is a sum of terms of size |G| |y| / sigma^2 that
        // cancel to much less (sigma 0.1: an entry of 5e-4 beside others of
        // 6), so float32 rounding differs between LibTorch builds by more
        // than rtol of the entry itself. Compare float32 gradients normwise:
        // atol is rtol times the largest entry of that gradient.
        const auto expected = fx.tensor(key);
        auto grad_tol = tol;
        if (dtype == "float32") {
          grad_tol.atol = std::max(tol.atol, tol.rtol * expected.abs().max().item<double>());
        }
        EXPECT_TRUE(close_to(inputs[i].grad(), expected, grad_tol, who + " " + key, dtype));
      } else {
        // Where the book's autograd gives no gradient (the boxcar's
        // comparison), neither does ours.
        EXPECT_FALSE(inputs[i].grad().defined()) << who << " " << key;
      }
    }
  }
  // Every kernel of the file was run: the table above knows them all.
  int kernels_in_file = 0;
  for (const auto& name : fx.tensor_names()) {
    const std::string suffix = ".y_hat";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      ++kernels_in_file;
    }
  }
  EXPECT_EQ(kernels_run, kernels_in_file);
  EXPECT_GE(kernels_run, 8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V1NadarayaWatsonGolden,
                         ::testing::Combine(::testing::Values("v1_pooling_book", "v1_pooling_odd"),
                                            ::testing::ValuesIn(d2l::testing::golden::kDtypes)),
                         d2l::testing::golden::param_name);

TEST(V1PoolingKernels, TakeTheBookValues) {
  const auto x =
      torch::tensor({-2.0, -1.0, -0.999, -0.5, 0.0, 0.25, 0.999, 1.0, 3.0}, torch::kDouble);
  const auto e = [](double v) { return std::exp(-v * v / 2); };
  EXPECT_TRUE(torch::allclose(
      d2l::v1::gaussian(x),
      torch::tensor({e(-2), e(-1), e(-0.999), e(-0.5), 1.0, e(0.25), e(0.999), e(1), e(3)},
                    torch::kDouble)));
  // Strictly inside (the book's code: abs(x) < 1.0).
  EXPECT_TRUE(torch::equal(d2l::v1::boxcar(x),
                           torch::tensor({0., 0., 1., 1., 1., 1., 1., 0., 0.}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(d2l::v1::constant(x), torch::ones({9}, torch::kDouble)));
  EXPECT_TRUE(torch::allclose(
      d2l::v1::epanechikov(x),
      torch::tensor({0., 0., 0.001, 0.5, 1., 0.75, 0.001, 0., 0.}, torch::kDouble)));
  const auto wide = d2l::v1::gaussian_with_width(0.5);
  EXPECT_TRUE(torch::allclose(wide(x), torch::exp(-2 * x * x)));
  EXPECT_TRUE(torch::equal(d2l::v1::gaussian_with_width(1)(x), d2l::v1::gaussian(x)));
}

TEST(V1PoolingKernels, KeepShapeDtypeAndDevice) {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16}) {
    const auto x = torch::randn({3, 4, 2}, dtype);
    for (const auto& [name, kernel] : fixture_kernels()) {
      const auto k = kernel(x);
      EXPECT_EQ(k.scalar_type(), dtype) << name;
      EXPECT_EQ(k.sizes(), x.sizes()) << name;
    }
  }
}

TEST(V1NadarayaWatson, WeightsAreNormalisedColumnsAndPoolYTrain) {
  const auto x_train = torch::rand({9}, torch::kDouble) * 2;
  const auto y_train = torch::randn({9}, torch::kDouble);
  const auto x_val = torch::linspace(0.1, 1.9, 6, torch::kDouble);
  auto [y_hat, w] = d2l::v1::nadaraya_watson(x_train, y_train, x_val, d2l::v1::epanechikov);
  ASSERT_EQ(w.sizes(), (std::vector<int64_t>{9, 6}));
  ASSERT_EQ(y_hat.sizes(), (std::vector<int64_t>{6}));
  EXPECT_TRUE(torch::allclose(w.sum(0), torch::ones({6}, torch::kDouble)));
  for (int64_t j = 0; j < 6; ++j) {
    double numerator = 0, denominator = 0;
    for (int64_t i = 0; i < 9; ++i) {
      const double k =
          std::max(0.0, 1 - std::abs(x_train[i].item<double>() - x_val[j].item<double>()));
      numerator += k * y_train[i].item<double>();
      denominator += k;
    }
    EXPECT_NEAR(y_hat[j].item<double>(), numerator / denominator, 1e-12) << "x_val " << j;
  }
}

TEST(V1NadarayaWatson, NarrowGaussianWhoseWidthSquaredUnderflowsGivesNoNaN) {
  // The book's x² / (2σ²) is 0/0 at x = 0 once 2σ² underflows in the compute
  // type (float for float32, float16 and bfloat16): every σ here is positive
  // and finite, and each validation point lies on a training point, whose
  // weight is then 1, its neighbours' 0.
  struct Case {
    torch::ScalarType dtype;
    double sigma;
  };
  const std::vector<Case> cases = {{torch::kDouble, 1e-200}, {torch::kDouble, 1e-310},
                                   {torch::kFloat, 1e-30},   {torch::kFloat, 1e-42},
                                   {torch::kFloat, 1e-60},   {torch::kBFloat16, 1e-30},
                                   {torch::kDouble, 1e-150}};
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << c10::toString(c.dtype) << " sigma " << c.sigma);
    const auto x_train = torch::tensor({0.0, 1.0, 2.0, 3.0}).to(c.dtype);
    const auto y_train = torch::tensor({5.0, 6.0, 7.0, 8.0}).to(c.dtype);
    const auto x_val = torch::tensor({1.0, 3.0}).to(c.dtype);
    const auto kernel = d2l::v1::gaussian_with_width(c.sigma);
    const auto k = kernel(x_train.reshape({-1, 1}) - x_val.reshape({1, -1}));
    EXPECT_FALSE(torch::isnan(k).any().item<bool>());
    const auto [y_hat, w] = d2l::v1::nadaraya_watson(x_train, y_train, x_val, kernel);
    EXPECT_TRUE(torch::equal(
        w.to(torch::kDouble),
        torch::tensor({{0.0, 0.0}, {1.0, 0.0}, {0.0, 0.0}, {0.0, 1.0}}, torch::kDouble)));
    EXPECT_TRUE(torch::equal(y_hat.to(torch::kDouble), torch::tensor({6.0, 8.0}, torch::kDouble)));
  }
  // A width whose square does not underflow keeps the book's formula, op for op.
  const auto x = torch::linspace(-3, 3, 13);
  EXPECT_TRUE(torch::equal(d2l::v1::gaussian_with_width(0.3)(x),
                           torch::exp(-x.pow(2) / (2 * (0.3 * 0.3)))));
}

TEST(V1NadarayaWatson, ConstantKernelGivesTheMean) {
  const auto y_train = torch::randn({11}, torch::kDouble);
  auto [y_hat, w] = d2l::v1::nadaraya_watson(torch::rand({11}, torch::kDouble), y_train,
                                             torch::rand({4}, torch::kDouble), d2l::v1::constant);
  EXPECT_TRUE(torch::allclose(y_hat, y_train.mean().expand({4})));
  EXPECT_TRUE(torch::allclose(w, torch::full({11, 4}, 1.0 / 11, torch::kDouble)));
}

TEST(V1NadarayaWatson, AnyCallableIsAKernel) {
  const auto x_train = torch::rand({7}) * 3, y_train = torch::randn({7});
  const auto x_val = x_train.index({torch::indexing::Slice(0, 5)}) + 0.1;
  // The book's boxcar as Python has it: a boolean result, cast by nadaraya_watson.
  const auto as_bool = [](const torch::Tensor& d) { return d.abs() < 1.0; };
  auto [y_bool, w_bool] = d2l::v1::nadaraya_watson(x_train, y_train, x_val, as_bool);
  auto [y_box, w_box] = d2l::v1::nadaraya_watson(x_train, y_train, x_val, d2l::v1::boxcar);
  EXPECT_TRUE(torch::equal(w_bool, w_box));
  EXPECT_TRUE(torch::equal(y_bool, y_box));
  EXPECT_EQ(w_bool.scalar_type(), torch::kFloat32);
}

TEST(V1NadarayaWatson, GradientsMatchFiniteDifferences) {
  torch::manual_seed(11);
  for (const auto& kernel :
       {d2l::v1::gaussian_with_width(0.7), d2l::v1::Kernel(d2l::v1::epanechikov)}) {
    d2l::testing::expect_gradients_match_finite_differences(
        [&](const std::vector<torch::Tensor>& in) {
          return std::get<0>(d2l::v1::nadaraya_watson(in[0], in[1], in[2], kernel));
        },
        {torch::rand({5}, torch::kDouble), torch::randn({5}, torch::kDouble),
         torch::rand({4}, torch::kDouble)});
  }
}

TEST(V1NadarayaWatson, DtypesAndViews) {
  const auto x_train = torch::rand({12}, torch::kDouble) * 5;
  const auto y_train = torch::randn({12}, torch::kDouble);
  const auto x_val = torch::arange(0, 5, 0.5, torch::kDouble);
  const auto reference =
      std::get<0>(d2l::v1::nadaraya_watson(x_train, y_train, x_val, d2l::v1::gaussian));
  const auto as = [&](torch::Dtype dtype) {
    return std::get<0>(d2l::v1::nadaraya_watson(x_train.to(dtype), y_train.to(dtype),
                                                x_val.to(dtype), d2l::v1::gaussian));
  };
  EXPECT_LT(max_rel_error(as(torch::kFloat32), reference), 1e-5);
  EXPECT_LT(max_rel_error(as(torch::kBFloat16), reference), 5e-2);
  // Strided views give the contiguous result.
  const auto strided = torch::stack({x_train, x_train}, 1).select(1, 0);
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(torch::equal(
      std::get<0>(d2l::v1::nadaraya_watson(strided, y_train, x_val, d2l::v1::gaussian)),
      reference));
}

TEST(V1NadarayaWatson, EmptySizes) {
  auto [y_hat, w] = d2l::v1::nadaraya_watson(torch::rand({4}), torch::rand({4}), torch::rand({0}),
                                             d2l::v1::gaussian);
  EXPECT_EQ(y_hat.sizes(), (std::vector<int64_t>{0}));
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{4, 0}));
  auto [y_none, w_none] = d2l::v1::nadaraya_watson(torch::rand({0}), torch::rand({0}),
                                                   torch::rand({0}), d2l::v1::gaussian);
  EXPECT_EQ(w_none.sizes(), (std::vector<int64_t>{0, 0}));
  EXPECT_THAT(error_message([] {
                d2l::v1::nadaraya_watson(torch::rand({0}), torch::rand({0}), torch::rand({3}),
                                         d2l::v1::gaussian);
              }),
              HasSubstr("d2l::v1::nadaraya_watson: x_train must hold at least one training "
                        "point, got x_train [0] for x_val [3]"));
}

TEST(V1NadarayaWatson, RefusesColumnsWithNoWeight) {
  // No training point within 1 of x_val[1] and x_val[2]: the book's boxcar
  // gives them 0/0, NaN weights and a NaN estimate.
  const auto x_train = torch::tensor({0.0, 0.5}), y_train = torch::tensor({1.0, 2.0});
  const auto x_val = torch::tensor({0.2, 3.0, 4.0});
  const std::string fn = "d2l::v1::nadaraya_watson: ";
  for (const auto& kernel :
       {d2l::v1::Kernel(d2l::v1::boxcar), d2l::v1::Kernel(d2l::v1::epanechikov)}) {
    EXPECT_THAT(error_message([&] { d2l::v1::nadaraya_watson(x_train, y_train, x_val, kernel); }),
                HasSubstr(fn + "the kernel is 0 at every x_train for 2 of the 3 x_val (the first: "
                               "x_val[1] = 3), whose attention weights would be 0/0 (NaN in the "
                               "book); use a wider kernel, or leave out the x_val that no "
                               "training point is near"));
  }
  // A Gaussian underflows to 0 in float32 far from every point; not in float64.
  const auto far = torch::tensor({20.0});
  EXPECT_THAT(
      error_message([&] { d2l::v1::nadaraya_watson(x_train, y_train, far, d2l::v1::gaussian); }),
      HasSubstr("for 1 of the 1 x_val (the first: x_val[0] = 20)"));
  const auto [y_hat, w] =
      d2l::v1::nadaraya_watson(x_train.to(torch::kDouble), y_train.to(torch::kDouble),
                               far.to(torch::kDouble), d2l::v1::gaussian);
  EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
  // Weights exp(-200) and exp(-190.125): the nearer point outweighs by e^9.875.
  EXPECT_NEAR(y_hat.item<double>(), 1 + 1 / (1 + std::exp(-9.875)), 1e-12);
  // Where every column has a training point, the boxcar pools as the book.
  EXPECT_NO_THROW(
      d2l::v1::nadaraya_watson(x_train, y_train, torch::tensor({0.2, 1.4}), d2l::v1::boxcar));
}

TEST(V1NadarayaWatson, RejectsBadArguments) {
  const auto x = torch::rand({5}), y = torch::rand({5}), v = torch::rand({3});
  const auto nw = [](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c,
                     const d2l::v1::Kernel& k) {
    return error_message([&] { d2l::v1::nadaraya_watson(a, b, c, k); });
  };
  const auto g = d2l::v1::Kernel(d2l::v1::gaussian);
  const std::string fn = "d2l::v1::nadaraya_watson: ";
  EXPECT_THAT(nw(x.reshape({5, 1}), y, v, g),
              HasSubstr(fn + "x_train must be a 1-D tensor, got [5, 1]"));
  EXPECT_THAT(nw(x, y.reshape({1, 5}), v, g),
              HasSubstr(fn + "y_train must be a 1-D tensor, got [1, 5]"));
  EXPECT_THAT(nw(x, y, torch::tensor(0.5), g),
              HasSubstr(fn + "x_val must be a 1-D tensor, got []"));
  EXPECT_THAT(nw(x, torch::rand({4}), v, g),
              HasSubstr(fn + "x_train and y_train must have the same length, got x_train [5] and "
                             "y_train [4]"));
  EXPECT_THAT(nw(torch::arange(5), y, v, g),
              HasSubstr(fn + "x_train must have a floating-point dtype, got Long"));
  EXPECT_THAT(nw(x, y.to(torch::kDouble), v, g),
              HasSubstr(fn + "y_train must have the same dtype as x_train (Float), got Double"));
  EXPECT_THAT(nw(x, y, v.to(torch::kDouble), g),
              HasSubstr(fn + "x_val must have the same dtype as x_train (Float), got Double"));
  EXPECT_THAT(nw(x, y, torch::Tensor(), g), HasSubstr(fn + "x_val must be a defined tensor"));
  EXPECT_THAT(nw(x, y, v, d2l::v1::Kernel()),
              HasSubstr(fn + "kernel must be callable, got an empty d2l::v1::Kernel"));
  EXPECT_THAT(nw(x, y, v, [](const torch::Tensor& d) { return d.sum(0); }),
              HasSubstr(fn + "kernel must return a tensor of the shape it is given, got [3] for "
                             "dists [5, 3]"));
  EXPECT_THAT(nw(x, y, v, [](const torch::Tensor&) { return torch::Tensor(); }),
              HasSubstr(fn + "kernel must return a defined tensor, got an undefined one for dists "
                             "[5, 3]"));
  EXPECT_THAT(nw(x, y, v, [](const torch::Tensor& d) { return torch::complex(d, d); }),
              HasSubstr(fn + "kernel must return real numbers, got dtype ComplexFloat"));
  EXPECT_THAT(nw(x, y, v, [](const torch::Tensor& d) { return d.to_sparse(); }),
              HasSubstr(fn + "the kernel's result must be a dense tensor with the strided layout"));
}

TEST(V1PoolingKernels, RejectBadArguments) {
  EXPECT_THAT(error_message([] { d2l::v1::boxcar(torch::arange(3)); }),
              HasSubstr("d2l::v1::boxcar: x must have a floating-point dtype, got Long (shape "
                        "[3])"));
  EXPECT_THAT(error_message([] { d2l::v1::gaussian(torch::Tensor()); }),
              HasSubstr("d2l::v1::gaussian: x must be a defined tensor"));
  EXPECT_THAT(error_message([] { d2l::v1::epanechikov(torch::rand({2}).to_sparse()); }),
              HasSubstr("d2l::v1::epanechikov: x must be a dense tensor with the strided layout"));
  EXPECT_THAT(error_message([] { d2l::v1::constant(torch::ones({2}, torch::kBool)); }),
              HasSubstr("d2l::v1::constant: x must have a floating-point dtype, got Bool"));
  EXPECT_THAT(error_message([] { d2l::v1::gaussian_with_width(0.5)(torch::arange(2)); }),
              HasSubstr("d2l::v1::gaussian_with_width: x must have a floating-point dtype"));
  for (const double sigma : {0.0, -0.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THAT(error_message([&] { d2l::v1::gaussian_with_width(sigma); }),
                HasSubstr("d2l::v1::gaussian_with_width: sigma must be positive and finite, got "))
        << sigma;
  }
}

TEST(V1NadarayaWatson, CudaMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto x_train = torch::rand({40}, torch::kDouble) * 5;
  const auto y_train = torch::randn({40}, torch::kDouble);
  const auto x_val = torch::arange(0, 5, 0.1, torch::kDouble);
  for (const auto& [name, kernel] : fixture_kernels()) {
    auto [y_cpu, w_cpu] = d2l::v1::nadaraya_watson(x_train, y_train, x_val, kernel);
    auto [y_gpu, w_gpu] =
        d2l::v1::nadaraya_watson(x_train.cuda(), y_train.cuda(), x_val.cuda(), kernel);
    EXPECT_TRUE(y_gpu.is_cuda()) << name;
    EXPECT_LT(max_rel_error(y_gpu, y_cpu), 1e-12) << name;
    EXPECT_LT(max_rel_error(w_gpu, w_cpu), 1e-12) << name;
  }
  EXPECT_THAT(error_message([&] {
                d2l::v1::nadaraya_watson(x_train.cuda(), y_train, x_val.cuda(), d2l::v1::gaussian);
              }),
              HasSubstr("d2l::v1::nadaraya_watson: y_train must be on the same device as x_train "
                        "(cuda:0), got cpu"));
  EXPECT_THAT(error_message([&] {
                d2l::v1::nadaraya_watson(x_train.cuda(), y_train.cuda(), x_val.cuda(),
                                         [](const torch::Tensor& d) { return d.cpu(); });
              }),
              HasSubstr("d2l::v1::nadaraya_watson: the kernel's result must be on the same device "
                        "as dists (cuda:0), got cpu"));
}

}  // namespace v1_pooling_test
