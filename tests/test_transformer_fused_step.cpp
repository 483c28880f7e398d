// The 0.17 Transformer decoder's fused step (Note [The fused decoder step]):
// where it runs, and that it gives the book's numbers at every batch, size
// and dtype it takes, across the caches' growth, with steps of the blocks'
// cached path between its own.

#include <d2l/transformer.h>

#include <gmock/gmock.h>

#include "test_utils.h"

namespace {
namespace fused_step_tests {  // test_generate.cpp's names share the unity build

using ::testing::HasSubstr;

constexpr int64_t kVocab = 17;

struct Model {
  d2l::TransformerEncoder encoder{nullptr};
  d2l::TransformerDecoder decoder{nullptr};
};

// The book's Transformer with `h` hidden units, 4 heads, an FFN of 4h, 2 blocks.
Model transformer(int64_t h, uint64_t seed = 3) {
  torch::manual_seed(seed);
  Model m{d2l::TransformerEncoder(kVocab, h, h, h, h, {h}, h, 4 * h, 4, 2, 0.1),
          d2l::TransformerDecoder(kVocab, h, h, h, h, {h}, h, 4 * h, 4, 2, 0.1)};
  m.encoder->eval();
  m.decoder->eval();
  return m;
}

d2l::DecoderState init(Model& m, const torch::Tensor& enc_X, const torch::Tensor& lens) {
  return m.decoder->init_state(m.encoder->forward(enc_X, lens), lens);
}

// Each step's output, then every block's self- and cross-attention weights;
// `expected_path` (if any) is what explain_step says before every step.
std::vector<torch::Tensor> decode(Model& m, d2l::DecoderState state, const torch::Tensor& tokens,
                                  const char* expected_path,
                                  const std::function<void(int64_t)>& before_step = nullptr) {
  std::vector<torch::Tensor> seen;
  for (int64_t t = 0; t < tokens.size(1); ++t) {
    if (before_step) before_step(t);
    const auto X = tokens.slice(1, t, t + 1);
    if (expected_path != nullptr) {
      const auto path = m.decoder->explain_step(X, state);
      EXPECT_EQ(path.path, expected_path) << "step " << t << ": " << path.to_string();
    }
    torch::Tensor Y;
    std::tie(Y, state) = m.decoder->forward(X, state);
    seen.push_back(Y);
    for (const auto& kind : m.decoder->block_attention_weights()) {
      seen.insert(seen.end(), kind.begin(), kind.end());
    }
  }
  return seen;
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                  double tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].sizes(), b[k].sizes()) << k;
    EXPECT_LT(d2l::testing::max_rel_error(a[k], b[k]), tolerance) << k;
  }
}

// In float: the fused pass (a) and the book's path (b) each against the
// book's path in double (exact): a no further from it than 4 × b's distance
// (+ 1e-5, for outputs b happens to get almost exact: 5.6e-8 against 2.3e-6 for one of them in the
// ASan build). The two float paths sum in other orders (packed kernel, few-rows kernel, BLAS), so
// each alone is a fair bound only for the other's order.
void expect_as_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                     const std::vector<torch::Tensor>& exact) {
  ASSERT_EQ(a.size(), exact.size());
  ASSERT_EQ(b.size(), exact.size());
  for (size_t k = 0; k < a.size(); ++k) {
    const double ours = d2l::testing::max_rel_error(a[k], exact[k]);
    const double books = d2l::testing::max_rel_error(b[k], exact[k]);
    EXPECT_LE(ours, 4 * books + 1e-5) << k << ": the book's path in float is " << books << " away";
  }
}

TEST(TransformerFusedStep, GivesTheBooksNumbersAtEveryBatchSizeAndDtypeAcrossGrowth) {
  // 32 hidden units: every product on the calling thread; 256: products of
  // 3 rows split over threads by W's rows, of 9 rows through BLAS (linear.h).
  // 20 steps: the caches grow at 8 and 16 keys. A source of length 0
  // attends to nothing (zero weights, as the book's path gives them).
  for (const int64_t h : {32, 256}) {
    for (const int64_t batch : {1, 3, 9}) {
      for (const auto dtype : {torch::kFloat, torch::kDouble}) {
        SCOPED_TRACE(::testing::Message()
                     << "h " << h << ", batch " << batch << ", " << c10::toString(dtype));
        auto m = transformer(h);
        m.encoder->to(dtype);
        m.decoder->to(dtype);
        const auto enc_X = torch::randint(kVocab, {batch, 6}, torch::kLong);
        auto lens = torch::randint(0, 7, {batch}, torch::kLong);
        lens[0] = batch > 1 ? 0 : 4;
        const auto tokens = torch::randint(kVocab, {batch, 20}, torch::kLong);
        std::vector<torch::Tensor> fused, book;
        {
          torch::NoGradGuard no_grad;
          fused = decode(m, init(m, enc_X, lens), tokens, "fused_step");
        }
        book = decode(m, init(m, enc_X, lens), tokens, "blocks");  // autograd on: the book's code
        if (dtype == torch::kFloat) {
          auto exact = transformer(h);
          exact.encoder->to(torch::kDouble);
          exact.decoder->to(torch::kDouble);
          expect_as_close(fused, book, decode(exact, init(exact, enc_X, lens), tokens, "blocks"));
        } else {
          expect_close(fused, book, 1e-12);
        }
      }
    }
  }
}

TEST(TransformerFusedStep, RowsSplitOverThreadsGiveWhatOneThreadGives) {
  // 12 rows of the book's sizes: at 2 threads each takes 6 rows through every
  // block (splits_rows in fused_step.cpp); every row's arithmetic is its own,
  // so the bits are one thread's.
  auto m = transformer(32);
  const auto enc_X = torch::randint(kVocab, {12, 6}, torch::kLong);
  const auto lens = torch::randint(1, 7, {12}, torch::kLong);
  const auto tokens = torch::randint(kVocab, {12, 10}, torch::kLong);
  torch::NoGradGuard no_grad;
  const int saved = at::get_num_threads();
  std::vector<std::vector<torch::Tensor>> runs;
  for (const int threads : {1, 2}) {
    at::set_num_threads(threads);
    runs.push_back(decode(m, init(m, enc_X, lens), tokens, "fused_step"));
  }
  at::set_num_threads(saved);
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t k = 0; k < runs[0].size(); ++k)
    EXPECT_TRUE(torch::equal(runs[0][k], runs[1][k])) << k;
}

TEST(TransformerFusedStep, StepsOfTheBlocksCachedPathInBetweenShareItsCaches) {
  // Steps 3 to 5 through the blocks' cached path (the composite backend
  // asked for in block 1), the others fused: one cache throughout.
  auto m = transformer(32);
  const auto enc_X = torch::randint(kVocab, {4, 7}, torch::kLong);
  const auto lens = torch::tensor({7, 3, 5, 1});
  const auto tokens = torch::randint(kVocab, {4, 12}, torch::kLong);
  const auto book = decode(m, init(m, enc_X, lens), tokens, nullptr);
  torch::NoGradGuard no_grad;
  auto& backend = m.decoder->block(1)->attention1->attention->options;
  std::vector<torch::Tensor> mixed;
  {
    auto state = init(m, enc_X, lens);
    for (int64_t t = 0; t < tokens.size(1); ++t) {
      const bool blocks = t >= 3 && t <= 5;
      backend.backend(blocks ? d2l::AttentionBackend::kComposite : d2l::AttentionBackend::kAuto);
      const auto X = tokens.slice(1, t, t + 1);
      EXPECT_EQ(m.decoder->explain_step(X, state).path, blocks ? "blocks" : "fused_step") << t;
      torch::Tensor Y;
      std::tie(Y, state) = m.decoder->forward(X, state);
      mixed.push_back(Y);
      EXPECT_EQ(state.key_values[0].size(1), t + 1);
    }
  }
  backend.backend(d2l::AttentionBackend::kAuto);
  ASSERT_EQ(mixed.size(), static_cast<size_t>(tokens.size(1)));
  for (int64_t t = 0; t < tokens.size(1); ++t) {
    EXPECT_LT(d2l::testing::max_rel_error(mixed[t], book[static_cast<size_t>(t) * 5]), 2e-5) << t;
  }
}

TEST(TransformerFusedStep, ExplainStepNamesWhyTheBlocksRun) {
  auto m = transformer(32);
  const auto enc_X = torch::randint(kVocab, {2, 5}, torch::kLong);
  const auto lens = torch::tensor({5, 2});
  const auto X = torch::randint(kVocab, {2, 1}, torch::kLong);
  const auto why = [&](const d2l::DecoderState& state, const torch::Tensor& x) {
    const auto e = m.decoder->explain_step(x, state);
    EXPECT_EQ(e.path, "blocks");
    return e.to_string();
  };
  auto state = init(m, enc_X, lens);
  EXPECT_THAT(why(state, X), HasSubstr("fused_step: autograd records"));
  torch::NoGradGuard no_grad;
  EXPECT_EQ(m.decoder->explain_step(X, state).path, "fused_step");
  EXPECT_THAT(why(state, torch::randint(kVocab, {2, 3}, torch::kLong)), HasSubstr("3 steps"));
  m.decoder->train();
  EXPECT_THAT(why(state, X), HasSubstr("training mode"));
  m.decoder->eval();
  m.decoder->block(0)->attention2->attention->options.backend(d2l::AttentionBackend::kComposite);
  EXPECT_THAT(why(state, X), HasSubstr("block 0's attention asks for another backend"));
  m.decoder->block(0)->attention2->attention->options.backend(d2l::AttentionBackend::kAuto);
  // A state advanced twice: the second advance projects its past again.
  auto start = state;
  std::tie(std::ignore, start) = m.decoder->forward(X, state);
  auto branch = start;
  std::tie(std::ignore, branch) = m.decoder->forward(X, start);
  EXPECT_EQ(m.decoder->explain_step(X, branch).path, "fused_step");
  EXPECT_THAT(why(start, X), HasSubstr("state.key_values[0] is not the cache's"));
  auto padded = m.decoder->init_state(
      m.encoder->forward(enc_X, lens),
      d2l::AttentionMask().key_padding_mask(torch::zeros({2, 5}, torch::kBool)));
  EXPECT_THAT(why(padded, X), HasSubstr("enc_key_padding_mask"));
  m.encoder->to(torch::kBFloat16);
  m.decoder->to(torch::kBFloat16);
  EXPECT_THAT(why(init(m, enc_X, lens), X), HasSubstr("dtype BFloat16"));
}

TEST(TransformerFusedStep, TheEncodersPassGivesTheBlocksNumbersAndWeights) {
  for (const int64_t h : {32, 256}) {
    for (const int64_t batch : {1, 3, 9}) {
      for (const auto dtype : {torch::kFloat, torch::kDouble}) {
        SCOPED_TRACE(::testing::Message()
                     << "h " << h << ", batch " << batch << ", " << c10::toString(dtype));
        auto m = transformer(h);
        m.encoder->to(dtype);
        const auto X = torch::randint(kVocab, {batch, 9}, torch::kLong);
        auto lens = torch::randint(0, 10, {batch}, torch::kLong);
        lens[0] = batch > 1 ? 0 : 9;
        for (const bool with_lens : {false, true}) {
          const auto mask =
              with_lens ? d2l::AttentionMask().valid_lens(lens) : d2l::AttentionMask();
          const auto run = [&](bool fused) {
            torch::AutoGradMode grad(!fused);
            EXPECT_EQ(m.encoder->explain_forward(X, mask).path, fused ? "fused_pass" : "blocks");
            std::vector<torch::Tensor> seen{m.encoder->forward_masked(X, mask).outputs};
            for (const auto& w : m.encoder->attention_weights()) seen.push_back(w);
            return seen;
          };
          const auto fused = run(true);
          if (dtype == torch::kFloat) {
            auto exact = transformer(h);
            exact.encoder->to(torch::kDouble);
            std::vector<torch::Tensor> seen{exact.encoder->forward_masked(X, mask).outputs};
            for (const auto& w : exact.encoder->attention_weights()) seen.push_back(w);
            expect_as_close(fused, run(false), seen);
          } else {
            expect_close(fused, run(false), 1e-12);
          }
        }
      }
    }
  }
}

TEST(TransformerFusedStep, TheEncodersExplanationNamesWhyTheBlocksRun) {
  auto m = transformer(32);
  torch::NoGradGuard no_grad;
  const auto X = torch::randint(kVocab, {2, 9}, torch::kLong);
  const auto why = [&](const torch::Tensor& x, const d2l::AttentionMask& mask) {
    const auto e = m.encoder->explain_forward(x, mask);
    EXPECT_EQ(e.path, "blocks");
    return e.to_string();
  };
  EXPECT_THAT(why(X, d2l::AttentionMask().key_padding_mask(torch::zeros({2, 9}, torch::kBool))),
              HasSubstr("fused_pass: a mask other than valid_lens"));
  // 8 features a head: up to 64 x 64 pairs in the small-heads kernel.
  EXPECT_EQ(m.encoder->explain_forward(torch::randint(kVocab, {2, 64}, torch::kLong)).path,
            "fused_pass");
  EXPECT_THAT(why(torch::randint(kVocab, {2, 65}, torch::kLong), {}),
              HasSubstr("heads of 65 x 65 pairs of 8 features"));
  m.encoder->block(1)->attention->attention->options.backend(d2l::AttentionBackend::kComposite);
  EXPECT_THAT(why(X, {}), HasSubstr("block 1's attention asks for another backend"));
}

TEST(TransformerFusedStep, RefusesACacheWhoseWeightsChanged) {
  auto m = transformer(32);
  torch::NoGradGuard no_grad;
  auto state = init(m, torch::randint(kVocab, {2, 5}, torch::kLong), torch::tensor({5, 2}));
  const auto X = torch::randint(kVocab, {2, 1}, torch::kLong);
  std::tie(std::ignore, state) = m.decoder->forward(X, state);
  m.decoder->block(0)->attention1->W_k->weight.add_(1);  // bumps its version
  EXPECT_THAT(d2l::testing::error_message([&] { m.decoder->forward(X, state); }),
              HasSubstr("d2l::TransformerDecoder: cache was filled before this module's W_k or "
                        "W_v changed"));
}

}  // namespace fused_step_tests
}  // namespace
