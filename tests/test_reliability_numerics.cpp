// Reliability, numerics: ±1e30, ±inf and NaN in masked positions, float16 and
// bfloat16, rows with no valid position, on every path, instruction set and
// device: outputs and gradients stay finite and masked positions exactly 0
// (docs/reliability.md).

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/sequence_mask.h>

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>

#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::masked_softmax_by;
using d2l::testing::max_rel_error;
using d2l::testing::reference_masked_softmax;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---------------------------------------------------------------------------
// Numerics: ±1e30, ±inf and NaN in masked positions, float16 and bfloat16,
// rows with no valid position, on every path and device.

struct DtypeCase {
  torch::Dtype dtype;
  double tolerance;  // relative to max(|reference|, 1), forward and backward
  double big;        // a large finite score this dtype holds
};

// float16 modules and dot products run on CUDA only: LibTorch 1.13 has no
// float16 bmm or Linear on the CPU (they throw c10::Error there); the float16
// masked softmax runs everywhere.
const std::vector<DtypeCase> kDtypeCases = {{torch::kDouble, 1e-12, 1e30},
                                            {torch::kFloat, 1e-5, 1e30},
                                            {torch::kBFloat16, 3e-2, 1e30},
                                            {torch::kHalf, 4e-3, 6e4}};

std::vector<torch::Device> devices() {
  std::vector<torch::Device> result{torch::kCPU};
  if (torch::cuda::is_available()) result.emplace_back(torch::kCUDA);
  return result;
}

std::string describe(const std::string& path, const DtypeCase& c, const torch::Device& device) {
  return fmt::format("{} {} on {}", path, c10::toString(c.dtype), device.str());
}

// (B, n) lengths with rows of no, some, all and more than all valid keys.
torch::Tensor hostile_lens(int64_t m) {
  return torch::tensor({{int64_t{0}, int64_t{1}, int64_t{5}}, {m, int64_t{7}, m + 9}});
}

// (B, n, m) scores: finite in the valid positions (with ±big in some rows, so
// that one exponential underflows against another), and the hostile values
// ±1e30, ±inf, NaN cycling through every masked position.
torch::Tensor hostile_scores(const torch::Tensor& lens, int64_t m, double big) {
  const int64_t B = lens.size(0), n = lens.size(1);
  auto X = torch::randn({B, n, m}, torch::kDouble) * 3;
  X[1][1][2] = big;
  X[1][1][4] = -big;
  X[1][0][0] = -big;
  const double hostile[] = {1e30, -1e30, kInf, -kInf, kNaN};
  int k = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = lens[b][i].item<int64_t>(); j < m; ++j) X[b][i][j] = hostile[k++ % 5];
    }
  }
  return X;
}

torch::Tensor valid_mask(const torch::Tensor& lens, int64_t m) {
  return torch::arange(m).view({1, 1, m}) < lens.unsqueeze(-1);
}

// dL/dX of sum(softmax(X) * G) over each row's valid entries, in double.
torch::Tensor reference_softmax_grad(const torch::Tensor& y, const torch::Tensor& G,
                                     const torch::Tensor& valid) {
  const auto g = G.masked_fill(valid.logical_not(), 0);
  return y * (g - (g * y).sum(-1, true));
}

void expect_finite(const torch::Tensor& t, const std::string& what) {
  ASSERT_TRUE(t.defined()) << what;
  EXPECT_TRUE(torch::isfinite(t).all().item<bool>()) << what << " is not finite";
}

using MaskedSoftmax = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

void check_masked_softmax_numerics(const torch::Device& device) {
  const std::vector<std::pair<std::string, MaskedSoftmax>> paths = {
      {"composite", masked_softmax_by(AttentionBackend::kComposite)},
      {"fused", masked_softmax_by(AttentionBackend::kFused)},
      {"auto", masked_softmax_by(AttentionBackend::kAuto)}};
  torch::manual_seed(32);
  for (int64_t m : {5, 13}) {
    const auto lens = hostile_lens(m);
    const auto valid = valid_mask(lens, m);
    const auto G = torch::randn({2, 3, m}, torch::kDouble);
    for (const auto& c : kDtypeCases) {
      const auto X = hostile_scores(lens, m, c.big).to(c.dtype);
      const auto y_ref = reference_masked_softmax(X, lens);
      const auto dx_ref = reference_softmax_grad(y_ref, G, valid);
      for (const auto& [name, fn] : paths) {
        if (name == "fused" && !device.is_cpu()) continue;
        const auto what = describe("masked_softmax " + name, c, device) + " m=" + std::to_string(m);
        const auto x = X.to(device).clone().requires_grad_();
        const auto y = fn(x, lens.to(device));
        (y * G.to(device, c.dtype)).sum().backward();
        const auto out = y.detach().cpu(), grad = x.grad().cpu();
        expect_finite(out, what + " output");
        expect_finite(grad, what + " gradient");
        EXPECT_TRUE(out.masked_select(valid.logical_not()).eq(0).all().item<bool>()) << what;
        EXPECT_TRUE(grad.masked_select(valid.logical_not()).eq(0).all().item<bool>()) << what;
        EXPECT_LT(max_rel_error(out, y_ref), c.tolerance) << what << " output";
        EXPECT_LT(max_rel_error(grad, dx_ref), c.tolerance) << what << " gradient";
      }
    }
  }
}

TEST(ReliabilityNumerics, MaskedSoftmaxIgnoresHostileMaskedScoresOnTheCpu) {
  check_masked_softmax_numerics(torch::kCPU);
}

TEST(ReliabilityNumerics, MaskedSoftmaxIgnoresHostileMaskedScoresOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_masked_softmax_numerics(torch::kCUDA);
}

// Keys whose masked positions hold `hostile` values, and the same keys with
// zeros there: masked keys must not change the output or any gradient.
std::pair<torch::Tensor, torch::Tensor> keys_with_hostile_masked_rows(int64_t B, int64_t m,
                                                                      int64_t d,
                                                                      const torch::Tensor& lens,
                                                                      double hostile) {
  auto keys = torch::randn({B, m, d}, torch::kDouble);
  auto clean = keys.clone();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = std::min(lens[b].item<int64_t>(), m);
    if (L < m) {
      keys[b].narrow(0, L, m - L).fill_(hostile);
      keys[b].narrow(0, L, m - L).select(1, 0).fill_(-hostile);
      clean[b].narrow(0, L, m - L).zero_();
    }
  }
  return {keys, clean};
}

// Output and gradients (queries, keys, values, then any parameters) of
// sum(f(q, k, v) * G).
std::vector<torch::Tensor> output_and_grads(
    const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                      const torch::Tensor&)>& f,
    const std::vector<torch::Tensor>& qkv, const std::vector<torch::Tensor>& parameters,
    const torch::Tensor& G) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : qkv) leaves.push_back(t.detach().clone().requires_grad_());
  for (const auto& p : parameters) p.mutable_grad() = torch::Tensor();
  const auto out = f(leaves[0], leaves[1], leaves[2]);
  (out * G.to(out.device(), out.scalar_type())).sum().backward();
  std::vector<torch::Tensor> result{out.detach().cpu()};
  for (const auto& t : leaves) result.push_back(t.grad().cpu());
  for (const auto& p : parameters) result.push_back(p.grad().cpu());
  return result;
}

// With `book` (the composite path in the same reduced precision on the clean
// inputs), each result's bound is `tolerance` or 1.25 times the book's own
// error on it, whichever is larger: in bfloat16 and float16 the products
// round as the BLAS kernels LibTorch picks for this CPU do, the book's ops'
// and ours alike.
void expect_same_outputs_and_grads(const std::vector<torch::Tensor>& got,
                                   const std::vector<torch::Tensor>& want, double tolerance,
                                   const std::string& what,
                                   const std::vector<torch::Tensor>& book = {}) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_TRUE(book.empty() || book.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto name = what + (i == 0 ? " output" : " gradient " + std::to_string(i));
    expect_finite(got[i], name);
    const double book_error = book.empty() ? 0.0 : max_rel_error(book[i], want[i]);
    EXPECT_LT(max_rel_error(got[i], want[i]), std::max(tolerance, 1.25 * book_error))
        << name << " (the composite path on clean inputs: " << book_error << ")";
  }
}

bool reduced_precision(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 || dtype == torch::kHalf;
}

// Dot-product scores that overflow to ±inf (and inf - inf = NaN) in masked
// positions; with `m` > 8 every vector lane mixes valid and masked keys. The
// reference is the composite path in double on keys zeroed where masked.
void check_dot_product_numerics(const torch::Device& device) {
  torch::manual_seed(33);
  const int64_t B = 3, n = 4, m = 11, d = 6;
  const auto lens = torch::tensor({0, 4, 11});
  const auto q = torch::randn({B, n, d}, torch::kDouble),
             v = torch::randn({B, m, 2}, torch::kDouble);
  const auto G = torch::randn({B, n, 2}, torch::kDouble);
  auto attend = [&](AttentionBackend path) {
    return
        [&lens, path](const torch::Tensor& qq, const torch::Tensor& kk, const torch::Tensor& vv) {
          return std::get<0>(d2l::functional::dot_product_attention(
              qq, kk, vv,
              d2l::functional::DotProductAttentionFuncOptions()
                  .valid_lens(lens.to(qq.device()))
                  .dropout(0)
                  .training(false)
                  .backend(path)));
        };
  };
  for (const auto& c : kDtypeCases) {
    if (c.dtype == torch::kHalf && device.is_cpu()) continue;  // no CPU float16 bmm
    // Large enough that q . k overflows in this dtype.
    const double hostile = c.dtype == torch::kDouble ? 1e308 : c.dtype == torch::kHalf ? 6e4 : 3e38;
    const auto [keys, clean] = keys_with_hostile_masked_rows(B, m, d, lens, hostile);
    const auto want = output_and_grads(attend(AttentionBackend::kComposite), {q, clean, v}, {}, G);
    auto cast = [&](const torch::Tensor& t) { return t.to(device, c.dtype); };
    const auto book = reduced_precision(c.dtype)
                          ? output_and_grads(attend(AttentionBackend::kComposite),
                                             {cast(q), cast(clean), cast(v)}, {}, G)
                          : std::vector<torch::Tensor>();
    for (AttentionBackend path :
         {AttentionBackend::kComposite, AttentionBackend::kFused, AttentionBackend::kAuto}) {
      if (path == AttentionBackend::kFused && !device.is_cpu()) continue;
      const auto what =
          describe(fmt::format("dot_product_attention path={}", static_cast<int>(path)), c, device);
      const auto got = output_and_grads(attend(path), {cast(q), cast(keys), cast(v)}, {}, G);
      expect_same_outputs_and_grads(got, want, c.tolerance, what, book);
    }
  }
}

TEST(ReliabilityNumerics, DotProductIgnoresInfiniteMaskedScoresOnTheCpu) {
  check_dot_product_numerics(torch::kCPU);
}

TEST(ReliabilityNumerics, DotProductIgnoresInfiniteMaskedScoresOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_dot_product_numerics(torch::kCUDA);
}

// Additive scores are bounded by sum |w_v|, so hostile keys (±1e30, tanh
// saturated) must leave outputs and every gradient, W_k's included, as if the
// masked keys were zero.
void check_additive_numerics(const torch::Device& device) {
  torch::manual_seed(34);
  const int64_t B = 3, n = 4, m = 11, d = 5;
  const auto lens = torch::tensor({0, 4, 11});
  const auto q = torch::randn({B, n, 6}, torch::kDouble),
             v = torch::randn({B, m, 2}, torch::kDouble);
  const auto G = torch::randn({B, n, 2}, torch::kDouble);
  for (const auto& c : kDtypeCases) {
    if (c.dtype == torch::kHalf && device.is_cpu()) continue;
    const double hostile = c.dtype == torch::kHalf ? 6e4 : 1e30;
    const auto [keys, clean] = keys_with_hostile_masked_rows(B, m, d, lens, hostile);
    for (AttentionBackend path :
         {AttentionBackend::kComposite, AttentionBackend::kFused, AttentionBackend::kAuto}) {
      if (path == AttentionBackend::kFused && !device.is_cpu()) continue;
      const auto what =
          describe(fmt::format("AdditiveAttention path={}", static_cast<int>(path)), c, device);
      torch::manual_seed(35);
      d2l::AdditiveAttention attention(d2l::AdditiveAttentionOptions(d, 6, 7).backend(path));
      torch::manual_seed(35);
      d2l::AdditiveAttention reference(
          d2l::AdditiveAttentionOptions(d, 6, 7).backend(AttentionBackend::kComposite));
      attention->to(device, c.dtype);
      reference->to(torch::kDouble);
      auto cast = [&](const torch::Tensor& t) { return t.to(device, c.dtype); };
      const auto got =
          output_and_grads([&](const auto& qq, const auto& kk,
                               const auto& vv) { return attention(qq, kk, vv, lens.to(device)); },
                           {cast(q), cast(keys), cast(v)}, attention->parameters(), G);
      const auto want =
          output_and_grads([&](const auto& qq, const auto& kk,
                               const auto& vv) { return reference(qq, kk, vv, lens); },
                           {q, clean, v}, reference->parameters(), G);
      std::vector<torch::Tensor> book;  // the composite path in c.dtype on the clean keys
      if (reduced_precision(c.dtype)) {
        torch::manual_seed(35);
        d2l::AdditiveAttention composite(
            d2l::AdditiveAttentionOptions(d, 6, 7).backend(AttentionBackend::kComposite));
        composite->to(device, c.dtype);
        book =
            output_and_grads([&](const auto& qq, const auto& kk,
                                 const auto& vv) { return composite(qq, kk, vv, lens.to(device)); },
                             {cast(q), cast(clean), cast(v)}, composite->parameters(), G);
      }
      expect_same_outputs_and_grads(got, want, c.tolerance, what, book);
      EXPECT_TRUE(attention->attention_weights.isfinite().all().item<bool>()) << what;
    }
  }
}

TEST(ReliabilityNumerics, AdditiveIgnoresHugeMaskedKeysOnTheCpu) {
  check_additive_numerics(torch::kCPU);
}

TEST(ReliabilityNumerics, AdditiveIgnoresHugeMaskedKeysOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_additive_numerics(torch::kCUDA);
}

// No valid position anywhere: all-zero weights and outputs, zero gradients.
void expect_all_zero(const std::vector<torch::Tensor>& results, const std::string& what) {
  for (size_t i = 0; i < results.size(); ++i) {
    expect_finite(results[i], what + " result " + std::to_string(i));
    EXPECT_TRUE(results[i].eq(0).all().item<bool>()) << what << " result " << i;
  }
}

TEST(ReliabilityNumerics, RowsWithNoValidPositionGiveZerosAndZeroGradients) {
  torch::manual_seed(37);
  for (const auto& device : devices()) {
    const auto long_options = torch::TensorOptions(device).dtype(torch::kLong);
    const std::vector<torch::Tensor> no_valid = {torch::zeros({2}, long_options),
                                                 torch::zeros({2, 3}, long_options)};
    for (const auto& c : kDtypeCases) {
      const auto options = torch::TensorOptions(device).dtype(c.dtype);
      const auto q = torch::randn({2, 3, 4}, options), k = torch::randn({2, 5, 4}, options);
      const auto v = torch::randn({2, 5, 3}, options);
      const auto G = torch::randn({2, 3, 3}, torch::kDouble);
      for (AttentionBackend path :
           {AttentionBackend::kComposite, AttentionBackend::kFused, AttentionBackend::kAuto}) {
        if (path == AttentionBackend::kFused && !device.is_cpu()) continue;
        const auto what = describe(fmt::format("path={}", static_cast<int>(path)), c, device);
        d2l::DotProductAttention dot(d2l::DotProductAttentionOptions().backend(path));
        d2l::AdditiveAttention additive(d2l::AdditiveAttentionOptions(4, 4, 6).backend(path));
        additive->to(device, c.dtype);
        for (const auto& lens : no_valid) {
          if (c.dtype == torch::kHalf && device.is_cpu()) continue;  // no CPU float16 bmm
          expect_all_zero(output_and_grads([&](const auto& qq, const auto& kk,
                                               const auto& vv) { return dot(qq, kk, vv, lens); },
                                           {q, k, v}, {}, G),
                          "DotProductAttention " + what);
          expect_all_zero(
              output_and_grads([&](const auto& qq, const auto& kk,
                                   const auto& vv) { return additive(qq, kk, vv, lens); },
                               {q, k, v}, additive->parameters(), G),
              "AdditiveAttention " + what);
        }
      }
    }
  }
}

// Whole floating-point lengths beyond int64 mean "all valid" in the modules'
// fused and composite paths alike (fuzz_attention's first finding).
TEST(ReliabilityNumerics, FloatingLengthsBeyondInt64MeanAllValid) {
  torch::manual_seed(38);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 3});
  const auto huge = torch::tensor({1e20, 3.0}), plain = torch::tensor({5, 3});
  for (AttentionBackend path :
       {AttentionBackend::kComposite, AttentionBackend::kFused, AttentionBackend::kAuto}) {
    d2l::DotProductAttention dot(d2l::DotProductAttentionOptions().backend(path));
    d2l::AdditiveAttention additive(d2l::AdditiveAttentionOptions(4, 4, 6).backend(path));
    EXPECT_TRUE(torch::equal(dot(q, k, v, huge), dot(q, k, v, plain))) << static_cast<int>(path);
    EXPECT_TRUE(torch::equal(additive(q, k, v, huge), additive(q, k, v, plain)))
        << static_cast<int>(path);
  }
}

// Valid scores that are all -inf, +inf or NaN make a row's softmax NaN (as
// at::softmax does), but that NaN stays in the row's valid positions: masked
// positions of the weights and of the gradient are exactly 0 on every path,
// dtype and instruction set, also when the row's last vector is partly masked
// (fuzz_attention's second finding: m = 6, L = 1 leaked NaN into lanes 1-3).
TEST(ReliabilityNumerics, NonFiniteValidScoresNeverLeakIntoMaskedPositions) {
  torch::manual_seed(39);
  std::vector<d2l::CpuIsa> isas;
  for (auto isa : {d2l::CpuIsa::kDefault, d2l::CpuIsa::kAvx2, d2l::CpuIsa::kAvx512}) {
    if (d2l::cpu_isa_available(isa)) isas.push_back(isa);
  }
  const auto saved = d2l::cpu_isa();
  const std::vector<std::pair<std::string, MaskedSoftmax>> paths = {
      {"composite", masked_softmax_by(AttentionBackend::kComposite)},
      {"fused", masked_softmax_by(AttentionBackend::kFused)}};
  for (const auto isa : isas) {
    d2l::set_cpu_isa(isa);
    for (int64_t m : {2, 5, 6, 9, 13, 17, 33}) {
      const auto lens = torch::tensor({int64_t{1}, std::min<int64_t>(m - 1, 3)});
      const auto valid = valid_mask(lens.unsqueeze(1).expand({2, 3}), m);
      for (double special : {-kInf, kInf, kNaN}) {
        for (const auto& c : kDtypeCases) {
          auto X = torch::randn({2, 3, m}, torch::kDouble);
          X.masked_fill_(valid, special);
          X = X.to(c.dtype);
          const auto G = torch::randn({2, 3, m}, c.dtype);
          std::vector<torch::Tensor> outs, grads;
          for (const auto& [name, fn] : paths) {
            const auto what =
                fmt::format("{} isa={} m={} special={}", describe(name, c, torch::kCPU),
                            d2l::to_string(isa), m, special);
            const auto x = X.clone().requires_grad_();
            const auto y = fn(x, lens);
            y.backward(G);
            EXPECT_TRUE(y.detach().masked_select(valid.logical_not()).eq(0).all().item<bool>())
                << what << " weights";
            EXPECT_TRUE(x.grad().masked_select(valid.logical_not()).eq(0).all().item<bool>())
                << what << " gradient";
            outs.push_back(y.detach());
            grads.push_back(x.grad());
          }
          // The fused kernel puts NaN exactly where the composite path does.
          EXPECT_TRUE(torch::equal(outs[0].isnan(), outs[1].isnan())) << c10::toString(c.dtype);
          EXPECT_TRUE(torch::equal(grads[0].isnan(), grads[1].isnan())) << c10::toString(c.dtype);
        }
      }
    }
  }
  d2l::set_cpu_isa(saved);
}

}  // namespace
