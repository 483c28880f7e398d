// d2l 1.0's decoders' caches. TransformerDecoder's step cache (Note [The
// 1.0 decoder's step cache] in src/v1/transformer_decoder.cpp): with no
// attention weights recorded, evaluation steps without autograd give the
// outputs and states of the book's code (which runs when weights are
// recorded), through beam reorders, branches and sources with no valid
// step. Seq2SeqAttentionDecoder's projected keys: made once a decoding
// without autograd, never used with it.

#include <d2l/generate.h>
#include <d2l/v1/seq2seq.h>
#include <d2l/v1/transformer.h>
#include <gtest/gtest.h>

#include <vector>

namespace {

constexpr int64_t kSrcVocab = 12, kTgtVocab = 11, kBatch = 3, kSrcSteps = 7;

struct Net {
  d2l::v1::TransformerEncoder encoder{kSrcVocab, 16, 32, 4, 2, 0.0};
  d2l::v1::TransformerDecoder decoder{kTgtVocab, 16, 32, 4, 2, 0.0};
};

Net make_net() {
  torch::manual_seed(11);
  Net net;
  // The lazy layers' widths, fixed by one call.
  const auto X = torch::randint(kSrcVocab, {1, 2}, torch::kLong);
  net.decoder->forward(X, net.decoder->init_state(net.encoder->forward(X), {}));
  net.encoder->eval();
  net.decoder->eval();
  return net;
}

void record_weights(Net& net, bool on) {
  for (int64_t b = 0; b < net.decoder->num_blks; ++b) {
    auto blk = net.decoder->block(b);
    blk->attention1->attention->options.record_attention_weights(on);
    blk->attention2->attention->options.record_attention_weights(on);
  }
}

// One step of the decoder on `tokens` (B, 1) from `state`, the book's code
// (weights recorded) or the cache's.
std::tuple<torch::Tensor, d2l::DecoderState> step(Net& net, const torch::Tensor& tokens,
                                                  const d2l::DecoderState& state, bool cached) {
  record_weights(net, !cached);
  return net.decoder->forward(tokens, state);
}

void expect_same_states(const d2l::DecoderState& cached, const d2l::DecoderState& book) {
  EXPECT_NE(cached.cache, nullptr);
  EXPECT_EQ(book.cache, nullptr);
  ASSERT_EQ(cached.key_values.size(), book.key_values.size());
  for (size_t i = 0; i < book.key_values.size(); ++i) {
    // Block 0's inputs are the embeddings; later blocks' differ by rounding.
    ASSERT_EQ(cached.key_values[i].sizes(), book.key_values[i].sizes()) << "block " << i;
    EXPECT_TRUE(torch::allclose(cached.key_values[i], book.key_values[i], 1e-5, 1e-6))
        << "block " << i;
  }
}

// Advances both states `steps` times on the same random tokens and checks
// each step's outputs and states.
void advance(Net& net, d2l::DecoderState& cached, d2l::DecoderState& book, int steps) {
  for (int s = 0; s < steps; ++s) {
    const auto tokens = torch::randint(kTgtVocab, {book.enc_outputs.size(0), 1}, torch::kLong);
    auto [yc, nc] = step(net, tokens, cached, true);
    auto [yb, nb] = step(net, tokens, book, false);
    EXPECT_TRUE(torch::allclose(yc, yb, 1e-5, 1e-5))
        << "step " << s << ": largest difference " << (yc - yb).abs().max().item<double>();
    expect_same_states(nc, nb);
    cached = std::move(nc);
    book = std::move(nb);
  }
}

struct Start {
  d2l::DecoderState cached, book;
};

Start start(Net& net, const torch::Tensor& lens) {
  const auto X = torch::randint(kSrcVocab, {kBatch, kSrcSteps}, torch::kLong);
  const auto state = net.decoder->init_state(net.encoder->forward(X, lens), lens);
  return {state, state};
}

TEST(V1DecoderStepCache, StepsGiveTheBooksOutputsAndStates) {
  Net net = make_net();
  torch::NoGradGuard no_grad;
  auto [cached, book] = start(net, torch::tensor({7, 4, 2}, torch::kLong));
  advance(net, cached, book, 6);
  // Without lengths too.
  auto [all_cached, all_book] = start(net, torch::Tensor());
  advance(net, all_cached, all_book, 3);
  // A source with no valid step: the library's masked_softmax gives its row
  // zero weights (where the book's spreads them over every step:
  // docs/api.md), and so does the cache's attention.
  auto [empty_cached, empty_book] = start(net, torch::tensor({7, 0, 3}, torch::kLong));
  advance(net, empty_cached, empty_book, 3);
}

TEST(V1DecoderStepCache, BeamReordersAndBranchesGiveTheBooksOutputs) {
  Net net = make_net();
  torch::NoGradGuard no_grad;
  auto [cached, book] = start(net, torch::tensor({5, 7, 3}, torch::kLong));
  advance(net, cached, book, 3);
  // Rows reordered as a beam reorders them (one source's rows), and as a
  // batch drops a finished row and repeats another (rows of other sources).
  const auto beam = torch::tensor({2, 0, 0}, torch::kLong);
  auto beam_cached = d2l::select_rows(cached, beam, /*same_sources=*/false);
  auto beam_book = d2l::select_rows(book, beam, false);
  advance(net, beam_cached, beam_book, 3);
  const auto fewer = torch::tensor({1, 1}, torch::kLong);
  auto fewer_cached = d2l::select_rows(beam_cached, fewer, false);
  auto fewer_book = d2l::select_rows(beam_book, fewer, false);
  advance(net, fewer_cached, fewer_book, 2);
  // A state advanced twice (two branches of one prefix): each branch is
  // the book's, the second rebuilt from the state's own key_values.
  auto branch_cached = cached, branch_book = book;
  advance(net, cached, book, 2);
  advance(net, branch_cached, branch_book, 2);
}

TEST(V1DecoderStepCache, TrainingAutogradAndRecordedWeightsRunTheBooksCode) {
  Net net = make_net();
  auto [cached, book] = start(net, torch::tensor({7, 4, 2}, torch::kLong));
  const auto tokens = torch::zeros({kBatch, 1}, torch::kLong);
  {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(std::get<1>(step(net, tokens, book, /*cached=*/false)).cache, nullptr);
    EXPECT_NE(std::get<1>(step(net, tokens, cached, /*cached=*/true)).cache, nullptr);
  }
  // Autograd recording (evaluation mode), then training.
  EXPECT_EQ(std::get<1>(step(net, tokens, cached, true)).cache, nullptr);
  net.decoder->train();
  torch::NoGradGuard no_grad;
  EXPECT_EQ(std::get<1>(step(net, tokens, cached, true)).cache, nullptr);
}

TEST(V1AttentionDecoderKeys, ProjectedOnceWithoutAutogradAndNeverWithIt) {
  torch::manual_seed(5);
  d2l::v1::Seq2SeqEncoder encoder(kSrcVocab, 8, 16, 2);
  d2l::v1::Seq2SeqAttentionDecoder decoder(kTgtVocab, 8, 16, 2);
  encoder->eval();
  decoder->eval();
  const auto lens = torch::tensor({7, 4, 2}, torch::kLong);
  const auto X = torch::randint(kSrcVocab, {kBatch, kSrcSteps}, torch::kLong);
  const auto first = decoder->init_state(encoder->forward(X, lens), lens);
  // Without autograd (the cache) and with it (the book's projection at every
  // call): the same numbers, to the bit.
  const auto run = [&](d2l::DecoderState& state, const torch::Tensor& tokens, bool grad) {
    torch::AutoGradMode mode(grad);
    auto [Y, next] = decoder->forward(tokens, state);
    state = std::move(next);
    return Y.detach();
  };
  d2l::DecoderState cached = first, book = first;
  std::shared_ptr<d2l::DecoderCache> made;
  for (int s = 0; s < 4; ++s) {
    if (s == 2) {  // a beam's reorder
      const auto index = torch::tensor({2, 0, 0}, torch::kLong);
      cached = d2l::select_rows(cached, index, /*same_sources=*/false);
      book = d2l::select_rows(book, index, false);
      made = cached.cache;
    }
    const auto tokens = torch::randint(kTgtVocab, {kBatch, 1}, torch::kLong);
    EXPECT_TRUE(torch::equal(run(cached, tokens, false), run(book, tokens, true))) << "step " << s;
    ASSERT_NE(cached.cache, nullptr);
    // Made at the first step, then kept (a reorder selects its rows).
    if (s == 0) made = cached.cache;
    EXPECT_EQ(cached.cache, made) << "step " << s;
    EXPECT_EQ(book.cache, nullptr);
  }
  // With autograd, a state holding the cache: W_k gets its gradient.
  decoder->zero_grad();
  torch::AutoGradMode grad(true);
  std::get<0>(decoder->forward(torch::zeros({kBatch, 1}, torch::kLong), cached)).sum().backward();
  const auto& g = decoder->attention->W_k->weight.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.abs().sum().item<double>(), 0.0);
}

}  // namespace
