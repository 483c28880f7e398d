// Seq2SeqAttentionDecoder's keys, projected once per sequence: the decoder
// equals the book's step-by-step loop, which calls the AdditiveAttention
// module (and so W_k) at every step, and W_k appears once in the autograd
// graph of a whole sequence.

#include <d2l/seq2seq.h>
#include <gtest/gtest.h>

#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "seq2seq_models.h"

namespace {

using d2l::testing::kEmbed;
using d2l::testing::kHiddens;
using d2l::testing::kLayers;
using d2l::testing::kVocab;

// How many autograd nodes of the graph behind `root` take `leaf` as an input:
// one per use of the parameter in the forward pass.
int64_t uses_in_graph(const torch::Tensor& leaf, const torch::Tensor& root) {
  const auto accumulator = torch::autograd::impl::grad_accumulator(leaf);
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{root.grad_fn().get()};
  int64_t uses = 0;
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function.get() == accumulator.get()) ++uses;
      stack.push_back(edge.function.get());
    }
  }
  return uses;
}

// The decoder of the book, step by step, calling the AdditiveAttention module
// (and so W_k) at every step: the oracle for the projected-keys path.
std::tuple<torch::Tensor, torch::Tensor> book_attention_decoder(d2l::Seq2SeqAttentionDecoderImpl& d,
                                                                const torch::Tensor& X,
                                                                const d2l::DecoderState& state) {
  const auto embedded = d.embedding(X).permute({1, 0, 2});
  auto hidden_state = state.hidden_state;
  std::vector<torch::Tensor> outputs, weights;
  for (int64_t t = 0; t < embedded.size(0); ++t) {
    const auto query = hidden_state[-1].unsqueeze(1);
    const auto context =
        d.attention(query, state.enc_outputs, state.enc_outputs, state.enc_valid_lens);
    const auto x = torch::cat({context, embedded[t].unsqueeze(1)}, -1);
    torch::Tensor out;
    std::tie(out, hidden_state) = d.rnn(x.permute({1, 0, 2}), hidden_state);
    outputs.push_back(out);
    weights.push_back(d.attention->attention_weights);
  }
  return {d.dense(torch::cat(outputs, 0)).permute({1, 0, 2}), torch::cat(weights, 1)};
}

TEST(Seq2SeqAttentionDecoder, EqualsCallingTheAttentionModuleAtEveryStep) {
  torch::manual_seed(3);
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers, 0.2);
    d2l::Seq2SeqAttentionDecoder decoder(kVocab, kEmbed, kHiddens, kLayers, 0.2);
    encoder->to(dtype);
    decoder->to(dtype);
    encoder->eval();
    decoder->eval();
    const auto X = torch::randint(kVocab, {3, 9});
    const auto Y = torch::randint(kVocab, {3, 6});
    for (const auto& lens : {torch::Tensor(), torch::tensor({9, 4, 1})}) {
      const auto state = decoder->init_state(encoder(X), lens);
      const auto [output, next] = decoder(Y, state);
      const auto [book_output, book_weights] = book_attention_decoder(*decoder, Y, state);
      EXPECT_TRUE(torch::equal(output, book_output));
      EXPECT_TRUE(torch::equal(decoder->attention_weights(), book_weights));
    }
  }
}

TEST(Seq2SeqAttentionDecoder, ProjectsTheKeysOncePerSequence) {
  torch::manual_seed(4);
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqAttentionDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  const auto X = torch::randint(kVocab, {2, 5}), Y = torch::randint(kVocab, {2, 7});
  const auto lens = torch::tensor({5, 3});
  const auto& W_k = decoder->attention->W_k->weight;
  const auto& W_q = decoder->attention->W_q->weight;

  const auto state = decoder->init_state(encoder(X), lens);
  const auto [output, next] = decoder(Y, state);
  EXPECT_EQ(uses_in_graph(W_k, output), 1);
  EXPECT_EQ(uses_in_graph(W_q, output), 7);  // the queries change at every step

  // Decoding one step per call, as in prediction, reuses the state's keys.
  auto step_state = decoder->init_state(encoder(X), lens);
  torch::Tensor last;
  for (int64_t t = 0; t < Y.size(1); ++t) {
    std::tie(last, step_state) = decoder(Y.slice(1, t, t + 1), step_state);
  }
  EXPECT_EQ(uses_in_graph(W_k, last), 1);

  // The counter does see per-step projections: the book's loop makes seven.
  const auto [book_output, book_weights] = book_attention_decoder(*decoder, Y, state);
  EXPECT_EQ(uses_in_graph(W_k, book_output), 7);
}

TEST(Seq2SeqAttentionDecoder, KeepsItsWeightsWhenTheAttentionRecordsNone) {
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqAttentionDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  decoder->attention->options.record_attention_weights(false);
  const auto X = torch::randint(kVocab, {2, 5}), Y = torch::randint(kVocab, {2, 3});
  decoder(Y, decoder->init_state(encoder(X), torch::tensor({5, 2})));
  EXPECT_FALSE(decoder->attention->attention_weights.defined());
  EXPECT_EQ(decoder->attention_weights().sizes(), (std::vector<int64_t>{2, 3, 5}));
}

TEST(Seq2SeqAttentionDecoder, KeepsItsKeysInTheStatesCache) {
  torch::manual_seed(5);
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqAttentionDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  const auto X = torch::randint(kVocab, {2, 5}), Y = torch::randint(kVocab, {2, 3});
  const auto lens = torch::tensor({5, 2});
  auto state = decoder->init_state(encoder(X), lens);
  EXPECT_NE(state.cache, nullptr);
  const auto expected = std::get<0>(decoder(Y, state));
  // The deprecated field is still filled for its readers, and no longer read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_TRUE(torch::allclose(state.projected_keys, decoder->attention->W_k(state.enc_outputs)));
  auto ignored = state;
  ignored.projected_keys = torch::Tensor();
#pragma GCC diagnostic pop
  EXPECT_TRUE(torch::equal(std::get<0>(decoder(Y, ignored)), expected));
  // New encoder outputs in a state: their own keys, not the cache's.
  auto replaced = state;
  replaced.enc_outputs = state.enc_outputs * 2;
  EXPECT_TRUE(torch::allclose(std::get<0>(decoder(Y, replaced)),
                              std::get<0>(book_attention_decoder(*decoder, Y, replaced))));
  EXPECT_FALSE(torch::allclose(std::get<0>(decoder(Y, replaced)), expected));
}

// Note [Caches keyed on weights]: keys projected before W_k changed are not
// used after it: an optimizer step (in place: the version changes), a load
// that swaps the data, `to`. (The bytes are not read at every step: an edit
// through .data() in the middle of a decoding is the one change not seen.)
TEST(Seq2SeqAttentionDecoder, ProjectsTheKeysAgainAfterWkChanges) {
  torch::manual_seed(6);
  torch::NoGradGuard no_grad;
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqAttentionDecoder decoder(kVocab, kEmbed, kHiddens, kLayers);
  const auto X = torch::randint(kVocab, {2, 5}), Y = torch::randint(kVocab, {2, 3});
  const auto lens = torch::tensor({5, 2});
  const auto expect_the_books = [&](const d2l::DecoderState& state) {
    const auto [book, book_weights] = book_attention_decoder(*decoder, Y, state);
    EXPECT_TRUE(torch::allclose(std::get<0>(decoder(Y, state)), book));
  };
  const auto state = decoder->init_state(encoder(X), lens);
  auto W_k = decoder->attention->W_k->weight;
  W_k.mul_(0.5);
  expect_the_books(state);
  W_k.set_data(W_k.detach() * 2);
  expect_the_books(state);
  decoder->to(torch::kDouble);
  encoder->to(torch::kDouble);
  const auto twice = decoder->init_state(encoder(X), lens);
  decoder->attention->W_k->weight.set_data(decoder->attention->W_k->weight.detach() + 1);
  expect_the_books(twice);
}

}  // namespace
