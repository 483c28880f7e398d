// Additive, dot-product and multi-head attention in training, with dropout,
// on every path that draws it (composite; fused softmax on the CPU at every
// instruction set; SDPA on 2.1+). With identity values the output is
// dropout(weights) itself: each entry is 0 or w / (1 - p) of the book's
// weights, which gives the drawn mask back, and the gradients must be those
// of the composite formula with that mask.

#include <d2l/additive_attention.h>
#include <d2l/dot_product_attention.h>
#include <d2l/multi_head_attention.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fused_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::testing::max_rel_error;

constexpr double kTrainingDropoutP = 0.3;

// The book's masked softmax of Q Kᵀ / √d, differentiable, in double; `lens`
// (B, n), each at least 1.
torch::Tensor dropout_book_weights(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& lens) {
  const auto scores = torch::bmm(q, k.transpose(1, 2)) / std::sqrt(double(q.size(2)));
  const auto keys = torch::arange(k.size(1), lens.options()).view({1, 1, -1});
  const auto masked_out = keys >= lens.unsqueeze(-1);
  return torch::softmax(scores.masked_fill(masked_out, -std::numeric_limits<double>::infinity()),
                        -1);
}

struct DroppedWeights {
  torch::Tensor kept;  // (B, n, m) bool: the drawn mask, read back
  std::string problem;
};

// Checks that `dropped` is 0 or w / (1 - p) entry by entry for the book's
// weights `w` (double), returns the kept entries; `tol` relative.
DroppedWeights read_back_dropout_mask(const torch::Tensor& dropped, const torch::Tensor& w,
                                      double tol) {
  const auto out = dropped.detach().to(torch::kDouble);
  const auto kept = out != 0;
  const auto expected = w.detach() * kept / (1 - kTrainingDropoutP);
  const double error = max_rel_error(out, expected);
  DroppedWeights result{kept, ""};
  if (!(error < tol)) {
    result.problem =
        fmt::format("not 0 or w/(1-p): max relative error {} (tolerance {})", error, tol);
  }
  // Only valid entries (w > 0) may be kept, and p = 0.3 keeps about 70% of them.
  const auto valid = w.detach() > 0;
  const double valid_count = valid.sum().item<double>();
  const double kept_count = kept.logical_and(valid).sum().item<double>();
  if (kept.logical_and(valid.logical_not()).any().item<bool>()) {
    result.problem += " masked entry kept;";
  }
  if (kept_count < 0.5 * valid_count || kept_count > 0.9 * valid_count) {
    result.problem += fmt::format(" kept {} of {} valid entries at p = {};", kept_count,
                                  valid_count, kTrainingDropoutP);
  }
  return result;
}

double dropout_tolerance(torch::Dtype dtype) { return dtype == torch::kDouble ? 1e-12 : 2e-5; }

// Dot-product attention of random q, k and identity values, in training.
void check_dot_product_dropout(AttentionBackend path, torch::Dtype dtype, bool need_weights,
                               const std::string& what) {
  torch::manual_seed(41);
  const int64_t B = 3, n = 5, m = 19, d = 6;
  const auto q64 = torch::randn({B, n, d}, torch::kDouble);
  const auto k64 = torch::randn({B, m, d}, torch::kDouble);
  const auto lens = torch::randint(1, m + 1, {B, n});
  const auto G = torch::randn({B, n, m}, torch::kDouble);
  auto q = q64.to(dtype).requires_grad_(), k = k64.to(dtype).requires_grad_();
  auto v = torch::eye(m, torch::kDouble).expand({B, m, m}).to(dtype).contiguous().requires_grad_();
  const auto [out, weights] =
      d2l::functional::dot_product_attention(q, k, v,
                                             d2l::functional::DotProductAttentionFuncOptions()
                                                 .valid_lens(lens)
                                                 .dropout(kTrainingDropoutP)
                                                 .training(true)
                                                 .backend(path)
                                                 .need_weights(need_weights));
  (out * G.to(dtype)).sum().backward();

  const auto qd = q.detach().to(torch::kDouble).requires_grad_();
  const auto kd = k.detach().to(torch::kDouble).requires_grad_();
  const auto vd = v.detach().to(torch::kDouble).requires_grad_();
  const auto w = dropout_book_weights(qd, kd, lens);
  if (need_weights) {
    EXPECT_LT(max_rel_error(weights, w), dropout_tolerance(dtype))
        << what << ": weights before dropout";
  }
  const auto mask = read_back_dropout_mask(out, w, dropout_tolerance(dtype));
  EXPECT_EQ(mask.problem, "") << what;
  // The composite formula with the drawn mask.
  const auto expected = torch::bmm(w * mask.kept / (1 - kTrainingDropoutP), vd);
  (expected * G).sum().backward();
  EXPECT_LT(max_rel_error(q.grad(), qd.grad()), dropout_tolerance(dtype)) << what << ": dQ";
  EXPECT_LT(max_rel_error(k.grad(), kd.grad()), dropout_tolerance(dtype)) << what << ": dK";
  EXPECT_LT(max_rel_error(v.grad(), vd.grad()), dropout_tolerance(dtype)) << what << ": dV";
}

// Runs once per instruction set (the fused softmax's kernels).
using TrainingDropout = d2l::testing::Fused;

TEST_P(TrainingDropout, DotProductOutputIsTheScaledMaskedWeightsAndGradientsFollow) {
  for (auto path :
       {AttentionBackend::kComposite, AttentionBackend::kFused, AttentionBackend::kAuto}) {
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      for (bool need_weights : {true, false}) {
        check_dot_product_dropout(path, dtype, need_weights,
                                  fmt::format("{} {} weights {}", d2l::to_string(path),
                                              c10::toString(dtype), need_weights));
      }
    }
  }
}

// Multi-head attention with W_v = W_o = I and values whose head h is the
// identity: the output's head h is head h's dropout(weights).
void check_multi_head_dropout(AttentionBackend path, torch::Dtype dtype, const std::string& what) {
  torch::manual_seed(43);
  const int64_t B = 2, n = 3, m = 5, heads = 2, h = heads * m;
  d2l::MultiHeadAttention mha(
      d2l::MultiHeadAttentionOptions(6, 4, h, h, heads).dropout(kTrainingDropoutP).backend(path));
  mha->to(dtype);
  mha->train();
  {
    torch::NoGradGuard no_grad;
    mha->W_v->weight.copy_(torch::eye(h));
    mha->W_o->weight.copy_(torch::eye(h));
  }
  auto queries = torch::randn({B, n, 4}, dtype).requires_grad_();
  auto keys = torch::randn({B, m, 6}, dtype).requires_grad_();
  const auto values =
      torch::eye(m, dtype).repeat({1, heads}).unsqueeze(0).expand({B, m, h}).contiguous();
  const auto lens = torch::tensor({{1, 5, 3}, {4, 2, 5}});
  const auto G = torch::randn({B, n, h}, torch::kDouble);
  const auto out = mha(queries, keys, values, lens);
  (out * G.to(dtype)).sum().backward();

  const auto qd = queries.detach().to(torch::kDouble).requires_grad_();
  const auto kd = keys.detach().to(torch::kDouble).requires_grad_();
  const auto Wq = mha->W_q->weight.detach().to(torch::kDouble).requires_grad_();
  const auto Wk = mha->W_k->weight.detach().to(torch::kDouble).requires_grad_();
  const auto w = dropout_book_weights(d2l::transpose_qkv(torch::matmul(qd, Wq.t()), heads),
                                      d2l::transpose_qkv(torch::matmul(kd, Wk.t()), heads),
                                      lens.repeat_interleave(heads, 0));
  EXPECT_LT(max_rel_error(mha->attention->attention_weights, w), dropout_tolerance(dtype)) << what;
  // (B, n, heads * m) -> (B * heads, n, m), head-major as transpose_qkv.
  const auto per_head = d2l::transpose_qkv(out, heads);
  const auto mask = read_back_dropout_mask(per_head, w, dropout_tolerance(dtype));
  EXPECT_EQ(mask.problem, "") << what;
  const auto expected = d2l::transpose_output(w * mask.kept / (1 - kTrainingDropoutP), heads);
  (expected * G).sum().backward();
  EXPECT_LT(max_rel_error(queries.grad(), qd.grad()), dropout_tolerance(dtype))
      << what << ": dQueries";
  EXPECT_LT(max_rel_error(keys.grad(), kd.grad()), dropout_tolerance(dtype)) << what << ": dKeys";
  EXPECT_LT(max_rel_error(mha->W_q->weight.grad(), Wq.grad()), dropout_tolerance(dtype))
      << what << ": dW_q";
  EXPECT_LT(max_rel_error(mha->W_k->weight.grad(), Wk.grad()), dropout_tolerance(dtype))
      << what << ": dW_k";
}

TEST_P(TrainingDropout, MultiHeadOutputIsEachHeadsScaledMaskedWeights) {
  for (auto path : {AttentionBackend::kComposite, AttentionBackend::kFused}) {
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      check_multi_head_dropout(path, dtype,
                               fmt::format("{} {}", d2l::to_string(path), c10::toString(dtype)));
    }
  }
}

// Additive attention of random q, k and identity values, in training: the
// output is dropout(weights), whatever path runs (the fused kernels draw the
// mask in their own node).
void check_additive_dropout(AttentionBackend path, torch::Dtype dtype, const std::string& what) {
  torch::manual_seed(47);
  const int64_t B = 2, n = 4, m = 13, query_size = 5, key_size = 3, h = 7;
  const auto W_q64 = torch::randn({h, query_size}, torch::kDouble);
  const auto W_k64 = torch::randn({h, key_size}, torch::kDouble);
  const auto w_v64 = torch::randn({1, h}, torch::kDouble);
  const auto q64 = torch::randn({B, n, query_size}, torch::kDouble);
  const auto k64 = torch::randn({B, m, key_size}, torch::kDouble);
  const auto lens = torch::randint(1, m + 1, {B, n});
  const auto G = torch::randn({B, n, m}, torch::kDouble);
  auto q = q64.to(dtype).requires_grad_(), k = k64.to(dtype).requires_grad_();
  auto W_q = W_q64.to(dtype).requires_grad_(), W_k = W_k64.to(dtype).requires_grad_();
  auto w_v = w_v64.to(dtype).requires_grad_();
  const auto v = torch::eye(m, dtype).expand({B, m, m}).contiguous();
  const auto [out, weights] = d2l::functional::additive_attention(
      q, k, v,
      d2l::functional::AdditiveAttentionFuncOptions(W_q, W_k, w_v)
          .valid_lens(lens)
          .dropout(kTrainingDropoutP)
          .training(true)
          .backend(path));
  (out * G.to(dtype)).sum().backward();

  // The book's weights, in double, differentiable.
  const auto qd = q.detach().to(torch::kDouble).requires_grad_();
  const auto kd = k.detach().to(torch::kDouble).requires_grad_();
  const auto Wqd = W_q.detach().to(torch::kDouble).requires_grad_();
  const auto Wkd = W_k.detach().to(torch::kDouble).requires_grad_();
  const auto wvd = w_v.detach().to(torch::kDouble).requires_grad_();
  const auto features = torch::tanh(torch::matmul(qd, Wqd.t()).unsqueeze(2) +
                                    torch::matmul(kd, Wkd.t()).unsqueeze(1));
  const auto scores = torch::matmul(features, wvd.t()).squeeze(-1);  // (B, n, m)
  const auto masked_out = torch::arange(m).view({1, 1, -1}) >= lens.unsqueeze(-1);
  const auto w = torch::softmax(
      scores.masked_fill(masked_out, -std::numeric_limits<double>::infinity()), -1);
  EXPECT_LT(max_rel_error(weights, w), dropout_tolerance(dtype)) << what << ": weights";
  const auto mask = read_back_dropout_mask(out, w, dropout_tolerance(dtype));
  EXPECT_EQ(mask.problem, "") << what;
  ((w * mask.kept / (1 - kTrainingDropoutP)) * G).sum().backward();
  EXPECT_LT(max_rel_error(q.grad(), qd.grad()), dropout_tolerance(dtype)) << what << ": dQ";
  EXPECT_LT(max_rel_error(k.grad(), kd.grad()), dropout_tolerance(dtype)) << what << ": dK";
  EXPECT_LT(max_rel_error(W_q.grad(), Wqd.grad()), dropout_tolerance(dtype)) << what << ": dW_q";
  EXPECT_LT(max_rel_error(W_k.grad(), Wkd.grad()), dropout_tolerance(dtype)) << what << ": dW_k";
  EXPECT_LT(max_rel_error(w_v.grad(), wvd.grad()), dropout_tolerance(dtype)) << what << ": dw_v";
}

TEST_P(TrainingDropout, AdditiveOutputIsTheScaledMaskedWeightsAndGradientsFollow) {
  for (auto path :
       {AttentionBackend::kComposite, AttentionBackend::kFused, AttentionBackend::kAuto}) {
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      check_additive_dropout(path, dtype,
                             fmt::format("additive {} {}", d2l::to_string(path),
                                         c10::toString(dtype)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, TrainingDropout, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

// SDPA draws its own dropout (AttentionBackend::kSdpa); the mask reads back the same way.
TEST(TrainingDropoutSdpa, DotProductOutputIsTheScaledMaskedWeights) {
#if D2L_HAS_SDPA
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    check_dot_product_dropout(AttentionBackend::kSdpa, dtype, /*need_weights=*/false,
                              fmt::format("sdpa {}", c10::toString(dtype)));
  }
#else
  GTEST_SKIP() << "AttentionBackend::kSdpa needs LibTorch 2.1 (this is " << d2l::torch_version()
               << "): its training dropout is not checked";
#endif
}

}  // namespace
