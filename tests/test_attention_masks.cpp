// LibTorch's masks beside the book's lengths in dot-product attention
// (Note [Masks as lengths]): every combination of valid lengths, a
// key-padding mask, a boolean attn_mask and the causal flag, on every
// backend and dtype, against an oracle that builds the mask element by
// element in double; the decision table (which masks reach the fast paths);
// the causal flag's alignment; and the errors.

#include <d2l/attention_mask.h>
#include <d2l/dot_product_attention.h>
#include <d2l/torch_version.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "flash_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::AttentionMask;
using d2l::testing::DtypeTolerance;
using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::HasSubstr;
namespace F = d2l::functional;

// (B, n, m) booleans, true where query i of entry b may see key j, written
// out one element at a time from the definitions in <d2l/attention_mask.h>.
torch::Tensor allowed_by_definition(const AttentionMask& mask, int64_t B, int64_t n, int64_t m) {
  auto allowed = torch::ones({B, n, m}, torch::kBool);
  auto a = allowed.accessor<bool, 3>();
  const auto lens = mask.valid_lens().defined() ? mask.valid_lens().to(torch::kDouble)
                                                : torch::Tensor();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        bool ok = true;
        if (lens.defined()) {
          ok &= j < (lens.dim() == 1 ? lens[b] : lens[b][i]).item<double>();
        }
        if (mask.key_padding_mask().defined()) ok &= !mask.key_padding_mask()[b][j].item<bool>();
        if (mask.is_causal()) ok &= j <= i + m - n;
        if (mask.attn_mask().defined()) {
          const auto& am = mask.attn_mask();
          ok &= !(am.dim() == 2 ? am[i][j] : am[b][i][j]).item<bool>();
        }
        a[b][i][j] = ok;
      }
    }
  }
  return allowed;
}

// softmax over the allowed keys (zero where none is), then the values, in
// double: output, weights and the gradients of q, k, v for `upstream`.
std::vector<torch::Tensor> oracle(const std::vector<torch::Tensor>& qkv, const torch::Tensor& allowed,
                                  const torch::Tensor& upstream) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : qkv) leaves.push_back(t.detach().to(torch::kDouble).requires_grad_());
  const auto scores = torch::bmm(leaves[0], leaves[1].transpose(1, 2)) /
                      std::sqrt(static_cast<double>(qkv[0].size(2)));
  const auto exps = torch::where(allowed, torch::exp(scores - scores.detach().amax(-1, true)),
                                 torch::zeros_like(scores));
  const auto sums = exps.sum(-1, true);
  const auto weights = exps / torch::where(sums > 0, sums, torch::ones_like(sums));
  const auto out = torch::bmm(weights, leaves[2]);
  (out * upstream).sum().backward();
  return {out.detach(), weights.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
}

std::vector<torch::Tensor> ours(const std::vector<torch::Tensor>& qkv, const AttentionMask& mask,
                                AttentionBackend backend, const torch::Tensor& upstream) {
  std::vector<torch::Tensor> leaves;
  for (const auto& t : qkv) leaves.push_back(t.detach().clone().requires_grad_());
  const bool weights = backend != AttentionBackend::kSdpa;
  auto [out, w] = F::dot_product_attention(
      leaves[0], leaves[1], leaves[2],
      F::DotProductAttentionFuncOptions().mask(mask).backend(backend).need_weights(weights));
  (out * upstream.to(out.scalar_type())).sum().backward();
  return {out.detach(), weights ? w.detach() : torch::Tensor(), leaves[0].grad(), leaves[1].grad(),
          leaves[2].grad()};
}

std::vector<AttentionBackend> backends() {
  std::vector<AttentionBackend> all{AttentionBackend::kAuto, AttentionBackend::kFused,
                                    AttentionBackend::kComposite};
  if (D2L_HAS_SDPA) all.push_back(AttentionBackend::kSdpa);
  return all;
}

struct Case {
  std::string name;
  AttentionMask mask;
  const char* auto_path;  // what explain_path says for kAuto with weights
};

// n = 5 queries, m = 7 keys, B = 3. Prefix masks and the causal flag come to
// lengths (flash); the others do not (composite).
std::vector<Case> cases() {
  const int64_t B = 3, n = 5, m = 7;
  const auto lens = torch::tensor({7, 3, 0});
  const auto row_lens = torch::tensor({{1, 2, 3, 4, 5}, {7, 0, 2, 2, 6}, {3, 3, 3, 3, 3}});
  const auto prefix_kp = torch::arange(m).view({1, m}) >= torch::tensor({5, 7, 2}).view({B, 1});
  auto holes_kp = torch::zeros({B, m}, torch::kBool);
  holes_kp.index_put_({0, 1}, true);
  holes_kp.index_put_({1, torch::indexing::Slice()}, true);  // entry 1 sees nothing
  holes_kp.index_put_({2, 0}, true);
  const auto band = (torch::arange(n).view({n, 1}) - torch::arange(m).view({1, m})).abs() > 1;
  const auto prefix_rows = torch::arange(m).view({1, 1, m}) >= torch::randint(0, m + 1, {B, n, 1});
  const auto random = torch::rand({B, n, m}) < 0.4;
  return {
      {"lengths only", AttentionMask().valid_lens(lens), "flash"},
      {"prefix key padding", AttentionMask().key_padding_mask(prefix_kp), "flash"},
      {"prefix key padding and lengths",
       AttentionMask().key_padding_mask(prefix_kp).valid_lens(row_lens), "flash"},
      {"causal", AttentionMask().is_causal(true), "flash"},
      {"causal and lengths", AttentionMask().is_causal(true).valid_lens(lens), "flash"},
      {"causal and prefix key padding", AttentionMask().is_causal(true).key_padding_mask(prefix_kp),
       "flash"},
      {"prefix attn_mask rows", AttentionMask().attn_mask(prefix_rows), "flash"},
      {"key padding with holes", AttentionMask().key_padding_mask(holes_kp), "composite"},
      {"band attn_mask", AttentionMask().attn_mask(band), "composite"},
      {"random attn_mask, causal, lengths, key padding",
       AttentionMask().attn_mask(random).is_causal(true).valid_lens(lens).key_padding_mask(
           prefix_kp),
       "composite"},
  };
}

TEST(AttentionMasks, EveryBackendAndDtypeMatchesTheDefinition) {
  torch::manual_seed(0);
  const int64_t B = 3, n = 5, m = 7, d = 4, v = 3;
  const std::vector<torch::Tensor> qkv{torch::randn({B, n, d}), torch::randn({B, m, d}),
                                       torch::randn({B, m, v})};
  const auto upstream = torch::randn({B, n, v}, torch::kDouble);
  for (const auto& c : cases()) {
    const auto expected = oracle(qkv, allowed_by_definition(c.mask, B, n, m), upstream);
    for (const auto& tol : d2l::testing::runnable_dtypes()) {
      std::vector<torch::Tensor> in;
      for (const auto& t : qkv) in.push_back(t.to(tol.dtype));
      const bool reduced = tol.dtype == torch::kHalf || tol.dtype == torch::kBFloat16;
      // Reduced precision rounds the inputs too: compare with the oracle on them.
      const auto reference = reduced ? oracle(in, allowed_by_definition(c.mask, B, n, m), upstream)
                                     : expected;
      // In reduced precision the composite path's products round as the BLAS
      // kernels LibTorch picks for this CPU do, and so do the other backends'
      // where they call the same products: the other backends are held to
      // the dtype's tolerance or to 1.25 times the composite path's own error
      // on that result, whichever is larger (the composite path itself to the
      // tolerance alone).
      const auto book = reduced ? ours(in, c.mask, AttentionBackend::kComposite, upstream)
                                : std::vector<torch::Tensor>();
      for (const auto backend : backends()) {
        if (backend == AttentionBackend::kSdpa && reduced) continue;  // ATen's CPU SDPA: float, double
        const auto got = ours(in, c.mask, backend, upstream);
        const auto what = fmt::format("{}, {}, {}", c.name, d2l::to_string(backend),
                                      c10::toString(tol.dtype));
        for (size_t i = 0; i < got.size(); ++i) {
          if (!got[i].defined()) continue;
          EXPECT_FALSE(got[i].isnan().any().item<bool>()) << what << " output " << i;
          const bool forward = i < 2;
          const double slack = tol.dtype == torch::kFloat ? 1e-5 : 0.0;
          const double book_error =
              reduced && backend != AttentionBackend::kComposite && book[i].defined()
                  ? max_rel_error(book[i], reference[i])
                  : 0.0;
          EXPECT_LT(max_rel_error(got[i], reference[i]),
                    std::max({forward ? tol.forward : tol.backward, slack, 1.25 * book_error}))
              << what << " output " << i << " (the composite path: " << book_error << ")";
        }
      }
    }
  }
}

TEST(AttentionMasks, DecisionTable) {
  torch::manual_seed(1);
  const auto q = torch::randn({3, 5, 4}), k = torch::randn({3, 7, 4}), v = torch::randn({3, 7, 3});
  for (const auto& c : cases()) {
    const auto options = F::DotProductAttentionFuncOptions().mask(c.mask);
    const auto why = d2l::explain_path(q, k, v, options);
    EXPECT_EQ(why.path, c.auto_path) << c.name << ": " << why.to_string();
    if (std::string(c.auto_path) == "composite") {
      ASSERT_FALSE(why.reasons.empty()) << c.name;
      EXPECT_THAT(why.reasons[0], HasSubstr("is not a prefix of keys in every row")) << c.name;
      // kFused cannot take the mask either, and says so rather than throw.
      const auto fused =
          d2l::explain_path(q, k, v, F::DotProductAttentionFuncOptions(options).backend(
                                         AttentionBackend::kFused));
      EXPECT_EQ(fused.path, "composite") << c.name;
    }
    if (D2L_HAS_SDPA) {
      const auto sdpa = d2l::explain_path(
          q, k, v,
          F::DotProductAttentionFuncOptions(options).backend(AttentionBackend::kSdpa).need_weights(
              false));
      EXPECT_EQ(sdpa.path, "sdpa") << c.name;
    }
  }
}

// The causal flag, the book's dec_valid_lens and a key-padding mask that is
// a prefix are the same lengths: the same path and the same numbers, bit for bit.
TEST(AttentionMasks, CausalFlagIsTheBooksDecoderLengths) {
  torch::manual_seed(2);
  const int64_t B = 4, n = 33;
  const auto q = torch::randn({B, n, 16}), k = torch::randn({B, n, 16}), v = torch::randn({B, n, 8});
  const auto dec_valid_lens = torch::arange(1, n + 1).repeat({B, 1});
  for (const auto backend : {AttentionBackend::kAuto, AttentionBackend::kComposite}) {
    const auto base = F::DotProductAttentionFuncOptions().backend(backend);
    const auto [by_flag, w_flag] =
        F::dot_product_attention(q, k, v, F::DotProductAttentionFuncOptions(base).is_causal(true));
    const auto [by_lens, w_lens] = F::dot_product_attention(
        q, k, v, F::DotProductAttentionFuncOptions(base).valid_lens(dec_valid_lens));
    EXPECT_TRUE(torch::equal(by_flag, by_lens)) << d2l::to_string(backend);
    EXPECT_TRUE(torch::equal(w_flag, w_lens)) << d2l::to_string(backend);
  }
  const auto lens = torch::tensor({33, 1, 17, 0});
  const auto padding = torch::arange(n).view({1, n}) >= lens.view({B, 1});
  const auto [by_mask, w_mask] = F::dot_product_attention(
      q, k, v, F::DotProductAttentionFuncOptions().key_padding_mask(padding));
  const auto [by_lens, w_lens] =
      F::dot_product_attention(q, k, v, F::DotProductAttentionFuncOptions().valid_lens(lens));
  EXPECT_TRUE(torch::equal(by_mask, by_lens));
  EXPECT_TRUE(torch::equal(w_mask, w_lens));
}

// With fewer queries than keys, the last query is aligned with the last key:
// a decoder's new queries after the cached past. With n = m it is SDPA's is_causal.
TEST(AttentionMasks, CausalAlignsTheLastQueryWithTheLastKey) {
  torch::manual_seed(3);
  const auto q = torch::randn({2, 3, 8}), k = torch::randn({2, 6, 8}), v = torch::randn({2, 6, 5});
  const auto [out, weights] =
      F::dot_product_attention(q, k, v, F::DotProductAttentionFuncOptions().is_causal(true));
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_GT(weights.select(1, i).narrow(1, 0, 4 + i).min().item<double>(), 0) << i;
    if (i < 2) {
      EXPECT_EQ(weights.select(1, i).narrow(1, 4 + i, 2 - i).abs().max().item<double>(), 0) << i;
    }
  }
  const auto [one_step, w] = F::dot_product_attention(
      q.narrow(1, 2, 1), k, v, F::DotProductAttentionFuncOptions().is_causal(true));
  EXPECT_TRUE(torch::allclose(one_step, out.narrow(1, 2, 1), 1e-6, 1e-6));
#if D2L_HAS_SDPA
  const auto square = k.narrow(1, 0, 3);
  const auto [ours, unused] = F::dot_product_attention(
      q, square, v.narrow(1, 0, 3),
      F::DotProductAttentionFuncOptions().is_causal(true).need_weights(false));
  const auto theirs = at::scaled_dot_product_attention(q, square, v.narrow(1, 0, 3), std::nullopt,
                                                       0.0, /*is_causal=*/true);
  EXPECT_TRUE(torch::allclose(ours, theirs, 1e-5, 1e-6));
#endif
}

TEST(AttentionMasks, LengthsOfEveryDtypeResolveAsInt64Lengths) {
  // float16 and bfloat16 lengths beside another mask are resolved too (1.13
  // has no float16 clamp on the CPU), with the numbers of int64 lengths.
  torch::manual_seed(4);
  const auto q = torch::randn({2, 3, 8}), k = torch::randn({2, 6, 8}), v = torch::randn({2, 6, 5});
  const auto lens = torch::tensor({6, 2});
  const auto padding =
      torch::tensor({{true, true, true, true, true, false}, {true, true, true, true, true, true}});
  const auto run = [&](const AttentionMask& mask) {
    return std::get<0>(
        F::dot_product_attention(q, k, v, F::DotProductAttentionFuncOptions().mask(mask)));
  };
  for (const auto dtype :
       {torch::kHalf, torch::kBFloat16, torch::kFloat, torch::kDouble, torch::kInt, torch::kByte}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto typed = lens.to(dtype);
    EXPECT_TRUE(torch::equal(run(AttentionMask(typed)), run(AttentionMask(lens))));
    EXPECT_TRUE(torch::equal(run(AttentionMask(typed).is_causal(true)),
                             run(AttentionMask(lens).is_causal(true))));
    EXPECT_TRUE(torch::equal(run(AttentionMask(typed).key_padding_mask(padding)),
                             run(AttentionMask(lens).key_padding_mask(padding))));
  }
  // Lengths past the keys mean every key, in any dtype.
  EXPECT_TRUE(
      torch::equal(run(AttentionMask(torch::tensor({60000, 2}).to(torch::kHalf)).is_causal(true)),
                   run(AttentionMask(torch::tensor({6, 2})).is_causal(true))));
}

TEST(AttentionMasks, BadMasksNameTheArgumentAndShapes) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 6});
  const auto call = [&](const F::DotProductAttentionFuncOptions& options) {
    return error_message([&] { F::dot_product_attention(q, k, v, options); });
  };
  auto msg = call(F::DotProductAttentionFuncOptions().key_padding_mask(torch::zeros({2, 5})));
  EXPECT_THAT(msg, HasSubstr("d2l::dot_product_attention: key_padding_mask must be a "
                             "torch::kBool tensor of shape [2, 5]"));
  EXPECT_THAT(msg, HasSubstr("got Float [2, 5]"));
  EXPECT_THAT(msg, HasSubstr("mask == -INFINITY"));
  msg = call(F::DotProductAttentionFuncOptions().key_padding_mask(
      torch::zeros({2, 3}, torch::kBool)));
  EXPECT_THAT(msg, HasSubstr("queries [2, 3, 4] and keys [2, 5, 4], got Bool [2, 3]"));
  msg = call(F::DotProductAttentionFuncOptions().attn_mask(torch::zeros({5, 3}, torch::kBool)));
  EXPECT_THAT(msg, HasSubstr("attn_mask must be a torch::kBool tensor of shape [3, 5] or "
                             "[2, 3, 5]"));
  EXPECT_THAT(msg, HasSubstr("got Bool [5, 3]"));
  msg = call(F::DotProductAttentionFuncOptions().attn_mask(torch::zeros({4, 3, 5}, torch::kBool)));
  EXPECT_THAT(msg, HasSubstr("got Bool [4, 3, 5]"));
  // 0-dim masks: our message, not ATen's "Dimension specified as 0".
  msg = call(F::DotProductAttentionFuncOptions().attn_mask(torch::tensor(true)));
  EXPECT_THAT(msg, HasSubstr("attn_mask must be a torch::kBool tensor of shape [3, 5] or "
                             "[2, 3, 5]"));
  EXPECT_THAT(msg, HasSubstr("got Bool []"));
  msg = call(F::DotProductAttentionFuncOptions().key_padding_mask(torch::tensor(true)));
  EXPECT_THAT(msg, HasSubstr("key_padding_mask must be a torch::kBool tensor of shape [2, 5]"));
  EXPECT_THAT(msg, HasSubstr("got Bool []"));
  msg = call(F::DotProductAttentionFuncOptions().key_padding_mask(
      d2l::testing::sparse(torch::zeros({2, 5}))));
  EXPECT_THAT(msg, HasSubstr("d2l::dot_product_attention"));
  EXPECT_THAT(msg, HasSubstr("key_padding_mask"));
  // Fewer keys than queries: the causal flag is refused, naming both shapes.
  msg = error_message([&] {
    F::dot_product_attention(k, q, q, F::DotProductAttentionFuncOptions().is_causal(true));
  });
  EXPECT_THAT(msg, HasSubstr("d2l::dot_product_attention: is_causal"));
  EXPECT_THAT(msg, HasSubstr("got queries [2, 5, 4] and keys [2, 3, 4]"));
  // The same checks in explain_path.
  msg = error_message([&] {
    d2l::explain_path(q, k, v,
                      F::DotProductAttentionFuncOptions().key_padding_mask(torch::zeros({2, 5})));
  });
  EXPECT_THAT(msg, HasSubstr("key_padding_mask must be a torch::kBool tensor"));
}

TEST(AttentionMasks, MasksAreLeftAsTheyWere) {
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 4}), v = torch::randn({2, 5, 6});
  const auto kp = torch::rand({2, 5}) < 0.5, am = torch::rand({3, 5}) < 0.5;
  const auto kp_copy = kp.clone(), am_copy = am.clone();
  F::dot_product_attention(
      q, k, v, F::DotProductAttentionFuncOptions().key_padding_mask(kp).attn_mask(am).is_causal(true));
  EXPECT_TRUE(torch::equal(kp, kp_copy));
  EXPECT_TRUE(torch::equal(am, am_copy));
}

TEST(AttentionMasks, EmptySizes) {
  for (const auto& [B, n, m] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {0, 3, 5}, {2, 0, 5}, {2, 3, 0}, {2, 0, 0}}) {
    const auto q = torch::randn({B, n, 4}, torch::requires_grad());
    const auto k = torch::randn({B, m, 4}, torch::requires_grad());
    const auto v = torch::randn({B, m, 2}, torch::requires_grad());
    const auto options = F::DotProductAttentionFuncOptions()
                             .key_padding_mask(torch::zeros({B, m}, torch::kBool))
                             .attn_mask(torch::zeros({n, m}, torch::kBool))
                             .is_causal(n <= m);
    const auto [out, weights] = F::dot_product_attention(q, k, v, options);
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{B, n, 2}));
    EXPECT_EQ(out.abs().sum().item<double>(), 0.0);
    out.sum().backward();
  }
}

// The module form records the weights the functional form returns.
TEST(AttentionMasks, ModuleForwardMasked) {
  torch::manual_seed(4);
  d2l::DotProductAttention attention(0.0);
  const auto q = torch::randn({2, 4, 8}), k = torch::randn({2, 6, 8}), v = torch::randn({2, 6, 3});
  const auto mask = AttentionMask().is_causal(true).key_padding_mask(torch::rand({2, 6}) < 0.3);
  const auto out = attention->forward(q, k, v, mask);
  const auto [expected, weights] =
      F::dot_product_attention(q, k, v, F::DotProductAttentionFuncOptions().mask(mask));
  EXPECT_TRUE(torch::equal(out, expected));
  EXPECT_TRUE(torch::equal(attention->attention_weights, weights));
  const auto [again, w] = attention->forward_with_weights(q, k, v, mask);
  EXPECT_TRUE(torch::equal(again, expected));
  EXPECT_EQ(attention->explain_path(q, k, v, mask).path,
            d2l::explain_path(q, k, v, F::DotProductAttentionFuncOptions().mask(mask)).path);
}

}  // namespace
