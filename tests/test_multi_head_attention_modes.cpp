// MultiHeadAttention (continued from test_multi_head_attention.cpp): the
// book's fixtures, empty sizes, dropout, the options' backend and recording,
// forward against the functional form and forward_with_weights, clone, save
// and load, containers, and CUDA.

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

TEST(MultiHeadAttention, MatchesTheBookFixtures) {
  for (const std::string case_name : {"mha_book", "mha_bias_odd"}) {
    for (const char* dtype : kParityDtypes) {
      const auto fixture = d2l::testing::load_fixture(case_name + "_" + dtype);
      const auto size = [&](const char* name) { return int64_t(fixture.scalar(name)); };
      d2l::MultiHeadAttention attention(size("key_size"), size("query_size"), size("value_size"),
                                        size("num_hiddens"), size("num_heads"),
                                        fixture.scalar("dropout"), fixture.scalar("bias") != 0);
      attention->to(fixture.tensor("queries").scalar_type());
      attention->eval();
      load_parameters(*attention, fixture);
      const auto in = leaf_inputs(fixture);
      const auto out = attention(in.queries, in.keys, in.values, fixture.tensor("valid_lens"));
      (out * fixture.tensor("G")).sum().backward();
      expect_matches(out, fixture, "output");
      expect_matches(attention->attention->attention_weights, fixture, "attention_weights");
      expect_input_gradients(in, fixture);
      for (const auto& p : attention->named_parameters()) {
        expect_matches(p.value().grad(), fixture, "grad." + p.key());
      }
    }
  }
}

TEST(MultiHeadAttention, EmptyBatchAndNoKeys) {
  d2l::MultiHeadAttention attention(3, 4, 5, 6, 3, 0.0);
  const auto empty = attention(torch::randn({0, 2, 4}), torch::randn({0, 3, 3}),
                               torch::randn({0, 3, 5}), torch::zeros({0}, torch::kLong));
  EXPECT_EQ(empty.sizes(), (std::vector<int64_t>{0, 2, 6}));
  const auto no_keys = attention(torch::randn({2, 2, 4}), torch::randn({2, 0, 3}),
                                 torch::randn({2, 0, 5}), torch::tensor({0, 0}));
  EXPECT_EQ(no_keys.sizes(), (std::vector<int64_t>{2, 2, 6}));
  EXPECT_EQ(no_keys.abs().sum().item<float>(), 0);
  EXPECT_EQ(attention->attention->attention_weights.sizes(), (std::vector<int64_t>{6, 2, 0}));
}

TEST(MultiHeadAttention, DropoutOnlyInTraining) {
  d2l::MultiHeadAttention attention(4, 4, 4, 8, 2, 0.5);
  const auto X = torch::randn({2, 5, 4});
  attention->eval();
  const auto a = attention(X, X, X);
  EXPECT_TRUE(torch::equal(a, attention(X, X, X)));
  attention->train();
  EXPECT_TRUE(attention->attention->dropout->is_training());
  EXPECT_FALSE(torch::equal(attention(X, X, X), a));
}

// path and record_attention_weights reach the inner DotProductAttention (and
// survive clone()); every path gives the same numbers.
TEST(MultiHeadAttention, OptionsChooseThePathAndRecording) {
  torch::manual_seed(12);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 5});
  const auto lens = torch::tensor({2, 5});
  d2l::MultiHeadAttention reference(d2l::MultiHeadAttentionOptions(3, 4, 5, 6, 3));
  const auto expected = reference(q, k, v, lens);
  for (const auto path : {d2l::AttentionBackend::kComposite, d2l::AttentionBackend::kFused}) {
    d2l::MultiHeadAttention attention(d2l::MultiHeadAttentionOptions(3, 4, 5, 6, 3)
                                          .backend(path)
                                          .record_attention_weights(false));
    {
      torch::NoGradGuard no_grad;
      const auto from = reference->named_parameters();
      for (auto& p : attention->named_parameters()) p.value().copy_(from[p.key()]);
    }
    for (const auto& module :
         {attention.ptr(),
          std::dynamic_pointer_cast<d2l::MultiHeadAttentionImpl>(attention->clone())}) {
      EXPECT_EQ(module->attention->options.backend(), path);
      EXPECT_FALSE(module->attention->options.record_attention_weights());
      EXPECT_LT(max_rel_error(module->forward(q, k, v, lens), expected), 1e-6);
      EXPECT_FALSE(module->attention->attention_weights.defined());
    }
  }
  EXPECT_EQ(reference->attention->attention_weights.sizes(), (std::vector<int64_t>{6, 3, 5}));
}

TEST(MultiHeadAttention, ForwardIsTheFunctionalFormWithTheModuleWeights) {
  torch::manual_seed(14);
  d2l::MultiHeadAttention m(3, 4, 5, 6, 3, 0.2, /*bias=*/true);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 5});
  const auto lens = torch::tensor({{2, 5, 0}, {1, 4, 9}});
  namespace F = d2l::functional;
  auto o = F::MultiHeadAttentionFuncOptions(3, m->W_q->weight, m->W_k->weight, m->W_v->weight,
                                            m->W_o->weight)
               .b_q(m->W_q->bias)
               .b_k(m->W_k->bias)
               .b_v(m->W_v->bias)
               .b_o(m->W_o->bias)
               .dropout(0.2);
  for (bool training : {false, true}) {
    m->train(training);
    torch::manual_seed(5);
    const auto out = m(q, k, v, lens);
    torch::manual_seed(5);
    const auto [f_out, f_weights] = F::multi_head_attention(q, k, v, o.valid_lens(lens).training(training));
    EXPECT_TRUE(torch::equal(out, f_out)) << "training=" << training;
    EXPECT_TRUE(torch::equal(m->attention->attention_weights, f_weights)) << training;
  }
  EXPECT_FALSE(
      std::get<1>(F::multi_head_attention(q, k, v, o.valid_lens(lens).need_weights(false)))
          .defined());
  const std::string fn = "d2l::multi_head_attention: ";
  auto error = [&](F::MultiHeadAttentionFuncOptions bad) {
    return error_message([&] { F::multi_head_attention(q, k, v, bad.valid_lens(lens)); });
  };
  EXPECT_THAT(error(o.W_o(torch::randn({6, 5}))),
              HasSubstr(fn + "W_o must have shape [6, 6], got [6, 5]"));
  EXPECT_THAT(error(o.W_o(m->W_o->weight).b_q(torch::randn({5}))),
              HasSubstr(fn + "b_q must have shape [6] or be undefined, got [5]"));
  EXPECT_THAT(error(o.b_q({}).num_heads(4)),
              HasSubstr(fn + "num_hiddens (the rows of W_q) must be divisible by num_heads, got "
                             "W_q [6, 4] and num_heads=4"));
  EXPECT_THAT(error(o.num_heads(3).dropout(std::nan(""))),
              HasSubstr(fn + "dropout must be a probability in [0, 1], got nan"));
}

// forward_with_weights returns what forward records, with the graph, and
// leaves the recorded weights alone, recording on or off.
TEST(MultiHeadAttention, ForwardWithWeightsLeavesTheRecordedWeightsAlone) {
  torch::manual_seed(15);
  const auto q = torch::randn({2, 3, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 5});
  const auto lens = torch::tensor({2, 5});
  for (bool record : {true, false}) {
    d2l::MultiHeadAttention m(
        d2l::MultiHeadAttentionOptions(3, 4, 5, 6, 3).record_attention_weights(record));
    m->eval();
    const auto [out, weights] = m->forward_with_weights(q, k, v, lens);
    EXPECT_FALSE(m->attention->attention_weights.defined()) << record;
    EXPECT_TRUE(weights.requires_grad()) << record;
    EXPECT_EQ(weights.sizes(), (std::vector<int64_t>{6, 3, 5})) << record;
    EXPECT_TRUE(torch::equal(m(q, k, v, lens), out)) << record;
    if (record) EXPECT_TRUE(torch::equal(m->attention->attention_weights, weights));
  }
}

TEST(MultiHeadAttention, CloneSaveLoadAndContainers) {
  d2l::MultiHeadAttention original(3, 4, 5, 6, 3, 0.1, true);
  auto copy = std::dynamic_pointer_cast<d2l::MultiHeadAttentionImpl>(original->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(copy->options.bias());
  {
    torch::NoGradGuard no_grad;
    copy->W_o->bias.add_(1);
  }
  EXPECT_FALSE(torch::equal(copy->W_o->bias, original->W_o->bias));
  EXPECT_TRUE(torch::equal(copy->W_q->weight, original->W_q->weight));

  std::stringstream buffer;
  torch::save(original, buffer);
  d2l::MultiHeadAttention loaded(3, 4, 5, 6, 3, 0.1, true);
  torch::load(loaded, buffer);
  original->eval();
  loaded->eval();
  const auto q = torch::randn({2, 1, 4}), k = torch::randn({2, 5, 3}), v = torch::randn({2, 5, 5});
  EXPECT_TRUE(torch::equal(original(q, k, v), loaded(q, k, v)));

  torch::nn::AnyModule any(loaded);
  EXPECT_EQ(any.forward(q, k, v).sizes(), (std::vector<int64_t>{2, 1, 6}));
  // AnyModule takes the mask as it is declared: an AttentionMask.
  EXPECT_EQ(any.forward(q, k, v, d2l::AttentionMask(torch::tensor({1, 4}))).sizes(),
            (std::vector<int64_t>{2, 1, 6}));
}

TEST(MultiHeadAttention, RunsOnCudaWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  d2l::MultiHeadAttention attention(3, 4, 5, 6, 3, 0.0, true);
  const auto q = torch::randn({2, 2, 4}), k = torch::randn({2, 3, 3}), v = torch::randn({2, 3, 5});
  const auto lens = torch::tensor({{1, 3}, {2, 1}});
  const auto cpu_out = attention(q, k, v, lens);
  attention->to(torch::kCUDA);
  const auto out = attention(q.cuda(), k.cuda(), v.cuda(), lens.cuda());
  EXPECT_TRUE(out.is_cuda());
  EXPECT_TRUE(attention->attention->attention_weights.is_cuda());
  EXPECT_LT(max_rel_error(out.cpu(), cpu_out), 1e-5);
}

// Without recorded weights multi-head attention takes SDPA on CUDA, with the
// per-head lengths (each repeated num_heads times) made into its mask:
// forward and backward against the CPU, for every kind of lengths.
TEST(MultiHeadAttention, SdpaOnCudaMatchesTheCpuForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(21);
  const auto options = d2l::MultiHeadAttentionOptions(6, 5, 7, 8, 4).bias(true);
  const auto q0 = torch::randn({3, 5, 5}, torch::kDouble),
             k0 = torch::randn({3, 9, 6}, torch::kDouble),
             v0 = torch::randn({3, 9, 7}, torch::kDouble);
  for (const auto& lens : {torch::Tensor(), torch::tensor({4, 9, 2}), torch::tensor({0, 3, 12}),
                           torch::tensor({5, 5, 5}), torch::randint(0, 11, {3, 5})}) {
    for (bool record : {false, true}) {
      d2l::MultiHeadAttention attention(
          d2l::MultiHeadAttentionOptions(options).record_attention_weights(record));
      attention->to(torch::kDouble);
      auto run = [&](const torch::Device& device) {
        // Copies: to(kCPU) of a CPU tensor is the tensor itself.
        auto q = q0.to(device).clone().requires_grad_(), k = k0.to(device).clone().requires_grad_(),
             v = v0.to(device).clone().requires_grad_();
        attention->to(device);
        attention->zero_grad(/*set_to_none=*/true);
        const auto out = attention(q, k, v, lens.defined() ? lens.to(device) : lens);
        out.pow(2).sum().backward();
        return std::vector<torch::Tensor>{out.cpu(), q.grad().cpu(), k.grad().cpu(), v.grad().cpu(),
                                          attention->W_q->weight.grad().cpu()};
      };
      const auto cpu = run(torch::kCPU);
      const auto cuda = run(torch::kCUDA);
      const std::string what =
          (lens.defined() ? std::to_string(lens.dim()) + "-D lengths" : std::string("no lengths")) +
          (record ? ", weights" : ", no weights");
      const char* names[] = {"output", "dq", "dk", "dv", "dW_q"};
      for (size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_LT(max_rel_error(cuda[i], cpu[i]), 1e-9) << what << " " << names[i];
      }
    }
  }
}

}  // namespace
