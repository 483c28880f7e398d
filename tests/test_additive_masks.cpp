// AdditiveAttention with the one mask argument (AttentionMask): masks that
// are lengths run the fused kernels and give what the lengths give; others
// run the chunked or composite path and equal an oracle written from the
// definitions, forward and backward; bad masks are errors naming the
// argument; the masks reach the module through AnyModule.

#include <d2l/additive_attention.h>
#include <d2l/attention_mask.h>
#include <d2l/dot_product_attention.h>
#include <d2l/multi_head_attention.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::AttentionMask;
using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;
namespace F = d2l::functional;

constexpr int64_t kB = 3, kN = 4, kM = 6, kQ = 5, kK = 7, kH = 8, kV = 3;

struct Inputs {
  torch::Tensor q, k, v, W_q, W_k, w_v;
};

Inputs inputs(torch::Dtype dtype) {
  torch::manual_seed(11);
  const auto o = torch::TensorOptions().dtype(dtype);
  return {torch::randn({kB, kN, kQ}, o), torch::randn({kB, kM, kK}, o),
          torch::randn({kB, kM, kV}, o), torch::randn({kH, kQ}, o),
          torch::randn({kH, kK}, o),     torch::randn({1, kH}, o)};
}

// The book's additive scores, then a softmax over the keys `allowed` lets each
// query see (zero where none is), in double: output, weights and the
// gradients of q, k, v, W_q, W_k, w_v for `upstream`.
std::vector<torch::Tensor> oracle(const Inputs& in, const torch::Tensor& allowed,
                                  const torch::Tensor& upstream) {
  std::vector<torch::Tensor> x;
  for (const auto& t : {in.q, in.k, in.v, in.W_q, in.W_k, in.w_v}) {
    x.push_back(t.detach().to(torch::kDouble).requires_grad_());
  }
  const auto features = torch::tanh(torch::matmul(x[0], x[3].t()).unsqueeze(2) +
                                    torch::matmul(x[1], x[4].t()).unsqueeze(1));
  const auto scores = torch::matmul(features, x[5].t()).squeeze(-1);
  const auto exps = torch::where(allowed, torch::exp(scores - scores.detach().amax(-1, true)),
                                 torch::zeros_like(scores));
  const auto sums = exps.sum(-1, true);
  const auto weights = exps / torch::where(sums > 0, sums, torch::ones_like(sums));
  const auto out = torch::bmm(weights, x[2]);
  (out * upstream).sum().backward();
  std::vector<torch::Tensor> result{out.detach(), weights.detach()};
  for (const auto& t : x) result.push_back(t.grad());
  return result;
}

std::vector<torch::Tensor> ours(const Inputs& in, const AttentionMask& mask,
                                AttentionBackend backend, const torch::Tensor& upstream) {
  std::vector<torch::Tensor> x;
  for (const auto& t : {in.q, in.k, in.v, in.W_q, in.W_k, in.w_v}) {
    x.push_back(t.detach().clone().requires_grad_());
  }
  auto [out, weights] = F::additive_attention(
      x[0], x[1], x[2],
      F::AdditiveAttentionFuncOptions(x[3], x[4], x[5]).mask(mask).backend(backend));
  (out * upstream.to(out.scalar_type())).sum().backward();
  std::vector<torch::Tensor> result{out.detach(), weights.detach()};
  for (const auto& t : x) result.push_back(t.grad());
  return result;
}

// (B, n, m): true where query i of entry b may see key j, from the
// definitions in <d2l/attention_mask.h>.
torch::Tensor allowed_by_definition(const AttentionMask& mask) {
  auto allowed = torch::ones({kB, kN, kM}, torch::kBool);
  const auto j = torch::arange(kM).view({1, 1, kM});
  if (mask.valid_lens().defined()) {
    const auto& l = mask.valid_lens();
    allowed &= j < (l.dim() == 1 ? l.view({kB, 1, 1}) : l.unsqueeze(-1));
  }
  if (mask.key_padding_mask().defined()) allowed &= ~mask.key_padding_mask().unsqueeze(1);
  if (mask.is_causal()) allowed &= j <= torch::arange(kN).view({1, kN, 1}) + (kM - kN);
  if (mask.attn_mask().defined()) allowed &= ~mask.attn_mask();
  return allowed;
}

struct Case {
  std::string name;
  AttentionMask mask;
  bool lengths;  // whether the masks come to lengths (the fused kernels)
};

std::vector<Case> cases() {
  const auto prefix_kp = torch::arange(kM).view({1, kM}) >= torch::tensor({6, 2, 4}).view({kB, 1});
  auto holes_kp = torch::zeros({kB, kM}, torch::kBool);
  holes_kp.index_put_({0, 2}, true);
  holes_kp.index_put_({2, torch::indexing::Slice()}, true);  // entry 2 sees nothing
  auto holes_am = torch::zeros({kN, kM}, torch::kBool);
  holes_am.index_put_({1, 0}, true);
  return {
      {"lengths", AttentionMask(torch::tensor({2, 6, 0})), true},
      {"prefix_key_padding", AttentionMask().key_padding_mask(prefix_kp), true},
      {"causal", AttentionMask().is_causal(true), true},
      {"causal_and_lengths", AttentionMask(torch::tensor({5, 1, 6})).is_causal(true), true},
      {"key_padding_with_holes", AttentionMask().key_padding_mask(holes_kp), false},
      {"attn_mask_with_holes", AttentionMask(torch::tensor({6, 3, 4})).attn_mask(holes_am), false},
  };
}

TEST(AdditiveMasks, EveryMaskEqualsTheOracleForwardAndBackwardOnEveryBackend) {
  for (const auto& [dtype, tol] :
       {std::pair{torch::kFloat, 1e-4}, std::pair{torch::kDouble, 1e-10}}) {
    const auto in = inputs(dtype);
    torch::manual_seed(12);
    const auto upstream = torch::randn({kB, kN, kV}, torch::kDouble);
    for (const auto& c : cases()) {
      const auto want = oracle(in, allowed_by_definition(c.mask), upstream);
      for (auto backend :
           {AttentionBackend::kAuto, AttentionBackend::kFused, AttentionBackend::kComposite}) {
        const auto got = ours(in, c.mask, backend, upstream);
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_LT(max_rel_error(got[i].to(torch::kDouble), want[i]), tol)
              << c.name << " backend " << d2l::to_string(backend) << " result " << i << " "
              << dtype;
        }
      }
    }
  }
}

TEST(AdditiveMasks, MasksThatAreLengthsRunTheFusedKernelsAndOthersTheChunkedPath) {
  const auto in = inputs(torch::kFloat);
  for (const auto& c : cases()) {
    const auto options = F::AdditiveAttentionFuncOptions(in.W_q, in.W_k, in.w_v).mask(c.mask);
    const auto why = d2l::explain_path(in.q, in.k, in.v, options);
    if (c.lengths) {
      EXPECT_EQ(why.path, "fused_projections") << c.name << ": " << why.to_string();
      continue;
    }
    EXPECT_EQ(why.path, "chunked") << c.name;
    EXPECT_THAT(why.to_string(), HasSubstr("is not a prefix of keys in every row (the fused "
                                           "kernels mask by lengths"));
    const auto composite = d2l::explain_path(
        in.q, in.k, in.v,
        F::AdditiveAttentionFuncOptions(options).backend(AttentionBackend::kComposite));
    EXPECT_EQ(composite.path, "composite") << c.name;
  }
  // A prefix mask gives exactly what its lengths give.
  d2l::AdditiveAttention attention(kK, kQ, kH, 0.0);
  const auto lens = torch::tensor({6, 2, 4});
  const auto prefix_kp = torch::arange(kM).view({1, kM}) >= lens.view({kB, 1});
  EXPECT_TRUE(
      torch::equal(attention(in.q, in.k, in.v, lens),
                   attention(in.q, in.k, in.v, AttentionMask().key_padding_mask(prefix_kp))));
}

TEST(AdditiveMasks, DropoutOnAGeneralMaskKeepsEachWeightZeroOrScaled) {
  const auto in = inputs(torch::kDouble);
  const double p = 0.3;
  d2l::AdditiveAttention attention(kK, kQ, kH, p);
  attention->to(torch::kDouble);
  attention->train();
  const auto mask = cases()[4].mask;
  const auto [out, weights] = attention->forward_with_weights(in.q, in.k, in.v, mask);
  // The output is the dropped weights times the values: recover them with the
  // values set to the identity.
  const auto eye = torch::eye(kM, torch::kDouble).expand({kB, kM, kM});
  torch::manual_seed(21);
  const auto dropped = attention(in.q, in.k, eye, mask);
  torch::manual_seed(21);
  const auto [again, w] = attention->forward_with_weights(in.q, in.k, eye, mask);
  EXPECT_TRUE(torch::equal(dropped, again));
  const auto kept = dropped != 0;
  EXPECT_TRUE(torch::allclose(dropped.masked_select(kept), (w / (1 - p)).masked_select(kept)));
  EXPECT_GT(kept.logical_not().logical_and(w > 0).sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(
      w.masked_select(~allowed_by_definition(mask)),
      torch::zeros({(~allowed_by_definition(mask)).sum().item<int64_t>()}, torch::kDouble)));
  (void)out;
  (void)weights;
}

TEST(AdditiveMasks, BadMasksAreErrorsNamingTheArgumentBeforeAnyComputation) {
  const auto in = inputs(torch::kFloat);
  d2l::AdditiveAttention attention(kK, kQ, kH, 0.0);
  const auto call = [&](const AttentionMask& mask) {
    return error_message([&] { attention(in.q, in.k, in.v, mask); });
  };
  EXPECT_THAT(call(AttentionMask().key_padding_mask(torch::zeros({kB, kM}))),
              HasSubstr("d2l::AdditiveAttention: key_padding_mask must be a torch::kBool tensor "
                        "of shape [3, 6] (true marks a padding key) for queries [3, 4, 5] and "
                        "keys [3, 6, 7], got Float [3, 6]"));
  EXPECT_THAT(call(AttentionMask().key_padding_mask(torch::tensor(true))),
              HasSubstr("key_padding_mask must be a torch::kBool tensor of shape [3, 6]"));
  EXPECT_THAT(call(AttentionMask().attn_mask(torch::tensor(false))),
              HasSubstr("d2l::AdditiveAttention: attn_mask must be a torch::kBool tensor of shape "
                        "[4, 6] or [3, 4, 6]"));
  EXPECT_THAT(call(AttentionMask().attn_mask(torch::zeros({kN, kM + 1}, torch::kBool))),
              HasSubstr("got Bool [4, 7]"));
  // Fewer keys than queries cannot be causal.
  EXPECT_THAT(error_message([&] {
                attention(in.q, in.k.narrow(1, 0, 2), in.v.narrow(1, 0, 2),
                          AttentionMask().is_causal(true));
              }),
              HasSubstr("d2l::AdditiveAttention: is_causal"));
  EXPECT_THAT(error_message([&] {
                F::additive_attention(in.q, in.k, in.v,
                                      F::AdditiveAttentionFuncOptions(in.W_q, in.W_k, in.w_v)
                                          .key_padding_mask(torch::zeros({kB, kM}, torch::kInt)));
              }),
              HasSubstr("d2l::additive_attention: key_padding_mask"));
}

// Every attention module's mask is its forward's last argument, so masks
// reach it through AnyModule (a lengths tensor converts only in a direct
// call: AnyModule compares the argument's type).
TEST(AdditiveMasks, MasksReachEveryModuleThroughAnyModule) {
  torch::manual_seed(13);
  const auto q = torch::randn({2, 3, 8}), kv = torch::randn({2, 5, 8});
  const auto kp =
      torch::tensor({{false, true, false, false, true}, {false, false, false, true, true}});
  const auto mask = AttentionMask(torch::tensor({4, 5})).key_padding_mask(kp);
  d2l::AdditiveAttention additive(8, 8, 6, 0.0);
  d2l::DotProductAttention dot(0.0);
  d2l::MultiHeadAttention mha(8, 8, 8, 8, 2, 0.0);
  torch::nn::AnyModule any_additive(additive), any_dot(dot), any_mha(mha);
  EXPECT_TRUE(torch::equal(any_additive.forward(q, kv, kv, mask), additive(q, kv, kv, mask)));
  EXPECT_TRUE(torch::equal(any_dot.forward(q, kv, kv, mask), dot(q, kv, kv, mask)));
  EXPECT_TRUE(torch::equal(any_mha.forward(q, kv, kv, mask), mha(q, kv, kv, mask)));
  EXPECT_FALSE(torch::equal(any_mha.forward(q, kv, kv, mask), any_mha.forward(q, kv, kv)));
  EXPECT_THAT(error_message([&] {
                any_dot.forward(q, kv, kv, torch::tensor({4, 5}));
              }),
              HasSubstr("d2l::AttentionMask"));
}

}  // namespace
