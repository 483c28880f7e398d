// Multi-head attention's small-head node (Note [Small heads]): one autograd
// node at the book's shapes, with the composite path's numbers forward and
// backward in float and double on every instruction set, through the masks,
// biases, cross- and self-attention, a gradient reaching the weights,
// dropout's random stream, a double backward, padding that holds NaN and
// threads; and the size from which heads go to the flash kernel.

#include <d2l/attention_mask.h>
#include <d2l/backend.h>
#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "fused_helpers.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;
using d2l::AttentionMask;
using d2l::testing::graph_nodes;
using d2l::testing::has_node;
using d2l::testing::max_rel_error;

struct Shape {
  int64_t batch, n, m, query_size, key_size, value_size, num_hiddens, heads;
};

// Two modules with the same weights: the default backend, and the book's ops.
std::pair<d2l::MultiHeadAttention, d2l::MultiHeadAttention> twins(const Shape& s, bool bias,
                                                                  double dropout,
                                                                  torch::Dtype dtype) {
  const auto options =
      d2l::MultiHeadAttentionOptions(s.key_size, s.query_size, s.value_size, s.num_hiddens, s.heads)
          .bias(bias)
          .dropout(dropout);
  d2l::MultiHeadAttention fused(options);
  d2l::MultiHeadAttention composite(
      d2l::MultiHeadAttentionOptions(options).backend(AttentionBackend::kComposite));
  fused->to(dtype);
  composite->to(dtype);
  torch::NoGradGuard no_grad;
  for (auto& p : fused->named_parameters()) {
    // Weights at Linear's scale (unit-variance projections); biases of a
    // tenth, not Linear's zero-mean uniform, so that they count.
    const auto& t = p.value();
    t.copy_(t.dim() == 2 ? torch::randn(t.sizes(), dtype) / std::sqrt(double(t.size(1)))
                         : torch::randn(t.sizes(), dtype) * 0.1);
    composite->named_parameters()[p.key()].copy_(p.value());
  }
  return {fused, composite};
}

struct Inputs {
  torch::Tensor queries, keys, values;
  bool self = false;
};

Inputs inputs_for(const Shape& s, bool self, torch::Dtype dtype) {
  Inputs in;
  in.self = self;
  in.queries = torch::randn({s.batch, s.n, s.query_size}, dtype);
  in.keys = self ? in.queries : torch::randn({s.batch, s.m, s.key_size}, dtype);
  in.values = self ? in.queries : torch::randn({s.batch, s.m, s.value_size}, dtype);
  return in;
}

// Output, weights, the inputs' gradients and every parameter's, for a loss
// on the output and, where g_weights is defined, on the weights too. The
// last entry is the autograd graph's node names, as a flag: 1 when the
// output came from the small-head node.
std::vector<torch::Tensor> outputs_and_grads(d2l::MultiHeadAttention& m, const Inputs& in,
                                             const AttentionMask& mask, const torch::Tensor& g_out,
                                             const torch::Tensor& g_weights) {
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  const auto q = in.queries.detach().clone().requires_grad_();
  const auto k = in.self ? q : in.keys.detach().clone().requires_grad_();
  const auto v = in.self ? q : in.values.detach().clone().requires_grad_();
  auto [out, weights] = m->forward_with_weights(q, k, v, mask);
  auto loss = (out * g_out).sum();
  if (g_weights.defined()) loss = loss + (weights * g_weights).sum();
  loss.backward();
  std::vector<torch::Tensor> result{out.detach(), weights.detach(), q.grad()};
  if (!in.self) {
    result.push_back(k.grad());
    result.push_back(v.grad());
  }
  for (const auto& p : m->named_parameters()) result.push_back(p.value().grad());
  return result;
}

bool small_heads_node(const torch::Tensor& out) {
  return has_node(graph_nodes(out), "MultiHeadAttentionFunction");
}

struct MaskCase {
  std::string name;
  AttentionMask mask;
};

// Masks for (batch 3, n, m): every shape here has batch 3: none, lengths per entry (one of them 0),
// lengths per query, a prefix key-padding mask, the causal flag, and a
// prefix attn_mask per head.
std::vector<MaskCase> mask_cases(const Shape& s) {
  const auto lens = torch::tensor({s.m, 2L, 0L});
  const auto per_query = torch::randint(0, s.m + 1, {s.batch, s.n});
  const auto padding =
      torch::arange(s.m).view({1, s.m}) >= torch::tensor({s.m, 3L, 1L}).view({-1, 1});
  const auto head_lens = torch::randint(0, s.m + 1, {s.batch * s.heads, s.n, 1});
  const auto per_head = torch::arange(s.m).view({1, 1, s.m}) >= head_lens;
  std::vector<MaskCase> cases = {
      {"none", AttentionMask()},
      {"lens", AttentionMask().valid_lens(lens)},
      {"float lens", AttentionMask().valid_lens(lens.to(torch::kFloat))},
      {"per-query lens", AttentionMask().valid_lens(per_query)},
      {"key padding", AttentionMask().key_padding_mask(padding)},
      {"attn_mask per head", AttentionMask().attn_mask(per_head)},
  };
  if (s.m >= s.n) cases.push_back({"causal", AttentionMask().is_causal(true)});
  return cases;
}

class SmallHeads : public d2l::testing::Fused {};

// Against the book's ops: every mask, biases or none, self- or
// cross-attention, a loss on the output or on the output and the weights.
TEST_P(SmallHeads, MatchTheCompositePathForwardAndBackward) {
  const std::vector<Shape> shapes = {
      {3, 5, 7, 6, 5, 4, 8, 2},        // cross-attention, d = 4
      {3, 10, 10, 32, 32, 32, 32, 4},  // the book's Transformer, d = 8
      {3, 4, 9, 12, 12, 12, 12, 4},    // d = 3: no whole vector
      {3, 6, 6, 40, 40, 40, 40, 1},    // one head of 40 features
      {3, 5, 20, 6, 5, 4, 8, 2},       // more keys than a vector holds
      {3, 33, 40, 8, 8, 8, 8, 2},      // several vectors of keys, d = 4
      // One query (a decoding step).
      {3, 1, 7, 6, 5, 4, 8, 2},       // keys within a vector, d = 4
      {3, 1, 37, 24, 24, 24, 24, 2},  // several vectors of keys, d = 12
      {3, 1, 9, 12, 12, 12, 12, 4},   // d = 3: no whole vector
  };
  for (const auto& tol : {d2l::testing::kFastPathDtypes[0], d2l::testing::kFastPathDtypes[1]}) {
    for (const auto& s : shapes) {
      for (const bool bias : {false, true}) {
        for (const bool self : {false, true}) {
          if (self && (s.n != s.m || s.query_size != s.key_size || s.key_size != s.value_size)) {
            continue;
          }
          torch::manual_seed(s.n * 100 + s.heads + bias);
          auto [fused, composite] = twins(s, bias, 0.0, tol.dtype);
          const auto in = inputs_for(s, self, tol.dtype);
          const auto g_out = torch::randn({s.batch, s.n, s.num_hiddens}, tol.dtype);
          const auto g_weights = torch::randn({s.batch * s.heads, s.n, s.m}, tol.dtype);
          for (const auto& c : mask_cases(s)) {
            for (const bool on_weights : {false, true}) {
              const auto what = fmt::format(
                  "{} n={} m={} heads={} bias={} self={} mask={} weights loss={}",
                  c10::toString(tol.dtype), s.n, s.m, s.heads, bias, self, c.name, on_weights);
              const auto gw = on_weights ? g_weights : torch::Tensor();
              const auto got = outputs_and_grads(fused, in, c.mask, g_out, gw);
              const auto want = outputs_and_grads(composite, in, c.mask, g_out, gw);
              d2l::testing::expect_close(got, want, tol, what);
            }
          }
        }
      }
    }
  }
}

// bfloat16: the projections in bfloat16, the heads in float (Note [Small
// heads]). Against the float64 composite path on the same bfloat16 weights
// and inputs, every result within a bound in units of bfloat16's rounding
// (u = 2^-8) of its own largest entry, normwise: |got - exact| <= b u max
// |exact|. What the bounds allow: the output rounds the heads' output before
// the output projection and the projection's result (1-2 u); a weight's
// gradient is a product of two rounded operands of many terms; the inputs'
// gradients go through three rounded products (djoined, the heads'
// gradients, dx); the weights carry the rounding of q and k, times the
// scores' size. Largest errors measured on these cases (LibTorch 1.13, AMD
// Zen 5, every ISA): out 2.3 u, weights 2.4 u, input gradients 5.0 u,
// parameter gradients 5.2 u; the book's ops in bfloat16 on the same cases:
// 3.6, 3.9, 6.5 and 5.7 u. On an AVX2-only CPU (AMD Zen 3) the BLAS kernels
// LibTorch picks round the bfloat16 products otherwise, ours and the book's
// alike: parameter gradients 10.4 u for both. So each case's bound is 4, 4,
// 8 and 8 u or 1.25 times what the book's ops in bfloat16 err by on that
// case, whichever is larger (a floor for cases where the book's ops are
// lucky), and over all cases never more than 1.25 times the book's worst.
double normwise_units(const torch::Tensor& got, const torch::Tensor& exact,
                      const torch::Tensor& scale_of) {
  return d2l::testing::normwise_error(got, exact, scale_of) / 0x1p-8;
}
double normwise_units(const torch::Tensor& got, const torch::Tensor& exact) {
  return normwise_units(got, exact, exact);
}

// The names of outputs_and_grads' results.
std::vector<std::string> result_names(d2l::MultiHeadAttention& m, bool self) {
  std::vector<std::string> names = {"out", "weights", "dq"};
  if (!self) names.insert(names.end(), {"dk", "dv"});
  for (const auto& p : m->named_parameters()) names.push_back(p.key());
  return names;
}

// normwise_units of result i. The key bias's gradient is zero (softmax
// ignores a shift shared by a row's scores): a sum of the projected keys'
// gradients that cancels. Its rounding is measured against the query bias's
// gradient, a sum of terms of the same size.
double result_units(const std::vector<std::string>& names, const std::vector<torch::Tensor>& got,
                    const std::vector<torch::Tensor>& exact, size_t i) {
  if (names[i] != "W_k.bias") return normwise_units(got[i], exact[i]);
  const auto q_bias = std::find(names.begin(), names.end(), "W_q.bias") - names.begin();
  return normwise_units(got[i], exact[i], exact[q_bias]);
}

TEST_P(SmallHeads, BFloat16AgainstTheFloat64CompositePath) {
  const std::vector<Shape> shapes = {
      {3, 5, 7, 6, 5, 4, 8, 2},        // cross-attention, d = 4
      {3, 10, 10, 32, 32, 32, 32, 4},  // the book's Transformer, d = 8
      {3, 33, 40, 8, 8, 8, 8, 2},      // several vectors of keys
  };
  double worst[4] = {0, 0, 0, 0};  // out, weights, input grads, parameter grads
  double book_worst[4] = {0, 0, 0, 0};
  const double bound[4] = {4, 4, 8, 8};
  for (const auto& s : shapes) {
    for (const bool bias : {false, true}) {
      for (const bool self : {false, true}) {
        if (self && (s.n != s.m || s.query_size != s.key_size || s.key_size != s.value_size)) {
          continue;
        }
        torch::manual_seed(s.n * 100 + s.heads + bias);
        auto [fused, book] = twins(s, bias, 0.0, torch::kBFloat16);
        torch::manual_seed(s.n * 100 + s.heads + bias);
        auto exact = twins(s, bias, 0.0, torch::kBFloat16).second;
        exact->to(torch::kDouble);  // the same bfloat16 values, in float64
        const auto names = result_names(fused, self);
        const auto in = inputs_for(s, self, torch::kBFloat16);
        Inputs wide = in;
        wide.queries = in.queries.to(torch::kDouble);
        wide.keys = self ? wide.queries : in.keys.to(torch::kDouble);
        wide.values = self ? wide.queries : in.values.to(torch::kDouble);
        const auto g_out = torch::randn({s.batch, s.n, s.num_hiddens}).to(torch::kBFloat16);
        const auto g_weights =
            torch::randn({s.batch * s.heads, s.n, s.m}).to(torch::kBFloat16);
        for (const auto& c : mask_cases(s)) {
          for (const bool on_weights : {false, true}) {
            const auto what = fmt::format("n={} m={} heads={} bias={} self={} mask={} weights loss={}",
                                          s.n, s.m, s.heads, bias, self, c.name, on_weights);
            const auto gw = on_weights ? g_weights : torch::Tensor();
            const auto got = outputs_and_grads(fused, in, c.mask, g_out, gw);
            EXPECT_TRUE(small_heads_node(fused->forward(in.queries, in.keys, in.values, c.mask)) ||
                        c.name == "attn_mask per head")
                << what;
            const auto want = outputs_and_grads(exact, wide, c.mask, g_out.to(torch::kDouble),
                                                gw.defined() ? gw.to(torch::kDouble) : gw);
            // The book's ops in bfloat16, for what bfloat16 gives there.
            const auto theirs = outputs_and_grads(book, in, c.mask, g_out, gw);
            ASSERT_EQ(got.size(), want.size()) << what;
            ASSERT_EQ(got.size(), names.size()) << what;
            const size_t inputs_end = self ? 3 : 5;
            for (size_t i = 0; i < got.size(); ++i) {
              const auto who = what + " " + names[i];
              ASSERT_TRUE(got[i].defined() && want[i].defined()) << who;
              EXPECT_EQ(got[i].scalar_type(), torch::kBFloat16) << who;
              const size_t kind = i < 2 ? i : (i < inputs_end ? 2 : 3);
              const double units = result_units(names, got, want, i);
              const double book_units = result_units(names, theirs, want, i);
              worst[kind] = std::max(worst[kind], units);
              book_worst[kind] = std::max(book_worst[kind], book_units);
              EXPECT_LE(units, std::max(bound[kind], 1.25 * book_units))
                  << who << " (the book's ops in bfloat16: " << book_units << ")";
            }
          }
        }
      }
    }
  }
  std::printf("[bf16 small heads, %s] worst errors in u = 2^-8: out %.2f, weights %.2f, input "
              "grads %.2f, parameter grads %.2f; the book's ops in bfloat16: %.2f, %.2f, %.2f, "
              "%.2f\n",
              d2l::to_string(GetParam()).c_str(), worst[0], worst[1], worst[2], worst[3],
              book_worst[0], book_worst[1], book_worst[2], book_worst[3]);
  // Never less accurate than the book's ops in bfloat16 (by more than a
  // quarter, for the luck of the draw).
  for (int kind = 0; kind < 4; ++kind) EXPECT_LE(worst[kind], 1.25 * book_worst[kind]) << kind;
}

// Dropout in bfloat16 draws what the float64 composite path draws.
TEST(SmallHeadsNode, BFloat16DropoutDrawsTheCompositePathsRandomStream) {
  const Shape s{4, 10, 10, 32, 32, 32, 32, 4};
  torch::manual_seed(5);
  auto [fused, exact] = twins(s, /*bias=*/true, 0.3, torch::kBFloat16);
  exact->to(torch::kDouble);
  fused->train();
  exact->train();
  const auto in = inputs_for(s, /*self=*/true, torch::kBFloat16);
  Inputs wide = in;
  wide.queries = wide.keys = wide.values = in.queries.to(torch::kDouble);
  const auto g_out = torch::randn({s.batch, s.n, s.num_hiddens}).to(torch::kBFloat16);
  const auto mask = AttentionMask().valid_lens(torch::arange(1, s.n + 1).repeat({s.batch, 1}));
  torch::manual_seed(6);
  const auto got = outputs_and_grads(fused, in, mask, g_out, torch::Tensor());
  torch::manual_seed(6);
  const auto want = outputs_and_grads(exact, wide, mask, g_out.to(torch::kDouble), torch::Tensor());
  const auto names = result_names(fused, /*self=*/true);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), names.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(result_units(names, got, want, i), i < 2 ? 4.0 : 8.0) << names[i];
  }
  // The multipliers were used: without them the output differs by far more.
  fused->eval();
  const auto no_dropout = outputs_and_grads(fused, in, mask, g_out, torch::Tensor());
  EXPECT_GT(normwise_units(no_dropout[0], want[0]), 20.0);
}

INSTANTIATE_TEST_SUITE_P(Isa, SmallHeads, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

// The book's shapes take one node: no bmm, no softmax, no head split.
TEST(SmallHeadsNode, IsOneAutogradNodeAtTheBooksShapes) {
  torch::manual_seed(3);
  d2l::MultiHeadAttention attention(32, 32, 32, 32, 4, 0.1);
  attention->train();
  const auto x = torch::randn({4, 10, 32}, torch::requires_grad());
  const auto out = attention(x, x, x, torch::arange(1, 11).repeat({4, 1}));
  // The node, and the leaves' gradient accumulators behind it.
  for (const auto& name : graph_nodes(out)) {
    EXPECT_TRUE(name.find("MultiHeadAttentionFunction") != std::string::npos ||
                name.find("AccumulateGrad") != std::string::npos)
        << name;
  }
  EXPECT_TRUE(small_heads_node(out));
  EXPECT_EQ(attention->last_attention_weights().sizes(), (torch::IntArrayRef{16, 10, 10}));
}

// Past small_heads' sizes a head runs on the flash kernel (4096 pairs with
// d <= 16, 1024 with more features); general masks, the book's ops and
// reduced precision keep their paths.
TEST(SmallHeadsNode, LargerHeadsGeneralMasksAndOtherTypesTakeOtherPaths) {
  torch::manual_seed(4);
  const auto path_of = [](d2l::MultiHeadAttention& attention, int64_t n, int64_t h) {
    const auto x = torch::randn({1, n, h}, torch::requires_grad());
    const auto nodes = graph_nodes(attention(x, x, x, torch::Tensor()));
    EXPECT_NE(has_node(nodes, "FlashAttentionFunction"),
              has_node(nodes, "MultiHeadAttentionFunction"));
    return has_node(nodes, "MultiHeadAttentionFunction") ? "small_heads" : "flash";
  };
  d2l::MultiHeadAttention narrow(8, 8, 8, 8, 2, 0.0);  // d = 4
  narrow->eval();
  EXPECT_STREQ(path_of(narrow, 64, 8), "small_heads");
  EXPECT_STREQ(path_of(narrow, 65, 8), "flash");
  d2l::MultiHeadAttention wide(64, 64, 64, 64, 2, 0.0);  // d = 32
  wide->eval();
  EXPECT_STREQ(path_of(wide, 32, 64), "small_heads");
  EXPECT_STREQ(path_of(wide, 33, 64), "flash");

  const auto x = torch::randn({2, 24, 8}, torch::requires_grad());
  EXPECT_TRUE(small_heads_node(narrow(x, x, x, torch::Tensor())));
  auto holes = torch::zeros({2, 24}, torch::kBool);
  holes.index_put_({0, 0}, true);
  EXPECT_FALSE(
      small_heads_node(narrow->forward(x, x, x, AttentionMask().key_padding_mask(holes))));
  d2l::MultiHeadAttention composite(
      d2l::MultiHeadAttentionOptions(8, 8, 8, 8, 2).backend(AttentionBackend::kComposite));
  EXPECT_FALSE(small_heads_node(composite(x, x, x, torch::Tensor())));
  // bfloat16 takes the node (its heads in float).
  narrow->to(torch::kBFloat16);
  const auto reduced = x.detach().to(torch::kBFloat16).requires_grad_();
  EXPECT_TRUE(small_heads_node(narrow(reduced, reduced, reduced, torch::Tensor())));
}

// In training, dropout draws the same multipliers as the composite path's
// torch::dropout: with one seed, the same outputs and gradients.
TEST(SmallHeadsNode, DropoutDrawsTheCompositePathsRandomStream) {
  const Shape s{4, 10, 10, 32, 32, 32, 32, 4};
  for (const auto& tol : {d2l::testing::kFastPathDtypes[0], d2l::testing::kFastPathDtypes[1]}) {
    for (const double p : {0.1, 0.5, 1.0}) {
      torch::manual_seed(5);
      auto [fused, composite] = twins(s, /*bias=*/true, p, tol.dtype);
      fused->train();
      composite->train();
      const auto in = inputs_for(s, /*self=*/true, tol.dtype);
      const auto g_out = torch::randn({s.batch, s.n, s.num_hiddens}, tol.dtype);
      const auto mask = AttentionMask().valid_lens(torch::arange(1, s.n + 1).repeat({s.batch, 1}));
      torch::manual_seed(6);
      const auto got = outputs_and_grads(fused, in, mask, g_out, torch::Tensor());
      torch::manual_seed(6);
      const auto want = outputs_and_grads(composite, in, mask, g_out, torch::Tensor());
      d2l::testing::expect_close(got, want, tol,
                                 fmt::format("p={} {}", p, c10::toString(tol.dtype)));
      // Dropout changes the output: the multipliers were used.
      torch::manual_seed(6);
      fused->eval();
      const auto no_dropout = outputs_and_grads(fused, in, mask, g_out, torch::Tensor());
      EXPECT_GT(max_rel_error(got[0], no_dropout[0]), 1e-3) << p;
    }
  }
}

// A double backward (a gradient penalty) differentiates the book's ops:
// the same second derivatives as the composite path's.
TEST(SmallHeadsNode, DoubleBackwardMatchesTheCompositePath) {
  const Shape s{2, 4, 6, 5, 5, 5, 8, 2};
  torch::manual_seed(7);
  auto [fused, composite] = twins(s, /*bias=*/true, 0.0, torch::kDouble);
  const auto in = inputs_for(s, /*self=*/false, torch::kDouble);
  const auto lens = torch::tensor({6, 3});
  const auto penalty_grads = [&](d2l::MultiHeadAttention& m) {
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
    const auto q = in.queries.clone().requires_grad_();
    const auto out = m(q, in.keys, in.values, lens);
    const auto dq = torch::autograd::grad({out.pow(2).sum()}, {q}, {}, true, true)[0];
    dq.pow(2).sum().backward();
    std::vector<torch::Tensor> result{dq.detach(), q.grad()};
    for (const auto& p : m->parameters()) result.push_back(p.grad());
    return result;
  };
  const auto got = penalty_grads(fused);
  const auto want = penalty_grads(composite);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << i;
    EXPECT_LT(max_rel_error(got[i], want[i]), 1e-11) << i;
  }
}

// Keys and values past every length may hold NaN or inf: nothing reaches
// an output or a gradient, and their own gradients are exactly 0. The
// inputs are left as they were.
TEST(SmallHeadsNode, PaddingNeverLeaks) {
  torch::manual_seed(8);
  d2l::MultiHeadAttention attention(4, 4, 4, 8, 2, 0.0);
  attention->eval();
  const auto q = torch::randn({2, 3, 4}, torch::requires_grad());
  auto k = torch::randn({2, 5, 4});
  auto v = torch::randn({2, 5, 4});
  k.index_put_({0, torch::indexing::Slice(3)}, NAN);
  v.index_put_({0, torch::indexing::Slice(3)}, INFINITY);
  k.index_put_({1, torch::indexing::Slice(1)}, -INFINITY);
  const auto k_before = k.clone(), v_before = v.clone();
  k.requires_grad_();
  v.requires_grad_();
  const auto lens = torch::tensor({3, 1});
  const auto out = attention(q, k, v, lens);
  ASSERT_TRUE(small_heads_node(out));
  out.sum().backward();
  EXPECT_TRUE(torch::isfinite(out).all().item<bool>());
  // (W_k's and W_v's gradients sum over every key, padding included, as the
  // book's do: those are NaN here in both.)
  EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(attention->W_q->weight.grad()).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(attention->W_o->weight.grad()).all().item<bool>());
  EXPECT_TRUE(torch::equal(k.grad().index({0, torch::indexing::Slice(3)}), torch::zeros({2, 4})));
  EXPECT_TRUE(torch::equal(v.grad().index({1, torch::indexing::Slice(1)}), torch::zeros({4, 4})));
  EXPECT_TRUE(torch::allclose(k.detach(), k_before, 0, 0, /*equal_nan=*/true));
  EXPECT_TRUE(torch::allclose(v.detach(), v_before, 0, 0, /*equal_nan=*/true));
}

// Heads split over threads give the same bits as one thread.
TEST(SmallHeadsNode, ThreadsGiveTheSameBits) {
  const Shape s{16, 10, 10, 32, 32, 32, 32, 4};
  torch::manual_seed(9);
  auto [fused, composite] = twins(s, /*bias=*/false, 0.0, torch::kFloat);
  const auto in = inputs_for(s, /*self=*/true, torch::kFloat);
  const auto g_out = torch::randn({s.batch, s.n, s.num_hiddens});
  const auto mask = AttentionMask().is_causal(true);
  const int threads = at::get_num_threads();
  d2l::set_num_threads(1);
  const auto one = outputs_and_grads(fused, in, mask, g_out, torch::Tensor());
  d2l::set_num_threads(2);
  const auto two = outputs_and_grads(fused, in, mask, g_out, torch::Tensor());
  d2l::set_num_threads(threads);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(torch::equal(one[i], two[i])) << i;
}

}  // namespace
