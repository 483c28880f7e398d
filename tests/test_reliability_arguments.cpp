// Reliability, arguments of the modules built on the scorers: every tensor
// argument of NWKernelRegression, MultiHeadAttention (and its functional
// form), the seq2seq modules and EncoderDecoder, including the fields of a
// decoder state altered after init_state, given wrong: shapes, dtypes,
// devices, values, and unusual layouts (sparse, quantized, mkldnn, meta). Each
// must be a c10::Error naming the function and the argument, raised before
// ATen sees the tensor; and no call modifies its inputs.

#include <d2l/multi_head_attention.h>
#include <d2l/nadaraya_watson.h>
#include <d2l/seq2seq.h>

#include <ATen/Context.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "seq2seq_models.h"
#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::sparse;
using ::testing::HasSubstr;

// One bad call: `fn` is the public function it must name, `message` the rest
// of what it must say (the argument first).
struct BadCall {
  std::string fn, message;
  std::function<void()> call;
};

void expect_all_rejected(const std::vector<BadCall>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fn + ": " + c.message);
    EXPECT_THAT(error_message(c.call), HasSubstr(c.fn + ": " + c.message));
  }
}

torch::Tensor meta_like(const torch::Tensor& t) {
  return torch::empty(t.sizes(), t.options().device(torch::kMeta));
}
torch::Tensor quantized(const torch::Tensor& t) {
  return torch::quantize_per_tensor(t.to(torch::kFloat), 0.1, 0, torch::kQUInt8);
}

// What check_strided_layout says for each unusual layout.
const char* kSparse = "must be a dense tensor with the strided layout, got layout Sparse";
const char* kQuantized = "must not be a quantized tensor, got dtype QUInt8";
const char* kMeta = "must hold data, got a tensor on the meta device";

// Every argument that check_strided_layout guards, given sparse, quantized,
// meta (and mkldnn where LibTorch has it) in place of `good`.
void add_layout_cases(std::vector<BadCall>& cases, const std::string& fn, const std::string& name,
                      const torch::Tensor& good,
                      const std::function<void(const torch::Tensor&)>& call_with) {
  cases.push_back({fn, name + " " + kSparse, [=] { call_with(sparse(good)); }});
  cases.push_back({fn, name + " " + kQuantized, [=] { call_with(quantized(good)); }});
  cases.push_back({fn, name + " " + kMeta, [=] { call_with(meta_like(good)); }});
  if (at::hasMKLDNN() && good.is_floating_point() && good.dim() > 0) {
    cases.push_back({fn,
                     name + " must be a dense tensor with the strided layout, got layout Mkldnn",
                     [=] { call_with(good.to(torch::kFloat).to_mkldnn()); }});
  }
}

TEST(ReliabilityArguments, NWKernelRegression) {
  d2l::NWKernelRegression net;
  const auto q = torch::rand({3}), k = torch::rand({3, 4}), v = torch::rand({3, 4});
  const std::string fn = "d2l::NWKernelRegression";
  std::vector<BadCall> cases;
  add_layout_cases(cases, fn, "queries", q, [&](const torch::Tensor& t) { net->forward(t, k, v); });
  add_layout_cases(cases, fn, "keys", k, [&](const torch::Tensor& t) { net->forward(q, t, v); });
  add_layout_cases(cases, fn, "values", v, [&](const torch::Tensor& t) { net->forward(q, k, t); });
  cases.push_back({fn, "keys and values must both have shape (n_q, n_k)", [&] {
                     net->forward(q, k, torch::rand({3, 5}));
                   }});
  cases.push_back({fn, "values must have a floating-point dtype, got Long", [&] {
                     net->forward(q, k, torch::ones({3, 4}, torch::kLong));
                   }});
  using d2l::functional::nadaraya_watson;
  using d2l::functional::nw_kernel_regression;
  add_layout_cases(cases, "d2l::nadaraya_watson", "keys", torch::rand({4}),
                   [&](const torch::Tensor& t) { nadaraya_watson(q, t, torch::rand({4})); });
  add_layout_cases(cases, "d2l::nw_kernel_regression", "w", torch::ones({1}),
                   [&](const torch::Tensor& t) { nw_kernel_regression(q, k, v, t); });
  expect_all_rejected(cases);
}

TEST(ReliabilityArguments, MultiHeadAttention) {
  d2l::MultiHeadAttention mha(5, 6, 7, 8, 2, 0.0);
  const auto q = torch::randn({2, 3, 6}), k = torch::randn({2, 4, 5}), v = torch::randn({2, 4, 7});
  const auto lens = torch::tensor({2, 4});
  const std::string fn = "d2l::MultiHeadAttention";
  std::vector<BadCall> cases;
  add_layout_cases(cases, fn, "queries", q,
                   [&](const torch::Tensor& t) { mha->forward(t, k, v, lens); });
  add_layout_cases(cases, fn, "keys", k,
                   [&](const torch::Tensor& t) { mha->forward(q, t, v, lens); });
  add_layout_cases(cases, fn, "values", v,
                   [&](const torch::Tensor& t) { mha->forward(q, k, t, lens); });
  add_layout_cases(cases, fn, "valid_lens", lens,
                   [&](const torch::Tensor& t) { mha->forward(q, k, v, t); });
  cases.push_back({fn, "valid_lens must hold non-negative lengths, got -1", [&] {
                     mha->forward(q, k, v, torch::tensor({2, -1}));
                   }});
  cases.push_back({fn, "valid_lens must hold whole numbers, got 1.5", [&] {
                     mha->forward(q, k, v, torch::tensor({2.0, 1.5}));
                   }});
  cases.push_back({fn, "valid_lens must have an integer dtype", [&] {
                     mha->forward(q, k, v, torch::tensor({true, false}));
                   }});
  cases.push_back(
      {fn, "valid_lens must have shape [2] or [2, 3] for queries [2, 3, 6], got [3]", [&] {
         mha->forward(q, k, v, torch::tensor({1, 2, 3}));
       }});
  cases.push_back({fn, "queries, keys and values must have query_size=6",
                   [&] { mha->forward(k, k, v, lens); }});

  using d2l::functional::multi_head_attention;
  using Options = d2l::functional::MultiHeadAttentionFuncOptions;
  const auto Wq = torch::randn({8, 6}), Wk = torch::randn({8, 5}), Wv = torch::randn({8, 7}),
             Wo = torch::randn({8, 8});
  const std::string f = "d2l::multi_head_attention";
  const auto run = [&](Options o) { multi_head_attention(q, k, v, o.valid_lens(lens)); };
  add_layout_cases(cases, f, "W_q", Wq,
                   [&](const torch::Tensor& t) { run(Options(2, t, Wk, Wv, Wo)); });
  add_layout_cases(cases, f, "W_k", Wk,
                   [&](const torch::Tensor& t) { run(Options(2, Wq, t, Wv, Wo)); });
  add_layout_cases(cases, f, "W_o", Wo,
                   [&](const torch::Tensor& t) { run(Options(2, Wq, Wk, Wv, t)); });
  add_layout_cases(cases, f, "b_v", torch::zeros({8}),
                   [&](const torch::Tensor& t) { run(Options(2, Wq, Wk, Wv, Wo).b_v(t)); });
  cases.push_back(
      {f, "W_k must have shape [8, 5], got [8, 6]", [&] { run(Options(2, Wq, Wq, Wv, Wo)); }});
  cases.push_back({f, "b_o must have shape [8] or be undefined, got [4]",
                   [&] { run(Options(2, Wq, Wk, Wv, Wo).b_o(torch::zeros({4}))); }});
  cases.push_back({f, "dropout must be a probability in [0, 1], got nan",
                   [&] { run(Options(2, Wq, Wk, Wv, Wo).dropout(std::nan(""))); }});
  cases.push_back(
      {f, "num_heads must be positive, got 0", [&] { run(Options(0, Wq, Wk, Wv, Wo)); }});
  cases.push_back({f, "the projections must have at least one output feature (the rows of W_q, num_hiddens), got W_q [0, 6]",
                   [&] {
                     run(Options(2, torch::randn({0, 6}), torch::randn({0, 5}),
                                 torch::randn({0, 7}), torch::randn({0, 0})));
                   }});
  add_layout_cases(cases, "d2l::transpose_qkv", "X", q,
                   [](const torch::Tensor& t) { d2l::transpose_qkv(t, 2); });
  expect_all_rejected(cases);
}

using d2l::testing::kEmbed;
using d2l::testing::kHiddens;
using d2l::testing::kLayers;
using d2l::testing::kVocab;

TEST(ReliabilityArguments, Seq2SeqEncoderAndDecoder) {
  const d2l::Seq2SeqOptions o(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqEncoder encoder(o);
  d2l::Seq2SeqDecoder decoder(o);
  const auto X = torch::randint(0, kVocab, {2, 5});
  const auto lens = torch::tensor({3, 5});
  const auto enc = encoder->forward(X);
  const auto state = decoder->init_state(enc, lens);
  std::vector<BadCall> cases;
  const std::string e = "d2l::Seq2SeqEncoder";
  add_layout_cases(cases, e, "X", X, [&](const torch::Tensor& t) { encoder->forward(t); });
  add_layout_cases(cases, e, "valid_lens", lens,
                   [&](const torch::Tensor& t) { encoder->forward(X, t); });
  cases.push_back({e, "valid_lens must hold whole numbers, got 0.5", [&] {
                     encoder->forward(X, torch::tensor({0.5, 1.0}));
                   }});

  const std::string i = "d2l::Seq2SeqDecoder::init_state";
  add_layout_cases(cases, i, "enc_outputs.outputs", enc.outputs, [&](const torch::Tensor& t) {
    decoder->init_state({t, enc.hidden_state});
  });
  add_layout_cases(cases, i, "enc_outputs.hidden_state", enc.hidden_state,
                   [&](const torch::Tensor& t) {
                     decoder->init_state({enc.outputs, t});
                   });
  add_layout_cases(cases, i, "enc_valid_lens", lens,
                   [&](const torch::Tensor& t) { decoder->init_state(enc, t); });
  cases.push_back({i, "enc_valid_lens must hold non-negative lengths, got -3", [&] {
                     decoder->init_state(enc, torch::tensor({1, -3}));
                   }});
  cases.push_back({i, "enc_valid_lens must have shape [batch_size=2], got [2, 1]", [&] {
                     decoder->init_state(enc, torch::ones({2, 1}, torch::kLong));
                   }});
  cases.push_back(
      {i, "enc_outputs.hidden_state must have the same dtype as rnn.weight_hh_l0", [&] {
         decoder->init_state({enc.outputs.to(torch::kDouble), enc.hidden_state.to(torch::kDouble)});
       }});

  const std::string d = "d2l::Seq2SeqDecoder";
  add_layout_cases(cases, d, "state.hidden_state", state.hidden_state, [&](const torch::Tensor& t) {
    auto altered = state;
    altered.hidden_state = t;
    decoder->forward(X, altered);
  });
  add_layout_cases(cases, d, "X", X, [&](const torch::Tensor& t) { decoder->forward(t, state); });
  expect_all_rejected(cases);
}

TEST(ReliabilityArguments, Seq2SeqAttentionDecoderState) {
  const d2l::Seq2SeqOptions o(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqEncoder encoder(o);
  d2l::Seq2SeqAttentionDecoder decoder(o);
  const auto X = torch::randint(0, kVocab, {2, 5});
  const auto lens = torch::tensor({3, 5});
  const auto enc = encoder->forward(X);
  const auto state = decoder->init_state(enc, lens);
  std::vector<BadCall> cases;
  const std::string i = "d2l::Seq2SeqAttentionDecoder::init_state";
  add_layout_cases(cases, i, "enc_valid_lens", lens,
                   [&](const torch::Tensor& t) { decoder->init_state(enc, t); });
  cases.push_back({i, "enc_valid_lens must hold whole numbers, got 2.5", [&] {
                     decoder->init_state(enc, torch::tensor({2.5, 1.0}));
                   }});
  add_layout_cases(cases, i, "enc_outputs.outputs", enc.outputs, [&](const torch::Tensor& t) {
    decoder->init_state({t, enc.hidden_state}, lens);
  });

  // The state init_state made, with one field altered afterwards.
  const std::string d = "d2l::Seq2SeqAttentionDecoder";
  using Field = torch::Tensor d2l::DecoderState::*;
  const auto with = [&](Field field, const torch::Tensor& t) {
    auto altered = state;
    altered.*field = t;
    decoder->forward(X, altered);
  };
  using d2l::DecoderState;
  for (const auto& [name, field] : std::vector<std::pair<std::string, Field>>{
           {"state.enc_valid_lens", &DecoderState::enc_valid_lens},
           {"state.enc_outputs", &DecoderState::enc_outputs},
           {"state.hidden_state", &DecoderState::hidden_state}}) {
    const Field f = field;
    add_layout_cases(cases, d, name, state.*field, [&with, f](const torch::Tensor& t) { with(f, t); });
  }
  const Field lens_field = &DecoderState::enc_valid_lens;
  cases.push_back({d, "state.enc_valid_lens must hold non-negative lengths, got -1", [&] {
                     with(lens_field, torch::tensor({-1, 2}));
                   }});
  cases.push_back({d, "state.enc_valid_lens must hold whole numbers, got 0.25", [&] {
                     with(lens_field, torch::tensor({0.25, 2.0}));
                   }});
  cases.push_back({d, "state.enc_valid_lens must have an integer dtype", [&] {
                     with(lens_field, torch::tensor({true, true}));
                   }});
  cases.push_back({d, "state.enc_valid_lens must have shape [batch_size=2], got [2, 5]", [&] {
                     with(lens_field, torch::ones({2, 5}, torch::kLong));
                   }});
  cases.push_back({d, "state.enc_valid_lens must have shape [batch_size=2], got [3]", [&] {
                     with(lens_field, torch::tensor({1, 2, 3}));
                   }});
  cases.push_back(
      {d,
       "state.enc_outputs must have the same dtype as attention.W_q.weight (Float), "
       "got Double",
       [&] { with(&DecoderState::enc_outputs, state.enc_outputs.to(torch::kDouble)); }});
  cases.push_back({d, "state must come from init_state",
                   [&] { with(&DecoderState::enc_outputs, torch::Tensor()); }});
  cases.push_back({d, "state.hidden_state must have shape [num_layers=2, batch_size=2",
                   [&] { with(&DecoderState::hidden_state, state.hidden_state[0]); }});
  expect_all_rejected(cases);
}

TEST(ReliabilityArguments, EncoderDecoder) {
  auto model =
      d2l::testing::make_model(true, d2l::Seq2SeqOptions(kVocab, kEmbed, kHiddens, kLayers));
  const auto X = torch::randint(0, kVocab, {2, 5}), Y = torch::randint(0, kVocab, {2, 3});
  const auto lens = torch::tensor({3, 5});
  const std::string fn = "d2l::EncoderDecoder";
  std::vector<BadCall> cases;
  add_layout_cases(cases, fn, "enc_X", X,
                   [&](const torch::Tensor& t) { model->forward(t, Y, lens); });
  add_layout_cases(cases, fn, "dec_X", Y,
                   [&](const torch::Tensor& t) { model->forward(X, t, lens); });
  add_layout_cases(cases, fn, "enc_valid_lens", lens,
                   [&](const torch::Tensor& t) { model->forward(X, Y, t); });
  cases.push_back({fn, "enc_valid_lens must hold non-negative lengths, got -5", [&] {
                     model->forward(X, Y, torch::tensor({-5, 1}));
                   }});
  cases.push_back({fn, "enc_valid_lens must have shape [batch_size=2], got [1]",
                   [&] { model->forward(X, Y, torch::tensor({1})); }});
  expect_all_rejected(cases);
}

// Deep copies to compare with after a call: values, shapes, strides, dtype.
std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> copies;
  for (const auto& t : ts) copies.push_back(t.defined() ? t.clone() : t);
  return copies;
}

void expect_unchanged(const std::vector<torch::Tensor>& before,
                      const std::vector<torch::Tensor>& after) {
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    SCOPED_TRACE("argument " + std::to_string(i));
    ASSERT_EQ(before[i].defined(), after[i].defined());
    if (!before[i].defined()) continue;
    EXPECT_EQ(before[i].sizes(), after[i].sizes());
    EXPECT_EQ(before[i].scalar_type(), after[i].scalar_type());
    EXPECT_TRUE(torch::equal(before[i], after[i]));
  }
}

TEST(ReliabilityArguments, ModulesDoNotModifyTheirInputs) {
  torch::manual_seed(60);
  {
    d2l::NWKernelRegression net;
    const std::vector<torch::Tensor> in{torch::rand({3}), torch::rand({3, 4}), torch::rand({3, 4})};
    const auto before = snapshot(in);
    net->forward(in[0], in[1], in[2]).sum().backward();
    expect_unchanged(before, in);
  }
  {
    d2l::MultiHeadAttention mha(5, 6, 7, 8, 2, 0.0);
    const std::vector<torch::Tensor> in{torch::randn({2, 3, 6}), torch::randn({2, 4, 5}),
                                        torch::randn({2, 4, 7}),
                                        torch::tensor({{1.0, 9.0, 0.0}, {4.0, 2.0, 3.0}})};
    const auto before = snapshot(in);
    mha->forward(in[0], in[1], in[2], in[3]).sum().backward();
    expect_unchanged(before, in);
  }
  const d2l::Seq2SeqOptions o(kVocab, kEmbed, kHiddens, kLayers);
  for (bool attention : {false, true}) {
    auto model = d2l::testing::make_model(attention, o);
    const std::vector<torch::Tensor> in{torch::randint(0, kVocab, {2, 5}),
                                        torch::randint(0, kVocab, {2, 3}), torch::tensor({3, 9})};
    const auto before = snapshot(in);
    std::get<0>(model->forward(in[0], in[1], in[2])).sum().backward();
    expect_unchanged(before, in);
  }
  {
    d2l::Seq2SeqEncoder encoder(o);
    d2l::Seq2SeqAttentionDecoder decoder(o);
    const auto X = torch::randint(0, kVocab, {2, 4});
    const auto enc = encoder->forward(X);
    const auto state = decoder->init_state(enc, torch::tensor({2, 4}));
    const std::vector<torch::Tensor> in{X,
                                        enc.outputs,
                                        enc.hidden_state,
                                        state.enc_outputs,
                                        state.hidden_state,
                                        state.enc_valid_lens};
    const auto before = snapshot(in);
    std::get<0>(decoder->forward(X, state)).sum().backward();
    expect_unchanged(before, in);
  }
}

}  // namespace
