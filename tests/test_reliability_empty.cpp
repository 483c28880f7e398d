// Reliability, empty sizes: every path of every op keeps the autograd graph
// for empty batches, zero queries and zero keys, as the composite path does.
// A training loop whose batch happens to be empty calls backward() and gets
// zero gradients of the right shapes, whatever path was chosen.

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <string>
#include <vector>

#include "checks.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;

struct EmptyCase {
  int64_t batch, queries, keys;
  int lens_dim;  // 0: no lengths, 1: (B), 2: (B, n)
};

std::string describe(const EmptyCase& c, AttentionBackend path, torch::Dtype dtype) {
  return fmt::format("B={} n={} m={} lens_dim={} path={} dtype={}", c.batch, c.queries, c.keys,
                     c.lens_dim, static_cast<int>(path), c10::toString(dtype));
}

// Every size zero in turn, with and without lengths; lengths above m too.
std::vector<EmptyCase> empty_cases() {
  std::vector<EmptyCase> cases;
  for (const auto& [b, n, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {0, 3, 4}, {2, 0, 4}, {2, 3, 0}, {0, 0, 0}}) {
    for (int lens_dim : {0, 1, 2}) cases.push_back({b, n, m, lens_dim});
  }
  return cases;
}

torch::Tensor lengths(const EmptyCase& c) {
  if (c.lens_dim == 0) return {};
  const auto shape =
      c.lens_dim == 1 ? std::vector<int64_t>{c.batch} : std::vector<int64_t>{c.batch, c.queries};
  // Above m as well as within it: both must give the same empty graph.
  return torch::full(shape, 2, torch::kLong);
}

std::vector<AttentionBackend> paths(bool sdpa) {
  std::vector<AttentionBackend> all = {AttentionBackend::kAuto, AttentionBackend::kComposite,
                                       AttentionBackend::kFused};
  if (sdpa && d2l::sdpa_available()) all.push_back(AttentionBackend::kSdpa);
  return all;
}

const std::vector<torch::Dtype> kEmptyDtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16,
                                           torch::kHalf};

// LibTorch 1.13 has no float16 matrix product on the CPU: the attention
// functions refuse float16 there, empty or not (test_reliability_layouts.cpp).
bool refused(torch::Dtype dtype) {
  return dtype == torch::kHalf && !d2l::detail::cpu_float16_matmul_available();
}

torch::Tensor leaf(std::vector<int64_t> shape, torch::Dtype dtype) {
  return torch::randn(shape, torch::kDouble).to(dtype).requires_grad_();
}

// `out` must be part of a graph reaching every leaf, and backward must leave
// each leaf a zero gradient of its own shape and dtype.
void expect_zero_gradients(const torch::Tensor& out, const std::vector<torch::Tensor>& leaves,
                           const std::vector<int64_t>& expected_shape, const std::string& what) {
  ASSERT_TRUE(out.defined()) << what;
  EXPECT_EQ(out.sizes().vec(), expected_shape) << what;
  ASSERT_TRUE(out.requires_grad()) << what << ": the result has no graph";
  ASSERT_NO_THROW(out.sum().backward()) << what;
  for (size_t i = 0; i < leaves.size(); ++i) {
    const auto& grad = leaves[i].grad();
    ASSERT_TRUE(grad.defined()) << what << ": leaf " << i << " got no gradient";
    EXPECT_EQ(grad.sizes(), leaves[i].sizes()) << what << ": leaf " << i;
    EXPECT_EQ(grad.scalar_type(), leaves[i].scalar_type()) << what << ": leaf " << i;
    EXPECT_EQ(grad.count_nonzero().item<int64_t>(), 0) << what << ": leaf " << i;
  }
}

TEST(ReliabilityEmpty, MaskedSoftmaxKeepsTheGraphOnEveryPath) {
  for (const auto& c : empty_cases()) {
    if (c.lens_dim == 0) continue;  // without lengths it is plain softmax
    for (AttentionBackend path : paths(false)) {
      for (auto dtype : kEmptyDtypes) {
        const auto X = leaf({c.batch, c.queries, c.keys}, dtype);
        const auto Y = d2l::masked_softmax(X, lengths(c), path);
        expect_zero_gradients(Y, {X}, {c.batch, c.queries, c.keys}, describe(c, path, dtype));
      }
    }
  }
}

TEST(ReliabilityEmpty, DotProductAttentionKeepsTheGraphOnEveryPath) {
  const int64_t d = 5, v = 3;
  for (const auto& c : empty_cases()) {
    for (AttentionBackend path : paths(true)) {
      for (auto dtype : kEmptyDtypes) {
        if (refused(dtype)) continue;
        for (bool training : {false, true}) {
          const auto q = leaf({c.batch, c.queries, d}, dtype);
          const auto k = leaf({c.batch, c.keys, d}, dtype);
          const auto val = leaf({c.batch, c.keys, v}, dtype);
          const auto [out, weights] = d2l::functional::dot_product_attention(
              q, k, val,
              d2l::functional::DotProductAttentionFuncOptions()
                  .valid_lens(lengths(c))
                  .dropout(0.5)
                  .training(training)
                  .backend(path)
                  .need_weights(false));
          expect_zero_gradients(out, {q, k, val}, {c.batch, c.queries, v},
                                describe(c, path, dtype) + (training ? " training" : ""));
        }
      }
    }
  }
}

TEST(ReliabilityEmpty, DotProductAttentionWeightsKeepTheGraph) {
  for (const auto& c : empty_cases()) {
    for (AttentionBackend path :
         {AttentionBackend::kAuto, AttentionBackend::kComposite, AttentionBackend::kFused}) {
      const auto q = leaf({c.batch, c.queries, 4}, torch::kFloat);
      const auto k = leaf({c.batch, c.keys, 4}, torch::kFloat);
      const auto val = leaf({c.batch, c.keys, 2}, torch::kFloat);
      const auto [out, weights] =
          d2l::functional::dot_product_attention(q, k, val,
                                                 d2l::functional::DotProductAttentionFuncOptions()
                                                     .valid_lens(lengths(c))
                                                     .dropout(0.0)
                                                     .training(false)
                                                     .backend(path)
                                                     .need_weights(true));
      expect_zero_gradients(weights, {q, k}, {c.batch, c.queries, c.keys},
                            describe(c, path, torch::kFloat));
    }
  }
}

TEST(ReliabilityEmpty, AdditiveAttentionKeepsTheGraphOnEveryPath) {
  const int64_t dq = 4, dk = 3, h = 6, v = 2;
  for (const auto& c : empty_cases()) {
    for (AttentionBackend path : paths(false)) {
      for (auto dtype : kEmptyDtypes) {
        if (refused(dtype)) continue;
        for (bool need_weights : {false, true}) {
          const auto q = leaf({c.batch, c.queries, dq}, dtype);
          const auto k = leaf({c.batch, c.keys, dk}, dtype);
          const auto val = leaf({c.batch, c.keys, v}, dtype);
          const auto W_q = leaf({h, dq}, dtype), W_k = leaf({h, dk}, dtype);
          const auto w_v = leaf({1, h}, dtype);
          const auto [out, weights] = d2l::functional::additive_attention(
              q, k, val,
              d2l::functional::AdditiveAttentionFuncOptions(W_q, W_k, w_v)
                  .valid_lens(lengths(c))
                  .dropout(0.0)
                  .training(false)
                  .backend(path)
                  .need_weights(need_weights));
          const auto what = describe(c, path, dtype);
          if (need_weights) {
            expect_zero_gradients(weights, {q, k, W_q, W_k, w_v}, {c.batch, c.queries, c.keys},
                                  what + " weights");
          } else {
            expect_zero_gradients(out, {q, k, val, W_q, W_k, w_v}, {c.batch, c.queries, v}, what);
          }
        }
      }
    }
  }
}

TEST(ReliabilityEmpty, AdditiveScoresKeepTheGraphOnEveryPath) {
  const int64_t h = 6;
  for (const auto& c : empty_cases()) {
    if (c.lens_dim != 0) continue;
    for (AttentionBackend path : paths(false)) {
      for (auto dtype : kEmptyDtypes) {
        const auto pq = leaf({c.batch, c.queries, h}, dtype);
        const auto pk = leaf({c.batch, c.keys, h}, dtype);
        const auto w_v = leaf({1, h}, dtype);
        const auto scores = d2l::functional::additive_scores(
            pq, pk, w_v, d2l::functional::AdditiveScoresFuncOptions().backend(path));
        expect_zero_gradients(scores, {pq, pk, w_v}, {c.batch, c.queries, c.keys},
                              describe(c, path, dtype));
      }
    }
  }
}

// Gradients of `out.sum()` with respect to `leaves`, zeroed beforehand.
std::vector<torch::Tensor> gradients(const torch::Tensor& out,
                                     const std::vector<torch::Tensor>& leaves) {
  for (const auto& leaf : leaves) leaf.mutable_grad() = torch::Tensor();
  out.sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& leaf : leaves) grads.push_back(leaf.grad());
  return grads;
}

TEST(ReliabilityEmpty, AdditiveAttentionModuleGivesZeroParameterGradients) {
  for (const auto& c : empty_cases()) {
    for (AttentionBackend path : paths(false)) {
      torch::manual_seed(1);
      d2l::AdditiveAttention additive(d2l::AdditiveAttentionOptions(3, 4, 6).backend(path));
      const auto q = leaf({c.batch, c.queries, 4}, torch::kFloat);
      const auto k = leaf({c.batch, c.keys, 3}, torch::kFloat);
      const auto val = leaf({c.batch, c.keys, 2}, torch::kFloat);
      const auto out = additive(q, k, val, lengths(c));
      auto leaves = additive->parameters();
      leaves.insert(leaves.end(), {q, k, val});
      expect_zero_gradients(out, leaves, {c.batch, c.queries, 2}, describe(c, path, torch::kFloat));
    }
  }
}

// With biases, an output over zero keys is b_o, not zero: every path must
// give the composite path's gradients (b_o's among them), in train mode with
// dropout. AttentionBackend::kSdpa records no weights, so none records them.
TEST(ReliabilityEmpty, MultiHeadAttentionGivesTheCompositeGradients) {
  for (const auto& c : empty_cases()) {
    std::vector<torch::Tensor> expected;
    for (AttentionBackend path : paths(true)) {
      const auto what = describe(c, path, torch::kFloat);
      torch::manual_seed(1);
      d2l::MultiHeadAttention mha(d2l::MultiHeadAttentionOptions(6, 6, 6, 6, 2)
                                      .bias(true)
                                      .dropout(0.5)
                                      .backend(path)
                                      .record_attention_weights(false));
      mha->train();
      const auto q = leaf({c.batch, c.queries, 6}, torch::kFloat);
      const auto k = leaf({c.batch, c.keys, 6}, torch::kFloat);
      const auto out = mha(q, k, k, lengths(c));
      ASSERT_EQ(out.sizes().vec(), (std::vector<int64_t>{c.batch, c.queries, 6})) << what;
      ASSERT_TRUE(out.requires_grad()) << what;
      auto leaves = mha->parameters();
      leaves.insert(leaves.end(), {q, k});
      const auto grads = gradients(out, leaves);
      if (expected.empty()) {
        torch::manual_seed(1);
        d2l::MultiHeadAttention oracle(d2l::MultiHeadAttentionOptions(6, 6, 6, 6, 2)
                                           .bias(true)
                                           .dropout(0.5)
                                           .backend(AttentionBackend::kComposite));
        oracle->train();
        auto oracle_leaves = oracle->parameters();
        oracle_leaves.insert(oracle_leaves.end(), {q, k});
        expected = gradients(oracle(q, k, k, lengths(c)), oracle_leaves);
      }
      for (size_t i = 0; i < grads.size(); ++i) {
        ASSERT_TRUE(grads[i].defined()) << what << ": leaf " << i;
        EXPECT_TRUE(torch::equal(grads[i], expected[i])) << what << ": leaf " << i;
      }
    }
  }
}

}  // namespace
