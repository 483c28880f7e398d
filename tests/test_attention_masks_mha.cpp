// LibTorch's masks in multi-head attention: our MultiHeadAttention against
// LibTorch's own torch::nn::MultiheadAttention with the same weights and the
// same masks (key_padding_mask, attn_mask of each shape it takes, causal),
// the masks that reach the fused kernels, the module forms and the errors.

#include <d2l/attention_mask.h>
#include <d2l/multi_head_attention.h>

#include <string>
#include <vector>

#include "test_utils.h"

namespace {

using d2l::AttentionMask;
using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;
namespace F = d2l::functional;

constexpr int64_t kB = 3, kN = 5, kM = 6, kE = 16, kHeads = 4;

// Ours and LibTorch's with the same weights (no biases): LibTorch's
// in_proj_weight is W_q, W_k and W_v stacked, its out_proj our W_o.
struct Pair {
  d2l::MultiHeadAttention ours{kE, kE, kE, kE, kHeads, 0.0};
  torch::nn::MultiheadAttention theirs{
      torch::nn::MultiheadAttentionOptions(kE, kHeads).bias(false)};
  Pair() {
    torch::NoGradGuard no_grad;
    auto w = theirs->in_proj_weight;
    ours->W_q->weight.copy_(w.narrow(0, 0, kE));
    ours->W_k->weight.copy_(w.narrow(0, kE, kE));
    ours->W_v->weight.copy_(w.narrow(0, 2 * kE, kE));
    ours->W_o->weight.copy_(theirs->out_proj->weight);
    ours->eval();
    theirs->eval();
  }
};

// LibTorch's layout is (L, N, E); its weights are averaged over the heads.
// Its C++ MultiheadAttention adds attn_mask to the scores (a boolean mask
// would add 1 where true) and takes it only 2-D, so it gets -inf where ours
// gets true.
std::tuple<torch::Tensor, torch::Tensor> theirs_batch_first(Pair& p, const torch::Tensor& q,
                                                            const torch::Tensor& kv,
                                                            const torch::Tensor& key_padding_mask,
                                                            const torch::Tensor& attn_mask) {
  const auto additive =
      attn_mask.defined()
          ? torch::zeros(attn_mask.sizes()).masked_fill(attn_mask, -INFINITY)
          : torch::Tensor();
  auto [out, weights] = p.theirs->forward(q.transpose(0, 1), kv.transpose(0, 1),
                                          kv.transpose(0, 1), key_padding_mask,
                                          /*need_weights=*/true, additive);
  return {out.transpose(0, 1), weights};
}

TEST(MultiHeadAttentionMasks, MatchTorchNnMultiheadAttention) {
  torch::manual_seed(0);
  Pair p;
  const auto q = torch::randn({kB, kN, kE}), kv = torch::randn({kB, kM, kE});
  // Every row keeps at least one key: LibTorch's rows with none are NaN.
  auto kp = torch::rand({kB, kM}) < 0.4;
  kp.select(1, 0).fill_(false);
  auto am2 = torch::rand({kN, kM}) < 0.3;
  am2.select(1, 0).fill_(false);
  const auto causal = torch::ones({kN, kM}, torch::kBool).triu(1 + kM - kN);
  struct Case {
    const char* name;
    AttentionMask ours;
    torch::Tensor kp, am;
  };
  const std::vector<Case> cases{
      {"key_padding_mask", AttentionMask().key_padding_mask(kp), kp, {}},
      {"attn_mask (n, m)", AttentionMask().attn_mask(am2), {}, am2},
      {"both", AttentionMask().key_padding_mask(kp).attn_mask(am2), kp, am2},
      {"is_causal", AttentionMask().is_causal(true), {}, causal},
      {"is_causal, key_padding_mask", AttentionMask().is_causal(true).key_padding_mask(kp), kp,
       causal},
  };
  for (const auto& c : cases) {
    const auto [out, weights] = p.ours->forward_with_weights(q, kv, kv, c.ours);
    const auto [expected, expected_weights] = theirs_batch_first(p, q, kv, c.kp, c.am);
    EXPECT_LT(max_rel_error(out, expected), 1e-5) << c.name;
    EXPECT_LT(max_rel_error(weights.view({kB, kHeads, kN, kM}).mean(1), expected_weights), 1e-5)
        << c.name;
  }
  // A (B * heads, n, m) mask is per head (head h of entry b is row b * heads + h):
  // the same rows for every head of an entry are its (B, n, m) mask.
  const auto per_entry = torch::rand({kB, kN, kM}) < 0.3;
  const auto [by_entry, w_entry] =
      p.ours->forward_with_weights(q, kv, kv, AttentionMask().attn_mask(per_entry));
  const auto [by_head, w_head] = p.ours->forward_with_weights(
      q, kv, kv, AttentionMask().attn_mask(per_entry.repeat_interleave(kHeads, 0)));
  EXPECT_TRUE(torch::equal(by_entry, by_head));
  EXPECT_TRUE(torch::equal(w_entry, w_head));
}

// Small heads run as one node (MultiHeadAttentionFunction), larger ones on
// the flash kernel: both mask by lengths.
bool ran_fused(const torch::Tensor& out) {
  const auto nodes = d2l::testing::graph_nodes(out);
  return d2l::testing::has_node(nodes, "MultiHeadAttentionFunction") ||
         d2l::testing::has_node(nodes, "FlashAttentionFunction");
}

// A prefix key-padding mask, the causal flag and the book's dec_valid_lens
// reach the fused kernels; a mask with holes does not, and gives the same
// numbers as its lengths would where it has none.
TEST(MultiHeadAttentionMasks, PrefixMasksReachTheFusedKernels) {
  torch::manual_seed(1);
  d2l::MultiHeadAttention attention(kE, kE, kE, kE, kHeads, 0.0);
  attention->eval();
  const auto x = torch::randn({kB, kM, kE}, torch::requires_grad());
  const auto lens = torch::tensor({6, 2, 4});
  const auto prefix = torch::arange(kM).view({1, kM}) >= lens.view({kB, 1});
  const auto by_mask = attention->forward(x, x, x, AttentionMask().key_padding_mask(prefix));
  EXPECT_TRUE(ran_fused(by_mask));
  EXPECT_TRUE(torch::equal(by_mask, attention->forward(x, x, x, lens)));
  const auto causal = attention->forward(x, x, x, AttentionMask().is_causal(true));
  EXPECT_TRUE(ran_fused(causal));
  const auto book = attention->forward(x, x, x, torch::arange(1, kM + 1).repeat({kB, 1}));
  EXPECT_TRUE(ran_fused(book));
  EXPECT_TRUE(torch::equal(causal, book));
  auto holes = prefix.clone();
  holes.index_put_({0, 0}, true);
  EXPECT_FALSE(ran_fused(attention->forward(x, x, x, AttentionMask().key_padding_mask(holes))));
}

TEST(MultiHeadAttentionMasks, FunctionalFormTakesTheMasks) {
  torch::manual_seed(2);
  d2l::MultiHeadAttention attention(kE, kE, kE, kE, kHeads, 0.0);
  attention->eval();
  const auto x = torch::randn({kB, kN, kE});
  const auto kp = torch::rand({kB, kN}) < 0.3;
  const auto am = torch::rand({kB, kN, kN}) < 0.3;  // (B, n, m): repeated for each head
  const auto mask = AttentionMask().key_padding_mask(kp).attn_mask(am).is_causal(true);
  const auto [out, weights] = F::multi_head_attention(
      x, x, x,
      F::MultiHeadAttentionFuncOptions(kHeads, attention->W_q->weight, attention->W_k->weight,
                                       attention->W_v->weight, attention->W_o->weight)
          .key_padding_mask(kp)
          .attn_mask(am)
          .is_causal(true));
  EXPECT_TRUE(torch::equal(out, attention->forward(x, x, x, mask)));
  EXPECT_TRUE(torch::equal(weights, attention->attention->attention_weights));
  // Each head of entry b saw entry b's mask.
  const auto per_head = weights.view({kB, kHeads, kN, kN});
  const auto hidden = am.logical_or(kp.view({kB, 1, kN})).logical_or(
      torch::ones({kN, kN}, torch::kBool).triu(1));
  for (int64_t h = 0; h < kHeads; ++h) {
    EXPECT_EQ(per_head.select(1, h).masked_select(hidden).abs().sum().item<double>(), 0) << h;
  }
}

TEST(MultiHeadAttentionMasks, BadMasksNameTheModuleArgumentAndShapes) {
  d2l::MultiHeadAttention attention(kE, kE, kE, kE, kHeads, 0.0);
  const auto q = torch::randn({kB, kN, kE}), kv = torch::randn({kB, kM, kE});
  auto msg = error_message([&] {
    attention->forward(q, kv, kv,
                              AttentionMask().attn_mask(torch::zeros({kB * 2, kN, kM}, torch::kBool)));
  });
  EXPECT_THAT(msg, HasSubstr("d2l::MultiHeadAttention: attn_mask must be a torch::kBool tensor of "
                             "shape [5, 6], [3, 5, 6] or [12, 5, 6] (batch * num_heads=4)"));
  EXPECT_THAT(msg, HasSubstr("got Bool [6, 5, 6]"));
  // A 0-dim mask is ours to refuse, not ATen's "Dimension specified as 0".
  for (const auto& mask : {AttentionMask().attn_mask(torch::tensor(true)),
                           AttentionMask().key_padding_mask(torch::tensor(true))}) {
    msg = error_message([&] { attention->forward(q, kv, kv, mask); });
    EXPECT_THAT(msg, HasSubstr("d2l::MultiHeadAttention: "));
    EXPECT_THAT(msg, HasSubstr("must be a torch::kBool tensor of shape"));
    EXPECT_THAT(msg, HasSubstr("got Bool []"));
  }
  msg = error_message([&] {
    attention->forward(q, kv, kv,
                              AttentionMask().key_padding_mask(torch::zeros({kB, kN}, torch::kBool)));
  });
  EXPECT_THAT(msg, HasSubstr("d2l::MultiHeadAttention: key_padding_mask must be a torch::kBool "
                             "tensor of shape [3, 6]"));
  msg = error_message(
      [&] { attention->forward(kv, q, q, AttentionMask().is_causal(true)); });
  EXPECT_THAT(msg, HasSubstr("d2l::MultiHeadAttention: is_causal"));
  EXPECT_THAT(msg, HasSubstr("got queries [3, 6, 16] and keys [3, 5, 16]"));
  msg = error_message([&] {
    F::multi_head_attention(
        q, kv, kv,
        F::MultiHeadAttentionFuncOptions(kHeads, attention->W_q->weight, attention->W_k->weight,
                                         attention->W_v->weight, attention->W_o->weight)
            .key_padding_mask(torch::zeros({kB, kM}, torch::kInt)));
  });
  EXPECT_THAT(msg, HasSubstr("d2l::multi_head_attention: key_padding_mask"));
  EXPECT_THAT(msg, HasSubstr("got Int [3, 6]"));
}

}  // namespace
