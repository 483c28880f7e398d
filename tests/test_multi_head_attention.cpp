// Multi-head attention (transpose_qkv, transpose_output, MultiHeadAttention):
// behaviour, errors, gradients, agreement with torch::nn::MultiheadAttention
// and parity with the book's PyTorch code (fixtures from
// tests/fixtures/generate_fixtures.py).

#include <d2l/multi_head_attention.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "fixture.h"
#include "module_parity.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::expect_input_gradients;
using d2l::testing::expect_matches;
using d2l::testing::Inputs;
using d2l::testing::kParityDtypes;
using d2l::testing::leaf_inputs;
using d2l::testing::load_parameters;
using d2l::testing::max_rel_error;
using d2l::testing::parameter_name_set;
using d2l::testing::printed;
using ::testing::HasSubstr;

TEST(MultiHeadAttention, TransposeQkvSplitsFeaturesIntoHeads) {
  const auto X = torch::randn({2, 3, 8});
  const auto heads = d2l::transpose_qkv(X, 4);
  ASSERT_EQ(heads.sizes(), (std::vector<int64_t>{8, 3, 2}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_TRUE(torch::equal(heads[b * 4 + h], X[b].slice(1, 2 * h, 2 * h + 2)));
    }
  }
  EXPECT_TRUE(torch::equal(d2l::transpose_output(heads, 4), X));
  const auto empty = d2l::transpose_qkv(torch::randn({0, 3, 8}), 4);
  EXPECT_EQ(empty.sizes(), (std::vector<int64_t>{0, 3, 2}));
  EXPECT_EQ(d2l::transpose_output(empty, 4).sizes(), (std::vector<int64_t>{0, 3, 8}));
}

TEST(MultiHeadAttention, TransposeRejectsBadShapes) {
  EXPECT_THAT(error_message([] {
                d2l::transpose_qkv(torch::randn({2, 3, 10}), 4);
              }),
              HasSubstr("d2l::transpose_qkv: the feature size of X must be a multiple of "
                        "num_heads=4, got X [2, 3, 10]"));
  EXPECT_THAT(error_message([] {
                d2l::transpose_qkv(torch::randn({2, 3}), 1);
              }),
              HasSubstr("d2l::transpose_qkv: X must be a 3-D tensor (B, n, num_hiddens), got "
                        "[2, 3]"));
  EXPECT_THAT(error_message([] {
                d2l::transpose_qkv(torch::randn({2, 3, 4}), 0);
              }),
              HasSubstr("d2l::transpose_qkv: num_heads must be positive, got 0"));
  EXPECT_THAT(error_message([] {
                d2l::transpose_output(torch::randn({6, 3, 2}), 4);
              }),
              HasSubstr("d2l::transpose_output: the first size of X must be a multiple of "
                        "num_heads=4, got X [6, 3, 2]"));
}

TEST(MultiHeadAttention, MirrorsTheBookModule) {
  d2l::MultiHeadAttention attention(100, 100, 100, 100, 5, 0.5);
  EXPECT_EQ(printed(*attention),
            "d2l::MultiHeadAttention(key_size=100, query_size=100, value_size=100, "
            "num_hiddens=100, num_heads=5, dropout=0.5, bias=false)");
  EXPECT_EQ(parameter_name_set(*attention),
            (std::set<std::string>{"W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"}));
  std::vector<std::string> children;
  for (const auto& c : attention->named_children()) children.push_back(c.key());
  EXPECT_EQ(children, (std::vector<std::string>{"attention", "W_q", "W_k", "W_v", "W_o"}));
  attention->eval();
  const auto X = torch::ones({2, 4, 100}), Y = torch::ones({2, 6, 100});
  EXPECT_EQ(attention(X, Y, Y, torch::tensor({3, 2})).sizes(), (std::vector<int64_t>{2, 4, 100}));
  EXPECT_EQ(attention->attention->attention_weights.sizes(), (std::vector<int64_t>{10, 4, 6}));

  d2l::MultiHeadAttention biased(d2l::MultiHeadAttentionOptions(3, 5, 7, 12, 4).bias(true));
  EXPECT_EQ(parameter_name_set(*biased),
            (std::set<std::string>{"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight",
                                   "W_v.bias", "W_o.weight", "W_o.bias"}));
  EXPECT_EQ(biased->W_k->weight.sizes(), (std::vector<int64_t>{12, 3}));
  EXPECT_THAT(printed(*biased), HasSubstr("dropout=0, bias=true)"));
}

TEST(MultiHeadAttention, RejectsBadArguments) {
  EXPECT_THAT(error_message([] { d2l::MultiHeadAttention(4, 4, 4, 10, 3, 0.0); }),
              HasSubstr("d2l::MultiHeadAttention: num_hiddens must be divisible by num_heads, "
                        "got num_hiddens=10 and num_heads=3"));
  EXPECT_THAT(error_message([] { d2l::MultiHeadAttention(4, 0, 4, 10, 2, 0.0); }),
              HasSubstr("d2l::MultiHeadAttention: key_size, query_size, value_size, num_hiddens "
                        "and num_heads must be positive, got key_size=4, query_size=0"));
  EXPECT_THAT(error_message([] { d2l::MultiHeadAttention(4, 4, 4, 8, 2, -0.1); }),
              HasSubstr("d2l::MultiHeadAttention: dropout must be a probability in [0, 1], got "
                        "-0.1"));
  d2l::MultiHeadAttention attention(3, 5, 7, 8, 2, 0.0);
  const auto q = torch::randn({2, 4, 5}), k = torch::randn({2, 6, 3}), v = torch::randn({2, 6, 7});
  const std::string fn = "d2l::MultiHeadAttention: ";
  EXPECT_THAT(error_message([&] {
                attention(q, torch::randn({2, 6, 5}), v);
              }),
              HasSubstr(fn + "queries, keys and values must have query_size=5, key_size=3 and "
                             "value_size=7 features, got queries [2, 4, 5], keys [2, 6, 5] and "
                             "values [2, 6, 7]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, v, torch::tensor({1, 2, 3}));
              }),
              HasSubstr(fn + "valid_lens must have shape [2] or [2, 4] for queries [2, 4, 5], "
                             "got [3]"));
  EXPECT_THAT(error_message([&] {
                attention(q, k, torch::randn({2, 5, 7}));
              }),
              HasSubstr(fn + "keys and values must have the same number of key-value pairs"));
  EXPECT_THAT(error_message([&] {
                attention(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble));
              }),
              HasSubstr(fn + "queries must have the same dtype as W_q.weight (Float), got Double"));
}

// torch::nn::MultiheadAttention holding the same weights as `ours`:
//  - in_proj_weight rows [0, E) = W_q, [E, 2E) = W_k, [2E, 3E) = W_v when
//    kdim == vdim == embed_dim; otherwise q/k/v_proj_weight hold them;
//  - in_proj_bias = [W_q.bias, W_k.bias, W_v.bias]; out_proj = W_o;
//  - its 1/sqrt(head_dim) scaling of q is DotProductAttention's 1/sqrt(d);
//  - its head layout (batch-major, head-minor) is transpose_qkv's.
// LibTorch 1.13 has no batch_first (it takes (L, N, E) inputs), and its C++
// forward asserts that keys and values have equal sizes, so kdim == vdim here.
torch::nn::MultiheadAttention torch_twin(const d2l::MultiHeadAttention& ours) {
  const auto& o = ours->options;
  TORCH_CHECK(o.query_size() == o.num_hiddens(), "torch's queries have embed_dim features");
  torch::nn::MultiheadAttention ref(
      torch::nn::MultiheadAttentionOptions(o.num_hiddens(), o.num_heads())
          .bias(o.bias())
          .kdim(o.key_size())
          .vdim(o.value_size()));
  ref->to(ours->W_q->weight.scalar_type());
  ref->eval();
  torch::NoGradGuard no_grad;
  if (ref->_qkv_same_embed_dim) {
    ref->in_proj_weight.copy_(
        torch::cat({ours->W_q->weight, ours->W_k->weight, ours->W_v->weight}));
  } else {
    ref->q_proj_weight.copy_(ours->W_q->weight);
    ref->k_proj_weight.copy_(ours->W_k->weight);
    ref->v_proj_weight.copy_(ours->W_v->weight);
  }
  ref->out_proj->weight.copy_(ours->W_o->weight);
  if (o.bias()) {
    ref->in_proj_bias.copy_(torch::cat({ours->W_q->bias, ours->W_k->bias, ours->W_v->bias}));
    ref->out_proj->bias.copy_(ours->W_o->bias);
  }
  return ref;
}

// Worst relative errors of (output, head-averaged weights) against torch's
// module. 1-D lengths become key_padding_mask[b, j] = j >= len[b]. LibTorch
// 1.13's C++ attn_mask is an additive (n, m) mask shared by the whole batch, so
// 2-D lengths must be equal across the batch: attn_mask[i, j] = -inf for j >= len[0, i].
std::pair<double, double> compare_with_torch(d2l::MultiHeadAttention& ours, const Inputs& in,
                                             const torch::Tensor& lens) {
  auto ref = torch_twin(ours);
  ours->eval();
  const auto out = ours(in.queries, in.keys, in.values, lens);
  const int64_t B = in.queries.size(0), n = in.queries.size(1), m = in.keys.size(1);
  const int64_t heads = ours->options.num_heads();
  const auto j = torch::arange(m);
  torch::Tensor padding, attn_mask;
  if (lens.defined() && lens.dim() == 1) padding = j.unsqueeze(0) >= lens.unsqueeze(1);
  if (lens.defined() && lens.dim() == 2) {
    TORCH_CHECK(torch::equal(lens, lens[0].expand_as(lens)), "lengths must repeat per batch");
    attn_mask = torch::zeros({n, m}, in.queries.options())
                    .masked_fill(j.unsqueeze(0) >= lens[0].unsqueeze(1),
                                 -std::numeric_limits<double>::infinity());
  }
  auto [ref_out, ref_weights] = ref(in.queries.transpose(0, 1), in.keys.transpose(0, 1),
                                    in.values.transpose(0, 1), padding, true, attn_mask);
  const auto averaged = ours->attention->attention_weights.view({B, heads, n, m}).mean(1);
  return {max_rel_error(out, ref_out.transpose(0, 1)), max_rel_error(averaged, ref_weights)};
}

TEST(MultiHeadAttention, EqualsTorchMultiheadAttention) {
  torch::manual_seed(3);
  struct Case {
    int64_t key_size, value_size;
    bool bias;
    torch::Tensor lens;
  };
  const std::vector<Case> cases = {{8, 8, false, torch::tensor({3, 2, 6})},
                                   {8, 8, true, torch::Tensor()},
                                   {6, 6, true, torch::tensor({1, 6, 4})},
                                   {8, 8, true, torch::tensor({{1, 5, 2, 6}}).expand({3, 4})}};
  for (const auto& c : cases) {
    for (const auto dtype : {torch::kFloat, torch::kDouble}) {
      d2l::MultiHeadAttention ours(c.key_size, 8, c.value_size, 8, 4, 0.3, c.bias);
      ours->to(dtype);
      const auto opts = torch::TensorOptions().dtype(dtype);
      const Inputs in{torch::randn({3, 4, 8}, opts), torch::randn({3, 6, c.key_size}, opts),
                      torch::randn({3, 6, c.value_size}, opts)};
      const auto [out_error, weights_error] = compare_with_torch(ours, in, c.lens);
      const double tol = dtype == torch::kFloat ? 1e-5 : 1e-10;
      EXPECT_LT(out_error, tol) << "key_size " << c.key_size << ", bias " << c.bias;
      EXPECT_LT(weights_error, tol) << "key_size " << c.key_size << ", bias " << c.bias;
      RecordProperty(fmt::format("torch_{}_{}_{}_{}", c.key_size, c.bias,
                                 c.lens.defined() ? c.lens.dim() : 0, c10::toString(dtype)),
                     fmt::format("{:.3g} {:.3g}", out_error, weights_error));
    }
  }
}

TEST(MultiHeadAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(11);
  d2l::MultiHeadAttention attention(3, 4, 5, 6, 3, 0.0, /*bias=*/true);
  attention->to(torch::kDouble);
  const auto lens = torch::tensor({{1, 3}, {2, 1}});
  std::vector<torch::nn::Linear> linears = {attention->W_q, attention->W_k, attention->W_v,
                                            attention->W_o};
  std::vector<torch::Tensor> inputs = {torch::randn({2, 2, 4}, torch::kDouble),
                                       torch::randn({2, 3, 3}, torch::kDouble),
                                       torch::randn({2, 3, 5}, torch::kDouble)};
  for (const auto& linear : linears) {
    inputs.push_back(linear->weight);
    inputs.push_back(linear->bias);
  }
  d2l::testing::expect_gradients_match_finite_differences(
      [&](const std::vector<torch::Tensor>& in) {
        // The helper differentiates with respect to its own copies of the
        // parameters; Linear::forward reads the members, so point them there.
        for (size_t i = 0; i < linears.size(); ++i) {
          linears[i]->weight = in[3 + 2 * i];
          linears[i]->bias = in[4 + 2 * i];
        }
        return attention(in[0], in[1], in[2], lens);
      },
      inputs);
}

}  // namespace
