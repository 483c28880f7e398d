// The projections split over threads (detail::linear) against
// functional::linear, and the modules built on them.

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>

#include <c10/core/InferenceMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "additive_attention_internal.h"
#include "checks.h"
#include "cpu/additive_attention_kernel.h"
#include "fused_helpers.h"
#include "linear.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::error_message;
using d2l::testing::masked_softmax_by;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;

using d2l::testing::DtypeTolerance;
using d2l::testing::expect_close;
using d2l::testing::Fused;
using d2l::testing::kFastPathDtypes;
using d2l::testing::runnable_isas;
using d2l::testing::value_and_grads;

}  // namespace

namespace {

// Sizes ATen's pool to `threads` and OpenBLAS's to 1 (where there is one) for
// a scope, then restores both.
class ThreadsForScope {
 public:
  explicit ThreadsForScope(int64_t threads) : saved_(d2l::cpu_threads()) {
    d2l::set_num_threads(threads);
  }
  ~ThreadsForScope() {
    d2l::set_num_threads(saved_.intra_op, std::max<int64_t>(saved_.openblas, 1));
  }
  ThreadsForScope(const ThreadsForScope&) = delete;
  ThreadsForScope& operator=(const ThreadsForScope&) = delete;

 private:
  d2l::CpuThreads saved_;
};

// Where OpenBLAS is LibTorch's BLAS (Debian's 1.13), d2l::set_num_threads(2)
// makes detail::linear split its products; with MKL (the wheels) it never does.
bool blas_is_openblas() { return d2l::cpu_threads().openblas > 0; }

}  // namespace

TEST(FusedKernels, LinearSplitsOverThreadsOnlyWhereOpenBlasRunsOnOne) {
  const auto x = torch::randn({8, 128, 64}), W = torch::randn({64, 64});
  {
    ThreadsForScope two(2);
    EXPECT_EQ(d2l::detail::linear_splits_over_threads(x, W), blas_is_openblas());
    EXPECT_EQ(d2l::detail::linear_splits_over_threads(x.to(torch::kDouble), W.to(torch::kDouble)),
              blas_is_openblas());
    // Small products, other dtypes, mismatched shapes: functional::linear.
    // (A seq2seq decoder step: 64 x 32 x 32 multiply-adds. The book's (64, 10,
    // 32) projections, 10 times that, are split.)
    EXPECT_FALSE(
        d2l::detail::linear_splits_over_threads(torch::randn({64, 1, 32}), torch::randn({32, 32})));
    EXPECT_EQ(
        d2l::detail::linear_splits_over_threads(torch::randn({64, 10, 32}), torch::randn({32, 32})),
        blas_is_openblas());
    EXPECT_FALSE(
        d2l::detail::linear_splits_over_threads(x.to(torch::kBFloat16), W.to(torch::kBFloat16)));
    EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, torch::randn({64, 65})));
    EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, W.to(torch::kDouble)));
    if (blas_is_openblas()) {
      // OpenBLAS's pool of 2 threads does the splitting itself.
      d2l::set_num_threads(2, 2);
      EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, W));
    }
  }
  ThreadsForScope one(1);
  EXPECT_FALSE(d2l::detail::linear_splits_over_threads(x, W));
  // A decoding step's few rows: the few-rows kernel, at 1 thread too; not
  // for small products.
  EXPECT_TRUE(
      d2l::detail::linear_splits_over_threads(torch::randn({1, 512}), torch::randn({1024, 512})));
  EXPECT_TRUE(d2l::detail::linear_splits_over_threads(torch::randn({7, 1, 512}),
                                                      torch::randn({1024, 512})));
  EXPECT_FALSE(d2l::detail::linear_splits_over_threads(torch::randn({8, 1, 512}),
                                                       torch::randn({1024, 512})));
  EXPECT_FALSE(
      d2l::detail::linear_splits_over_threads(torch::randn({1, 32}), torch::randn({32, 32})));
}

// Forward, every gradient and a double backward of detail::linear against
// functional::linear, split over 2 threads, in float and double, with and
// without a bias, on 2-D, 3-D and non-contiguous inputs; inputs untouched.
TEST(FusedKernels, LinearSplitOverThreadsMatchesFunctionalLinear) {
  ThreadsForScope two(2);
  torch::manual_seed(31);
  struct Case {
    std::vector<int64_t> x_sizes;
    int64_t out;
    bool bias, transposed;
  };
  const std::vector<Case> cases{{{6, 101, 64}, 48, false, false},
                                {{6, 101, 64}, 48, true, false},
                                {{700, 96}, 33, true, false},
                                {{5, 64, 130}, 40, false, true}};
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    // Split by rows, BLAS may sum the weight gradient's hundreds of products
    // in another order (2.2e-5 measured in float), and the second derivatives
    // multiply such sums (2.5e-4); double holds everything to 1e-12.
    const bool is_float = dtype == torch::kFloat;
    for (const auto& c : cases) {
      auto x = torch::randn(c.x_sizes, dtype);
      if (c.transposed) x = x.transpose(1, 2);  // (5, 130, 64), non-contiguous
      const int64_t in = x.size(-1);
      const auto W = torch::randn({c.out, in}, dtype);
      const auto b = c.bias ? torch::randn({c.out}, dtype) : torch::Tensor();
      const std::string what = fmt::format("{} x {} out {} bias {}", c10::toString(dtype),
                                           d2l::detail::shape_of(x), c.out, c.bias);
      ASSERT_EQ(d2l::detail::linear_splits_over_threads(x, W), blas_is_openblas()) << what;
      const auto x_before = x.clone(), W_before = W.clone();
      auto sizes = x.sizes().vec();
      sizes.back() = c.out;
      const auto G = torch::randn(sizes, dtype);
      auto run = [&](bool split) {
        auto xl = x.detach().clone().requires_grad_(), Wl = W.detach().clone().requires_grad_();
        auto bl = c.bias ? b.detach().clone().requires_grad_() : torch::Tensor();
        const auto y =
            split ? d2l::detail::linear(xl, Wl, bl) : torch::nn::functional::linear(xl, Wl, bl);
        std::vector<torch::Tensor> leaves{xl, Wl};
        if (c.bias) leaves.push_back(bl);
        // First gradients with a graph, then a second backward through them.
        const auto grads = torch::autograd::grad({(y * G).sum()}, leaves, {}, true, true);
        auto second = torch::zeros({}, dtype);
        for (const auto& g : grads) second = second + (g * g).sum();
        const auto grads2 = torch::autograd::grad({second}, leaves, {}, false, false, true);
        std::vector<torch::Tensor> result{y.detach()};
        for (const auto& g : grads) result.push_back(g.detach());
        for (const auto& g : grads2) result.push_back(g.defined() ? g : torch::zeros({}, dtype));
        // The plain backward (no graph): the split path's own kernels.
        auto xp = x.detach().clone().requires_grad_(), Wp = W.detach().clone().requires_grad_();
        auto bp = c.bias ? b.detach().clone().requires_grad_() : torch::Tensor();
        const auto yp =
            split ? d2l::detail::linear(xp, Wp, bp) : torch::nn::functional::linear(xp, Wp, bp);
        (yp * G).sum().backward();
        result.push_back(xp.grad());
        result.push_back(Wp.grad());
        if (c.bias) result.push_back(bp.grad());
        return result;
      };
      const auto split = run(true), plain = run(false);
      ASSERT_EQ(split.size(), plain.size()) << what;
      for (size_t i = 0; i < split.size(); ++i) {
        EXPECT_EQ(split[i].sizes(), plain[i].sizes()) << what << " result " << i;
        const double tol = !is_float ? 1e-12 : i == 0 ? 1e-5 : 1e-3;
        EXPECT_LT(max_rel_error(split[i], plain[i]), tol) << what << " result " << i;
      }
      EXPECT_TRUE(torch::equal(x, x_before)) << what;
      EXPECT_TRUE(torch::equal(W, W_before)) << what;
    }
  }
  // Bad shapes keep functional::linear's own error.
  EXPECT_THROW(d2l::detail::linear(torch::randn({4, 300, 64}), torch::randn({64, 63})), c10::Error);
}

// The modules whose projections split: the same outputs and gradients at 2
// threads (OpenBLAS at 1) as at 1 thread.
TEST(FusedKernels, ModulesWithSplitProjectionsMatchOneThread) {
  torch::manual_seed(32);
  const int64_t B = 4, n = 96, m = 80, d = 64;
  const auto q = torch::randn({B, n, d}), k = torch::randn({B, m, d}), v = torch::randn({B, m, d});
  const auto lens = torch::randint(0, m + 1, {B});
  const auto G = torch::randn({B, n, d});
  d2l::AdditiveAttention additive(d2l::AdditiveAttentionOptions(d, d, 64));
  d2l::MultiHeadAttention mha(d2l::MultiHeadAttentionOptions(d, d, d, 64, 4).bias(true));
  additive->eval();
  mha->eval();
  auto run = [&](int64_t threads) {
    ThreadsForScope scope(threads);
    if (threads > 1) {
      EXPECT_EQ(d2l::detail::linear_splits_over_threads(q, additive->W_q->weight),
                blas_is_openblas());
    }
    std::vector<torch::Tensor> result;
    for (auto& params : {additive->parameters(), mha->parameters()}) {
      for (auto p : params) p.mutable_grad().reset();
    }
    auto run_one = [&](const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
                       const std::vector<torch::Tensor>& params) {
      auto out = value_and_grads(f, {q, k, v}, G);
      for (const auto& p : params) out.push_back(p.grad().clone());
      result.insert(result.end(), out.begin(), out.end());
    };
    run_one([&](const auto& in) { return additive(in[0], in[1], in[2], lens); },
            additive->parameters());
    run_one([&](const auto& in) { return mha(in[0], in[1], in[2], lens); }, mha->parameters());
    return result;
  };
  const auto one = run(1), two = run(2);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_LT(max_rel_error(two[i], one[i]), 1e-5) << "result " << i;
  }
}

// In float and double without dropout, AdditiveAttention is one autograd node
// (projections and kernel), whose inputs are the module's leaves themselves;
// it returns the gradients asked for, and only those, with the composite
// path's values, also where the projections split over 2 threads.
TEST(FusedKernels, AdditiveIsOneAutogradNodeGivingTheGradientsAsked) {
  torch::manual_seed(19);
  for (const int64_t threads : {1, 2}) {
    ThreadsForScope scope(threads);
    // (B n) q h = 4·96·32·64: the products split at 2 threads (OpenBLAS at 1).
    const int64_t B = 4, n = 96, m = 70, h = 64;
    for (const bool freeze : {false, true}) {
      const auto what = fmt::format("threads {} freeze {}", threads, freeze);
      std::vector<torch::Tensor> grads[2];
      for (const AttentionBackend path : {AttentionBackend::kFused, AttentionBackend::kComposite}) {
        torch::manual_seed(20);
        auto q = torch::randn({B, n, 32}).requires_grad_(), k = torch::randn({B, m, 24});
        auto v = torch::randn({B, m, 5}).requires_grad_(!freeze);
        auto W_q = (torch::randn({h, 32}) * 0.3).requires_grad_(!freeze);
        auto W_k = (torch::randn({h, 24}) * 0.3).requires_grad_();
        auto w_v = torch::randn({1, h}).requires_grad_();
        const auto lens = torch::randint(0, m + 1, {B, n});
        auto [out, weights] = d2l::functional::additive_attention(
            q, k, v,
            d2l::functional::AdditiveAttentionFuncOptions(W_q, W_k, w_v)
                .valid_lens(lens)
                .dropout(0.0)
                .training(false)
                .backend(path));
        if (path == AttentionBackend::kFused) {
          const auto& node = out.grad_fn();
          ASSERT_TRUE(node) << what;
          EXPECT_THAT(node->name(), HasSubstr("AdditiveProjectedFunction")) << what;
          EXPECT_EQ(weights.grad_fn(), node) << what;
          for (const auto& edge : node->next_edges()) {
            if (edge.function) EXPECT_THAT(edge.function->name(), HasSubstr("AccumulateGrad"));
          }
        }
        (out.sum() + (weights * weights).sum()).backward();
        EXPECT_FALSE(k.grad().defined()) << what;
        for (const auto& t : {q, v, W_q, W_k, w_v}) {
          EXPECT_EQ(t.grad().defined(), t.requires_grad()) << what;
          if (t.grad().defined())
            grads[path == AttentionBackend::kFused ? 0 : 1].push_back(t.grad());
        }
      }
      ASSERT_EQ(grads[0].size(), grads[1].size()) << what;
      for (size_t i = 0; i < grads[0].size(); ++i) {
        EXPECT_LT(max_rel_error(grads[0][i], grads[1][i]), 2e-4) << what << " gradient " << i;
      }
    }
  }
}

// Products of fewer than cpu::kFewRows rows (a decoding step) run on the
// few-rows kernel at any number of threads, with any BLAS, at every
// instruction set: against functional::linear in double, in float and
// double, with and without a bias, rows 1 to 7, K with and without a tail
// past whole vectors, N not a multiple of the kernel's 4 rows of W nor of a
// thread's slice; gradients through it as functional::linear's; inputs
// untouched.
class FewRowsLinear : public Fused {};

TEST_P(FewRowsLinear, MatchesFunctionalLinear) {
  torch::manual_seed(7);
  for (const int64_t threads : {1, 2}) {
    ThreadsForScope scope(threads);
    for (const auto dtype : {torch::kFloat, torch::kDouble}) {
      for (const auto [K, N] : {std::pair<int64_t, int64_t>{512, 1030}, {131, 2003}}) {
        for (const int64_t rows : {1, 2, 3, 7}) {
          for (const bool bias : {false, true}) {
            const auto x = torch::randn({rows, 1, K}, dtype);
            const auto W = torch::randn({N, K}, dtype);
            const auto b = bias ? torch::randn({N}, dtype) : torch::Tensor();
            const std::string what = fmt::format("{} threads {} rows {} K {} N {} bias {}",
                                                 c10::toString(dtype), threads, rows, K, N, bias);
            ASSERT_TRUE(d2l::detail::linear_splits_over_threads(x, W)) << what;
            const auto x_before = x.clone(), W_before = W.clone();
            const auto y = d2l::detail::linear(x, W, b);
            const auto expected =
                torch::nn::functional::linear(x.to(torch::kDouble), W.to(torch::kDouble),
                                              bias ? b.to(torch::kDouble) : torch::Tensor());
            EXPECT_EQ(y.sizes(), expected.sizes()) << what;
            // In float, within a few times functional::linear's own error
            // (sums of 512 products in another order).
            const double reference_error =
                max_rel_error(torch::nn::functional::linear(x, W, b).to(torch::kDouble), expected);
            EXPECT_LT(max_rel_error(y.to(torch::kDouble), expected),
                      dtype == torch::kFloat ? 4 * reference_error + 1e-7 : 1e-12)
                << what << " (functional::linear's error " << reference_error << ")";
            EXPECT_TRUE(torch::equal(x, x_before)) << what;
            EXPECT_TRUE(torch::equal(W, W_before)) << what;
          }
        }
      }
    }
  }
  // Gradients through the kernel's forward.
  ThreadsForScope two(2);
  const auto x = torch::randn({3, 512}, torch::kDouble),
             W = torch::randn({700, 512}, torch::kDouble);
  const auto b = torch::randn({700}, torch::kDouble), G = torch::randn({3, 700}, torch::kDouble);
  const auto ours = value_and_grads(
      [](const std::vector<torch::Tensor>& in) { return d2l::detail::linear(in[0], in[1], in[2]); },
      {x, W, b}, G);
  const auto plain = value_and_grads(
      [](const std::vector<torch::Tensor>& in) {
        return torch::nn::functional::linear(in[0], in[1], in[2]);
      },
      {x, W, b}, G);
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_LT(max_rel_error(ours[i], plain[i]), 1e-12) << i;
}

INSTANTIATE_TEST_SUITE_P(Isa, FewRowsLinear, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

// linear_into (linear.h), the fused Transformer passes' products on arrays:
// small float weights on the packed kernel and double on the few-rows kernel,
// on the calling thread for small products at any number of rows, BLAS or
// the split kernel past 2^18 multiply-adds; at every instruction set,
// against functional::linear in double. A small product's row has the bits
// it has among other rows.
class LinearInto : public Fused {};

template <typename T>
torch::Tensor linear_into_tensor(const torch::Tensor& x, const torch::Tensor& W,
                                 const torch::Tensor& b) {
  auto y = torch::empty({x.size(0), W.size(0)}, x.options());
  d2l::detail::linear_into<T>(y.data_ptr<T>(), x.data_ptr<T>(), x.size(0), W, b);
  return y;
}

TEST_P(LinearInto, MatchesFunctionalLinear) {
  torch::manual_seed(11);
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    for (const auto [K, N] :
         {std::pair<int64_t, int64_t>{32, 200}, {37, 35}, {16, 9}, {64, 17}, {256, 1024}}) {
      for (const int64_t rows : {1, 3, 4, 5, 9, 16, 17, 56}) {
        for (const bool bias : {false, true}) {
          const auto x = torch::randn({rows, K}, dtype);
          const auto W = torch::randn({N, K}, dtype);
          const auto b = bias ? torch::randn({N}, dtype) : torch::Tensor();
          const std::string what =
              fmt::format("{} rows {} K {} N {} bias {}", c10::toString(dtype), rows, K, N, bias);
          const auto y = dtype == torch::kFloat ? linear_into_tensor<float>(x, W, b)
                                                : linear_into_tensor<double>(x, W, b);
          const auto expected =
              torch::nn::functional::linear(x.to(torch::kDouble), W.to(torch::kDouble),
                                            bias ? b.to(torch::kDouble) : torch::Tensor());
          const double reference_error =
              max_rel_error(torch::nn::functional::linear(x, W, b).to(torch::kDouble), expected);
          // The DEFAULT build's vectors round the product and the sum apart
          // (no fused multiply-add), in one chain per output on the packed
          // kernel: up to twice the rounding of the fused builds.
          const double factor = GetParam() == d2l::CpuIsa::kDefault ? 8 : 4;
          EXPECT_LT(max_rel_error(y.to(torch::kDouble), expected),
                    dtype == torch::kFloat ? factor * reference_error + 1e-7 : 1e-12)
              << what << " (functional::linear's error " << reference_error << ")";
          if (rows >= 4 && rows * K * N < (int64_t{1} << 18)) {
            // Row 3 among copies of itself: the same bits.
            const auto copies = x[3].unsqueeze(0).expand({4, K}).contiguous();
            const auto alone = dtype == torch::kFloat ? linear_into_tensor<float>(copies, W, b)
                                                      : linear_into_tensor<double>(copies, W, b);
            EXPECT_TRUE(torch::equal(alone[0], y[3])) << what;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, LinearInto, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });
