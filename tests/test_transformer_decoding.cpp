// The Transformer decoder's step cache (Note [The decoder's step cache]):
// states advanced more than once, buffers that grow without copying the
// past; and what the Transformer's classes refuse.

#include <d2l/seq2seq.h>
#include <d2l/state_dict.h>
#include <d2l/transformer.h>

#include <gmock/gmock.h>

#include <sstream>
#include <thread>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kVocab = 13, kHiddens = 8, kHeads = 2, kLayers = 2;

d2l::EncoderDecoder small_transformer(double dropout = 0.0) {
  torch::manual_seed(7);
  return d2l::EncoderDecoder{
      d2l::TransformerEncoder(kVocab, kHiddens, kHiddens, kHiddens, kHiddens, {kHiddens}, kHiddens,
                              16, kHeads, kLayers, dropout),
      d2l::TransformerDecoder(kVocab, kHiddens, kHiddens, kHiddens, kHiddens, {kHiddens}, kHiddens,
                              16, kHeads, kLayers, dropout)};
}

struct Decoding {
  d2l::EncoderDecoder model = small_transformer();
  std::shared_ptr<d2l::TransformerDecoderImpl> decoder =
      std::dynamic_pointer_cast<d2l::TransformerDecoderImpl>(model->decoder);
  torch::Tensor enc_X = torch::randint(kVocab, {3, 5}, torch::kLong);
  torch::Tensor lens = torch::tensor({5, 2, 4});

  Decoding() { model->eval(); }
  d2l::DecoderState init() {
    return decoder->init_state(model->encoder->forward(enc_X, lens), lens);
  }
  // The decoder's outputs for `tokens` (B, steps), one call a step from `state`.
  torch::Tensor run(d2l::DecoderState& state, const torch::Tensor& tokens) {
    std::vector<torch::Tensor> outputs;
    for (int64_t t = 0; t < tokens.size(1); ++t) {
      torch::Tensor Y;
      std::tie(Y, state) = decoder->forward(tokens.slice(1, t, t + 1), state);
      outputs.push_back(Y);
    }
    return torch::cat(outputs, 1);
  }
};

TEST(TransformerDecoding, TheCacheGivesTheBooksNumbersInEveryDtype) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    Decoding d;
    d.model->to(dtype);
    const auto tokens = torch::randint(kVocab, {3, 11}, torch::kLong);
    torch::Tensor cached, book;
    {
      torch::NoGradGuard no_grad;
      auto state = d.init();
      cached = d.run(state, tokens);
    }
    {
      auto state = d.init();  // autograd on: the book's concatenation
      book = d.run(state, tokens);
      EXPECT_EQ(state.cache, nullptr);
    }
    EXPECT_LT(d2l::testing::max_rel_error(cached, book), dtype == torch::kFloat ? 1e-5 : 1e-12)
        << c10::toString(dtype);
  }
}

// The book's Transformer at its sizes (32 hidden units, 4 heads, 2 blocks).
d2l::EncoderDecoder book_sized_transformer() {
  torch::manual_seed(17);
  return d2l::EncoderDecoder{
      d2l::TransformerEncoder(kVocab, 32, 32, 32, 32, {32}, 32, 64, 4, 2, 0.1),
      d2l::TransformerDecoder(kVocab, 32, 32, 32, 32, {32}, 32, 64, 4, 2, 0.1)};
}

TEST(TransformerDecoding, TheCachedStepIsTheBooksAtBatch1And64WithAndWithoutLengths) {
  for (const int64_t batch : {1, 64}) {
    for (const auto dtype : {torch::kFloat, torch::kDouble}) {
      for (const bool with_lens : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "batch " << batch << ", " << c10::toString(dtype)
                                          << (with_lens ? ", enc_valid_lens" : ""));
        auto model = book_sized_transformer();
        model->to(dtype);
        model->eval();
        auto decoder = std::dynamic_pointer_cast<d2l::TransformerDecoderImpl>(model->decoder);
        const auto enc_X = torch::randint(kVocab, {batch, 10}, torch::kLong);
        const auto lens =
            with_lens ? torch::randint(1, 11, {batch}, torch::kLong) : torch::Tensor();
        const auto tokens = torch::randint(kVocab, {batch, 12}, torch::kLong);
        // Per step: the output, then every block's self- and cross-attention weights.
        const auto decode = [&](bool cached) {
          torch::AutoGradMode grad(!cached);
          auto state = decoder->init_state(model->encoder->forward(enc_X, lens), lens);
          std::vector<torch::Tensor> seen;
          for (int64_t t = 0; t < tokens.size(1); ++t) {
            torch::Tensor Y;
            std::tie(Y, state) = decoder->forward(tokens.slice(1, t, t + 1), state);
            EXPECT_EQ(state.cache != nullptr, cached);
            seen.push_back(Y);
            for (const auto& kind : decoder->block_attention_weights()) {
              seen.insert(seen.end(), kind.begin(), kind.end());
            }
          }
          return seen;
        };
        const auto cached = decode(true), book = decode(false);
        ASSERT_EQ(cached.size(), book.size());
        for (size_t k = 0; k < cached.size(); ++k) {
          ASSERT_EQ(cached[k].sizes(), book[k].sizes()) << k;
          EXPECT_LT(d2l::testing::max_rel_error(cached[k], book[k]),
                    dtype == torch::kFloat ? 2e-5 : 1e-12)
              << k;
        }
      }
    }
  }
}

TEST(TransformerDecoding, ADecodingStepRunsTheSmallHeadsKernels) {
  // What each attention of a block explains for the call the decoder makes
  // at step 5 of a decoding: the cache of the block's self-attention and of
  // the encoder's outputs, and one new token.
  auto model = book_sized_transformer();
  model->eval();
  auto decoder = std::dynamic_pointer_cast<d2l::TransformerDecoderImpl>(model->decoder);
  torch::NoGradGuard no_grad;
  for (const int64_t batch : {1, 64}) {
    const auto enc = model->encoder->forward(torch::randint(kVocab, {batch, 10}, torch::kLong));
    auto block = decoder->block(0);
    const auto X = torch::randn({batch, 1, 32});
    auto self_cache = block->attention1->project_memory(torch::randn({batch, 4, 32}),
                                                        torch::randn({batch, 4, 32}));
    const auto self_path = block->attention1->explain_path_cached(X, X, X, self_cache);
    EXPECT_EQ(self_path.path, "small_heads") << self_path.to_string();
    const auto cross = block->attention2->project_memory(enc.outputs, enc.outputs);
    const auto cross_path = block->attention2->explain_path_cached(
        X, {}, {}, cross, d2l::AttentionMask().valid_lens(torch::full({batch}, 7, torch::kLong)));
    EXPECT_EQ(cross_path.path, "small_heads") << cross_path.to_string();
  }
}

TEST(TransformerDecoding, InferenceModeDecodesAsNoGrad) {
  Decoding d;
  const auto tokens = torch::randint(kVocab, {3, 10}, torch::kLong);
  torch::Tensor no_grad_out, inference_out;
  {
    torch::NoGradGuard no_grad;
    auto state = d.init();
    no_grad_out = d.run(state, tokens);
  }
  {
    c10::InferenceMode inference;
    auto state = d.init();
    inference_out = d.run(state, tokens);
    EXPECT_NE(state.cache, nullptr);
  }
  EXPECT_TRUE(torch::equal(inference_out, no_grad_out));
}

TEST(TransformerDecoding, TheDeprecatedStepCacheStaysNull) {
  Decoding d;
  torch::NoGradGuard no_grad;
  auto state = d.init();
  d.run(state, torch::randint(kVocab, {3, 2}, torch::kLong));
  EXPECT_NE(state.cache, nullptr);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(state.step_cache, nullptr);
#pragma GCC diagnostic pop
}

TEST(TransformerDecoding, TheBuffersGrowWithoutCopyingThePastEveryStep) {
  Decoding d;
  torch::NoGradGuard no_grad;
  auto state = d.init();
  const auto tokens = torch::randint(kVocab, {3, 20}, torch::kLong);
  std::vector<const void*> data;
  for (int64_t t = 0; t < tokens.size(1); ++t) {
    std::tie(std::ignore, state) = d.decoder->forward(tokens.slice(1, t, t + 1), state);
    ASSERT_EQ(state.key_values[1].size(1), t + 1);
    data.push_back(state.key_values[1].data_ptr());
  }
  // Capacity 8, then 16, then 32: three buffers for twenty steps.
  EXPECT_EQ(std::set<const void*>(data.begin(), data.end()).size(), 3u);
  EXPECT_EQ(data[0], data[7]);
  EXPECT_NE(data[7], data[8]);
  EXPECT_EQ(data[8], data[15]);
}

TEST(TransformerDecoding, AStateAdvancedTwiceGivesTheSameNumbersBothTimes) {
  Decoding d;
  torch::NoGradGuard no_grad;
  auto start = d.init();
  const auto prefix = torch::randint(kVocab, {3, 3}, torch::kLong);
  d.run(start, prefix);
  const auto a = torch::randint(kVocab, {3, 4}, torch::kLong);
  const auto b = torch::randint(kVocab, {3, 4}, torch::kLong);
  auto branch_a = start, branch_b = start;
  const auto out_a = d.run(branch_a, a);
  const auto out_b = d.run(branch_b, b);  // from the same state, as beam search does
  // Advanced again, the first branch's cache is rebuilt from the state's
  // inputs in one product, which may round otherwise than step by step.
  auto again = start;
  EXPECT_LT(d2l::testing::max_rel_error(d.run(again, a), out_a), 1e-5);
  // The same without the cache.
  torch::AutoGradMode grad(true);
  auto book = start;
  book.cache = nullptr;
  EXPECT_LT(d2l::testing::max_rel_error(d.run(book, b), out_b), 1e-5);
  EXPECT_EQ(branch_a.key_values[0].size(1), 7);
}

TEST(TransformerDecoding, AStateFromTheCallerIsTakenAsItsKeyValues) {
  // key_values set by hand (here: another state's) build a cache of their own.
  Decoding d;
  torch::NoGradGuard no_grad;
  auto state = d.init();
  d.run(state, torch::randint(kVocab, {3, 2}, torch::kLong));
  auto copied = d.init();
  for (size_t i = 0; i < state.key_values.size(); ++i) {
    copied.key_values[i] = state.key_values[i].clone();
  }
  const auto next = torch::randint(kVocab, {3, 1}, torch::kLong);
  // The copied state projects its two steps in one product, the original one
  // step at a time: BLAS may round these otherwise (OpenBLAS on Zen 4 does).
  const auto from_copy = d.run(copied, next);
  EXPECT_LT(d2l::testing::max_rel_error(from_copy, d.run(state, next)), 1e-5);
  // A state without those key_values attends over less, and differs.
  auto fresh = d.init();
  EXPECT_GT(d2l::testing::max_rel_error(from_copy, d.run(fresh, next)), 1e-3);
}

TEST(TransformerErrors, ArgumentsNameWhatIsWrong) {
  EXPECT_THAT(error_message([] { d2l::EncoderBlock(8, 8, 8, 10, {10}, 10, 16, 4, 0.1); }),
              HasSubstr("num_hiddens=10 must be a multiple of num_heads=4"));
  EXPECT_THAT(error_message([] { d2l::AddNorm({4}, 1.5); }),
              AllOf(StartsWith("d2l::AddNorm"), HasSubstr("1.5")));
  d2l::PositionalEncoding pe(8, 0.0, 5);
  EXPECT_THAT(error_message([&] { pe(torch::zeros({1, 6, 8})); }),
              AllOf(StartsWith("d2l::PositionalEncoding"), HasSubstr("6 steps"),
                    HasSubstr("max_len=5")));
  EXPECT_THAT(error_message([&] { pe(torch::zeros({1, 4, 7})); }), HasSubstr("num_hiddens=8"));
  d2l::AddNorm add_norm({8}, 0.0);
  EXPECT_THAT(error_message([&] { add_norm(torch::zeros({2, 8}), torch::zeros({3, 8})); }),
              AllOf(HasSubstr("got X [2, 8] and Y [3, 8]")));

  Decoding d;
  const auto X = torch::randint(kVocab, {3, 2}, torch::kLong);
  EXPECT_THAT(error_message([&] { d.model->encoder->forward(torch::full({3, 2}, kVocab), d.lens); }),
              AllOf(StartsWith("d2l::TransformerEncoder"), HasSubstr("vocab_size=13")));
  EXPECT_THAT(error_message([&] { d.model->encoder->forward(X, torch::tensor({1, 2})); }),
              HasSubstr("valid_lens must have shape [batch_size=3]"));

  // A state of another model: an RNN encoder's output, too few blocks, another batch.
  d2l::Seq2SeqEncoder rnn(kVocab, 4, kHiddens, 1);
  EXPECT_THAT(error_message([&] { d.decoder->init_state(rnn(X), d.lens); }),
              AllOf(StartsWith("d2l::TransformerDecoder::init_state"),
                    HasSubstr("an RNN encoder's?")));
  auto state = d.init();
  auto short_state = state;
  short_state.key_values.pop_back();
  EXPECT_THAT(error_message([&] { d.decoder->forward(X, short_state); }),
              HasSubstr("state.key_values must have one entry per block (num_layers=2), got 1"));
  EXPECT_THAT(error_message([&] { d.decoder->forward(X.slice(0, 0, 2), state); }),
              HasSubstr("state.enc_outputs must have shape [batch_size=2"));
  auto bad_past = state;
  bad_past.key_values[1] = torch::zeros({3, 2, kHiddens + 1});
  EXPECT_THAT(error_message([&] { d.decoder->forward(X, bad_past); }),
              AllOf(StartsWith("d2l::DecoderBlock"), HasSubstr("state.key_values[1]"),
                    HasSubstr("[3, 2, 9]")));
  auto doubles = state;
  doubles.enc_outputs = doubles.enc_outputs.to(torch::kDouble);
  EXPECT_THAT(error_message([&] { d.decoder->forward(X, doubles); }),
              HasSubstr("state.enc_outputs"));
  // Nothing above changed the state handed in.
  EXPECT_FALSE(state.key_values[0].defined());
  EXPECT_EQ(state.cache, nullptr);
}

TEST(TransformerErrors, AStateDictOfAnotherArchitectureChangesNothing) {
  auto transformer = small_transformer();
  d2l::EncoderDecoder rnn{d2l::Seq2SeqEncoder(kVocab, kHiddens, kHiddens, kLayers),
                          d2l::Seq2SeqDecoder(kVocab, kHiddens, kHiddens, kLayers)};
  std::stringstream file;
  d2l::save_state_dict(*rnn, file);
  const auto before = transformer->named_parameters()["decoder.dense.weight"].clone();
  EXPECT_THAT(error_message([&] { d2l::load_state_dict(*transformer, file); }),
              AllOf(StartsWith("d2l::load_state_dict"), HasSubstr("encoder.blks.block0")));
  EXPECT_TRUE(torch::equal(transformer->named_parameters()["decoder.dense.weight"], before));
}

TEST(TransformerDecoding, ThreadsDecodingWithOneSharedModelGetTheirOwnNumbers) {
  Decoding d;
  torch::NoGradGuard no_grad;
  constexpr int kThreads = 4;
  std::vector<torch::Tensor> tokens, alone(kThreads), shared(kThreads);
  for (int k = 0; k < kThreads; ++k) {
    tokens.push_back(torch::randint(kVocab, {3, 6}, torch::kLong));
    auto state = d.init();
    alone[k] = d.run(state, tokens[k]);
  }
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      torch::NoGradGuard no_grad_here;
      auto state = d.init();
      shared[k] = d.run(state, tokens[k]);
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kThreads; ++k) EXPECT_TRUE(torch::equal(shared[k], alone[k])) << k;
}

TEST(TransformerDecoding, CudaMatchesCpuWhenAvailable) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    Decoding d;
    d.model->to(dtype);
    d.model->train();  // dropout 0: the causal training path, with gradients
    const auto dec_X = torch::randint(kVocab, {3, 7}, torch::kLong);
    const auto [cpu_output, cpu_state] = d.model(d.enc_X, dec_X, d.lens);
    cpu_output.sum().backward();
    std::vector<torch::Tensor> cpu_grads;
    for (const auto& p : d.model->parameters()) cpu_grads.push_back(p.grad().clone());
    d.model->zero_grad();
    d.model->to(torch::Device(torch::kCUDA));
    const auto [cuda_output, cuda_state] = d.model(d.enc_X.cuda(), dec_X.cuda(), d.lens.cuda());
    cuda_output.sum().backward();
    const double tol = dtype == torch::kFloat ? 1e-4 : 1e-10;
    EXPECT_LT(d2l::testing::max_rel_error(cuda_output, cpu_output), tol);
    const auto params = d.model->parameters();
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_LT(d2l::testing::max_rel_error(params[k].grad(), cpu_grads[k]), tol) << k;
    }
    // Step by step from the cache, on the device.
    d.model->eval();
    torch::NoGradGuard no_grad;
    d.model->to(torch::kCPU);
    auto cpu_steps = d.init();
    const auto want = d.run(cpu_steps, dec_X);
    d.model->to(torch::Device(torch::kCUDA));
    d.enc_X = d.enc_X.cuda();
    d.lens = d.lens.cuda();
    auto cuda_steps = d.init();
    EXPECT_LT(d2l::testing::max_rel_error(d.run(cuda_steps, dec_X.cuda()), want), tol);
    EXPECT_TRUE(cuda_steps.key_values[0].is_cuda());
  }
}

}  // namespace
