// d2l::generate (include/d2l/generate.h, Note [Generation]): batched greedy
// decoding against the book's one-sentence loop, beam search against
// exhaustive search, batches against single sources, sampling's seeds and
// frequencies, threads, and what generate refuses.

#include <d2l/generate.h>
#include <d2l/seq2seq.h>
#include <d2l/transformer.h>
#include <d2l/v1/seq2seq.h>
#include <d2l/v1/transformer.h>

#include <fmt/format.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <thread>

#include "packed_weights.h"
#include "seq2seq/generate_tokens.h"
#include "test_utils.h"
#include "transformer_models.h"

namespace {

using d2l::testing::error_message;
using ::testing::HasSubstr;

// Target vocabulary: 0 <pad>, 1 <bos>, 2 <eos>, then words.
constexpr int64_t kSrcVocab = 11, kTgtVocab = 9, kPad = 0, kBos = 1, kEos = 2;

struct Model {
  std::string name;
  std::shared_ptr<torch::nn::Module> net;
  d2l::Encoder* encoder;
  d2l::Decoder* decoder;
};

template <typename Net>
Model model_of(std::string name, Net net) {
  net->eval();
  torch::NoGradGuard no_grad;
  // One call fixes the lazy layers' widths; then the weights are scaled up,
  // so that what a random model generates depends on its source (at the
  // initial scale every source gets the same tokens) and stops at
  // different steps.
  const auto X = torch::ones({1, 2}, torch::kLong);
  const auto lens = torch::tensor({2});
  net->decoder->forward(torch::ones({1, 1}, torch::kLong),
                        net->decoder->init_state(net->encoder->forward(X, lens), lens));
  for (auto& p : net->parameters()) p.mul_(3);
  // <eos> about as likely as the most likely other token at the first
  // step, so that sources end at different steps: the median gap, plus a
  // margin far above float32's rounding of the logits, so that the median
  // source's first step is no exact tie, which the products' rounding at
  // another batch size (1.4e-6 in the encoder's outputs with ATen and MKL
  // pinned to AVX2) could break either way.
  std::vector<double> gaps;
  for (int64_t s = 3; s < kSrcVocab; ++s) {
    const auto Xs = torch::tensor({s, kEos}).view({1, 2});
    const auto Y = std::get<0>(net->decoder->forward(
        torch::full({1, 1}, kBos, torch::kLong),
        net->decoder->init_state(net->encoder->forward(Xs, lens), lens)))[0][0];
    gaps.push_back((Y.max() - Y[kEos]).template item<double>());
  }
  std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
  net->decoder->as_module().named_parameters()["dense.bias"][kEos] += gaps[gaps.size() / 2] + 1e-3;
  return {std::move(name), net.ptr(), net->encoder.get(), net->decoder.get()};
}

// Every encoder-decoder of the library, small, with random weights. The
// output layers' biases are raised so that <eos> comes now and then.
std::vector<Model> models() {
  std::vector<Model> out;
  torch::manual_seed(3);
  d2l::Seq2SeqOptions o(kTgtVocab, 8, 16, 2);
  d2l::Seq2SeqOptions so(kSrcVocab, 8, 16, 2);
  out.push_back(
      model_of("seq2seq", d2l::EncoderDecoder(d2l::Seq2SeqEncoder(so), d2l::Seq2SeqDecoder(o))));
  out.push_back(
      model_of("seq2seq_attention",
               d2l::EncoderDecoder(d2l::Seq2SeqEncoder(so), d2l::Seq2SeqAttentionDecoder(o))));
  out.push_back(
      model_of("transformer",
               d2l::EncoderDecoder(
                   d2l::TransformerEncoder(kSrcVocab, 16, 16, 16, 16, {16}, 16, 32, 4, 2, 0.0),
                   d2l::TransformerDecoder(kTgtVocab, 16, 16, 16, 16, {16}, 16, 32, 4, 2, 0.0))));
  out.push_back(model_of("v1_seq2seq",
                         d2l::v1::EncoderDecoder(d2l::v1::Seq2SeqEncoder(kSrcVocab, 8, 16, 2),
                                                 d2l::v1::Seq2SeqDecoder(kTgtVocab, 8, 16, 2))));
  out.push_back(
      model_of("v1_seq2seq_attention",
               d2l::v1::EncoderDecoder(d2l::v1::Seq2SeqEncoder(kSrcVocab, 8, 16, 2),
                                       d2l::v1::Seq2SeqAttentionDecoder(kTgtVocab, 8, 16, 2))));
  out.push_back(
      model_of("v1_transformer",
               d2l::v1::EncoderDecoder(d2l::v1::TransformerEncoder(kSrcVocab, 16, 32, 4, 2, 0.0),
                                       d2l::v1::TransformerDecoder(kTgtVocab, 16, 32, 4, 2, 0.0))));
  return out;
}

std::vector<std::vector<int64_t>> sources(int64_t n, int64_t seed) {
  torch::manual_seed(seed);
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = torch::randint(1, 7, {1}).item<int64_t>();
    const auto words = torch::randint(3, kSrcVocab, {len - 1});
    std::vector<int64_t> s;
    for (int64_t t = 0; t + 1 < len; ++t) s.push_back(words[t].item<int64_t>());
    s.push_back(kEos);
    out.push_back(s);
  }
  return out;
}

d2l::GenerationOptions options(int64_t max_length) {
  return d2l::GenerationOptions().max_length(max_length).start_id(kBos).end_id(kEos).pad_id(kPad);
}

// The book's predict_seq2seq loop on token ids: one source padded to
// num_steps, greedy, stopping at <eos>.
std::vector<int64_t> book_greedy(const Model& m, std::vector<int64_t> src, int64_t num_steps) {
  torch::NoGradGuard no_grad;
  const int64_t valid = std::min<int64_t>(static_cast<int64_t>(src.size()), num_steps);
  src.resize(static_cast<size_t>(num_steps), kPad);
  const auto X = torch::tensor(src).view({1, num_steps});
  const auto lens = torch::tensor({valid});
  auto state = m.decoder->init_state(m.encoder->forward(X, lens), lens);
  auto dec_X = torch::full({1, 1}, kBos, torch::kLong);
  std::vector<int64_t> out;
  for (int64_t step = 0; step < num_steps; ++step) {
    torch::Tensor Y;
    std::tie(Y, state) = m.decoder->forward(dec_X, state);
    dec_X = Y.argmax(2);
    const int64_t pred = dec_X.item<int64_t>();
    if (pred == kEos) break;
    out.push_back(pred);
  }
  return out;
}

TEST(Generate, BatchedGreedyEqualsTheBooksLoopForEveryDecoder) {
  const int64_t num_steps = 8;
  const auto srcs = sources(12, 1);
  for (const auto& m : models()) {
    const auto results =
        d2l::generate(*m.encoder, *m.decoder, srcs, options(num_steps).source_length(num_steps));
    ASSERT_EQ(results.size(), srcs.size()) << m.name;
    std::set<size_t> lengths;
    for (size_t i = 0; i < srcs.size(); ++i) {
      ASSERT_EQ(results[i].hypotheses.size(), 1u) << m.name;
      const auto& h = results[i].hypotheses[0];
      EXPECT_EQ(h.tokens, book_greedy(m, srcs[i], num_steps)) << m.name << " source " << i;
      lengths.insert(h.tokens.size());
    }
    // Rows left the batch at different steps.
    EXPECT_GE(lengths.size(), 2u) << m.name;
  }
}

TEST(Generate, ScoresAreLogProbabilitiesAndBeamsDoAtLeastAsWellAsGreedy) {
  const auto srcs = sources(6, 2);
  for (const auto& m : models()) {
    const auto o = options(7).source_length(7).return_log_probs(true);
    const auto greedy = d2l::generate(*m.encoder, *m.decoder, srcs, o);
    const auto beam =
        d2l::generate(*m.encoder, *m.decoder, srcs, d2l::GenerationOptions(o).beam_size(3));
    for (size_t i = 0; i < srcs.size(); ++i) {
      for (const auto* h : {&greedy[i].hypotheses[0], &beam[i].hypotheses[0]}) {
        double sum = 0;
        for (const double lp : h->log_probs) sum += lp;
        EXPECT_NEAR(h->score, sum, 1e-9) << m.name;
        EXPECT_EQ(h->log_probs.size(), h->tokens.size() + (h->finished ? 1 : 0)) << m.name;
      }
      EXPECT_GE(beam[i].hypotheses[0].score, greedy[i].hypotheses[0].score - 1e-5)
          << m.name << " source " << i;
    }
  }
}

// Every sequence the decoder can produce in at most max_length tokens, by
// advancing states one token at a time: the best under log P / L^α.
struct Best {
  std::vector<int64_t> tokens;
  double score = -std::numeric_limits<double>::infinity();
};

void search(const Model& m, const d2l::DecoderState& state, int64_t last,
            std::vector<int64_t>& prefix, double log_prob, int64_t max_length, double alpha,
            Best& best) {
  torch::Tensor Y;
  d2l::DecoderState next;
  std::tie(Y, next) = m.decoder->forward(torch::full({1, 1}, last, torch::kLong), state);
  const auto lp = torch::log_softmax(Y[0][0].to(torch::kFloat), 0);
  for (int64_t v = 0; v < Y.size(2); ++v) {
    const double total = log_prob + lp[v].item<float>();
    const auto length = static_cast<int64_t>(prefix.size()) + 1;
    if (v == kEos || length == max_length) {
      const double score = total / std::pow(static_cast<double>(length), alpha);
      if (score > best.score) {
        best.score = score;
        best.tokens = prefix;
        if (v != kEos) best.tokens.push_back(v);
      }
      continue;
    }
    prefix.push_back(v);
    search(m, next, v, prefix, total, max_length, alpha, best);
    prefix.pop_back();
  }
}

TEST(Generate, BeamHoldingEveryPrefixFindsTheExhaustiveBest) {
  // A target vocabulary of 4 and at most 3 tokens: 4 + 12 + 36 candidates
  // at most a step, which a beam of 64 holds.
  torch::manual_seed(5);
  constexpr int64_t kTiny = 4, kMax = 3;
  std::vector<Model> tiny;
  tiny.push_back(model_of(
      "transformer",
      d2l::EncoderDecoder(d2l::TransformerEncoder(kSrcVocab, 8, 8, 8, 8, {8}, 8, 16, 2, 2, 0.0),
                          d2l::TransformerDecoder(kTiny, 8, 8, 8, 8, {8}, 8, 16, 2, 2, 0.0))));
  tiny.push_back(model_of("seq2seq_attention",
                          d2l::EncoderDecoder(d2l::Seq2SeqEncoder(kSrcVocab, 8, 16, 2),
                                              d2l::Seq2SeqAttentionDecoder(kTiny, 8, 16, 2))));
  const auto srcs = sources(4, 3);
  for (const auto& m : tiny) {
    for (const double alpha : {0.0, 0.75}) {
      const auto results =
          d2l::generate(*m.encoder, *m.decoder, srcs,
                        options(kMax).source_length(6).beam_size(64).length_penalty(alpha));
      for (size_t i = 0; i < srcs.size(); ++i) {
        torch::NoGradGuard no_grad;
        auto src = srcs[i];
        const auto valid = static_cast<int64_t>(src.size());
        src.resize(6, kPad);
        const auto lens = torch::tensor({valid});
        const auto state =
            m.decoder->init_state(m.encoder->forward(torch::tensor(src).view({1, 6}), lens), lens);
        Best best;
        std::vector<int64_t> prefix;
        search(m, state, kBos, prefix, 0, kMax, alpha, best);
        const auto& h = results[i].hypotheses[0];
        EXPECT_EQ(h.tokens, best.tokens) << m.name << " alpha " << alpha << " source " << i;
        EXPECT_NEAR(h.score, best.score, 1e-5) << m.name << " alpha " << alpha;
      }
    }
  }
}

// tests/reference/beam_search.py, the definition of docs/generation.md in
// Python on the book's Transformer classes, one source and one decoder state
// per hypothesis at a time; the same weights (float64) here, all sources in
// one batch (tests/fixtures/generate_fixtures_beam.py writes the fixture).
TEST(Generate, BeamSearchEqualsThePythonReference) {
  const auto f = d2l::testing::load_fixture("beam_transformer_float64");
  auto model = d2l::testing::transformer_from_fixture(f, torch::kDouble);
  const auto src = f.tensor("sources");
  const auto lens = f.tensor("valid_lens");
  std::vector<std::vector<int64_t>> sources;
  for (int64_t s = 0; s < src.size(0); ++s) {
    std::vector<int64_t> row;
    for (int64_t t = 0; t < lens[s].item<int64_t>(); ++t) row.push_back(src[s][t].item<int64_t>());
    sources.push_back(row);
  }
  for (int k = 0; f.has_tensor(fmt::format("search.{}.options", k)); ++k) {
    const auto o = f.tensor(fmt::format("search.{}.options", k));
    const auto beam = static_cast<int64_t>(o[0].item<double>()),
               nbest = static_cast<int64_t>(o[1].item<double>()),
               max_length = static_cast<int64_t>(o[3].item<double>());
    const double alpha = o[2].item<double>();
    const auto results = d2l::generate(*model, sources,
                                       options(max_length)
                                           .source_length(src.size(1))
                                           .beam_size(beam)
                                           .num_hypotheses(nbest)
                                           .length_penalty(alpha));
    const auto tokens = f.tensor(fmt::format("search.{}.tokens", k));
    const auto scores = f.tensor(fmt::format("search.{}.scores", k));
    const auto finished = f.tensor(fmt::format("search.{}.finished", k));
    for (size_t s = 0; s < sources.size(); ++s) {
      ASSERT_EQ(static_cast<int64_t>(results[s].hypotheses.size()), nbest);
      for (int64_t h = 0; h < nbest; ++h) {
        const auto row = static_cast<int64_t>(s) * nbest + h;
        std::vector<int64_t> expected;
        for (int64_t t = 0; t < tokens.size(1) && tokens[row][t].item<int64_t>() >= 0; ++t) {
          expected.push_back(tokens[row][t].item<int64_t>());
        }
        const auto& got = results[s].hypotheses[static_cast<size_t>(h)];
        const auto what = fmt::format("search {} (beam {}, alpha {}) source {} hypothesis {}", k,
                                      beam, alpha, s, h);
        EXPECT_EQ(got.tokens, expected) << what;
        // Log-probabilities in float32 here, float64 in the reference.
        EXPECT_NEAR(got.score, scores[row].item<double>(), 1e-5) << what;
        EXPECT_EQ(got.finished, finished[row].item<int64_t>() != 0) << what;
      }
    }
  }
}

TEST(Generate, ARowInABatchDecodesAsItDoesAlone) {
  const auto srcs = sources(7, 4);
  for (const auto& m : models()) {
    for (const int64_t beam : {1, 3}) {
      const auto o = options(8).source_length(8).beam_size(beam).num_hypotheses(beam);
      const auto batch = d2l::generate(*m.encoder, *m.decoder, srcs, o);
      for (size_t i = 0; i < srcs.size(); ++i) {
        const auto alone = d2l::generate(*m.encoder, *m.decoder, {srcs[i]}, o);
        ASSERT_EQ(alone[0].hypotheses.size(), batch[i].hypotheses.size()) << m.name;
        for (size_t h = 0; h < alone[0].hypotheses.size(); ++h) {
          EXPECT_EQ(alone[0].hypotheses[h].tokens, batch[i].hypotheses[h].tokens)
              << m.name << " beam " << beam << " source " << i << " hypothesis " << h;
          // The same up to float32's rounding of the logits, which the
          // products round differently at another batch size: a few ulps
          // of logits of tens (the weights are scaled up), over 8 steps.
          EXPECT_NEAR(alone[0].hypotheses[h].score, batch[i].hypotheses[h].score, 1e-3)
              << m.name << " beam " << beam << " source " << i << " hypothesis " << h;
        }
      }
    }
  }
}

TEST(Generate, MaxBatchSizeSortsByLengthAndKeepsTheSourcesOrder) {
  // Sources of lengths 1 to 6 in a shuffled order; batches of 3 decode the
  // three longest together, then the three shortest.
  auto srcs = sources(12, 4);
  std::stable_sort(srcs.begin(), srcs.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  std::vector<std::vector<int64_t>> shuffled;
  for (const size_t i : {3, 0, 5, 1, 4, 2}) shuffled.push_back(srcs[i * 2]);
  for (const auto& m : models()) {
    for (const int64_t beam : {1, 3}) {
      // source_length fixes the padding: the GRU encoders read it.
      const auto o = options(8).source_length(8).beam_size(beam).num_hypotheses(beam);
      const auto whole = d2l::generate(*m.encoder, *m.decoder, shuffled, o);
      const auto batched = d2l::generate(*m.encoder, *m.decoder, shuffled,
                                         d2l::GenerationOptions(o).max_batch_size(3));
      ASSERT_EQ(whole.size(), batched.size());
      for (size_t i = 0; i < shuffled.size(); ++i) {
        ASSERT_EQ(whole[i].hypotheses.size(), batched[i].hypotheses.size()) << m.name;
        for (size_t h = 0; h < whole[i].hypotheses.size(); ++h) {
          EXPECT_EQ(whole[i].hypotheses[h].tokens, batched[i].hypotheses[h].tokens)
              << m.name << " beam " << beam << " source " << i;
          EXPECT_NEAR(whole[i].hypotheses[h].score, batched[i].hypotheses[h].score, 1e-3);
        }
      }
    }
  }
  // The callback sees the sources' own indices, and the batches go longest
  // first: the first step's calls name the three longest sources,
  // shuffled[0], [2] and [4] (srcs[6], [10] and [8]; on ties the sort keeps
  // the sources' order, which puts these first too).
  const auto m = models()[2];
  std::vector<int64_t> first_step;
  std::vector<std::vector<int64_t>> streamed(shuffled.size());
  const auto o =
      options(8).max_batch_size(3).callback([&](int64_t step, int64_t source, int64_t token) {
        if (step == 0) first_step.push_back(source);
        streamed[static_cast<size_t>(source)].push_back(token);
      });
  const auto results = d2l::generate(*m.encoder, *m.decoder, shuffled, o);
  ASSERT_GE(first_step.size(), 3u);
  std::vector<int64_t> first_batch(first_step.begin(), first_step.begin() + 3);
  std::sort(first_batch.begin(), first_batch.end());
  EXPECT_EQ(first_batch, (std::vector<int64_t>{0, 2, 4}));
  for (size_t i = 0; i < shuffled.size(); ++i) {
    auto tokens = results[i].hypotheses[0].tokens;
    if (results[i].hypotheses[0].finished) tokens.push_back(kEos);
    EXPECT_EQ(streamed[i], tokens) << "source " << i;
  }
}

TEST(Generate, SamplingWithASeedRepeats) {
  const auto srcs = sources(5, 6);
  const auto m = models()[2];
  const auto o = options(8).sampling_topk(0).seed(11);
  const auto first = d2l::generate(*m.encoder, *m.decoder, srcs, o);
  const auto again = d2l::generate(*m.encoder, *m.decoder, srcs, o);
  const auto other =
      d2l::generate(*m.encoder, *m.decoder, srcs, d2l::GenerationOptions(o).seed(12));
  bool differs = false;
  for (size_t i = 0; i < srcs.size(); ++i) {
    EXPECT_EQ(first[i].hypotheses[0].tokens, again[i].hypotheses[0].tokens);
    differs = differs || first[i].hypotheses[0].tokens != other[i].hypotheses[0].tokens;
  }
  EXPECT_TRUE(differs);
}

// Pearson's statistic of `counts` against n draws of `p` (cells of p > 0).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] == 0) continue;
    const double expected = p[v] * static_cast<double>(n);
    x += (counts[v] - expected) * (counts[v] - expected) / expected;
  }
  return x;
}

TEST(Generate, SampledTokensFollowTheModelsDistribution) {
  const auto m = models()[1];
  const std::vector<int64_t> src = {4, 5, 6, kEos};
  // The first step's distribution, from the decoder directly.
  torch::Tensor probs;
  {
    torch::NoGradGuard no_grad;
    const auto lens = torch::tensor({4});
    const auto state =
        m.decoder->init_state(m.encoder->forward(torch::tensor(src).view({1, 4}), lens), lens);
    probs = torch::softmax(
        std::get<0>(m.decoder->forward(torch::full({1, 1}, kBos, torch::kLong), state))[0][0] / 0.7,
        0);
  }
  constexpr int64_t kDraws = 6000;
  const std::vector<std::vector<int64_t>> many(kDraws, src);
  struct Case {
    int64_t topk;
    double topp;
  };
  for (const auto& c : {Case{0, 1.0}, Case{3, 1.0}, Case{0, 0.8}}) {
    std::vector<double> p(kTgtVocab);
    for (int64_t v = 0; v < kTgtVocab; ++v) p[v] = probs[v].item<double>();
    // The filtered distribution: the top k, then the smallest head of mass
    // >= topp, renormalised.
    std::vector<int64_t> order(kTgtVocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double mass = 0;
    for (size_t r = 0; r < order.size(); ++r) {
      const bool outside = (c.topk > 0 && static_cast<int64_t>(r) >= c.topk) || mass >= c.topp;
      mass += p[order[r]];
      if (outside) p[order[r]] = 0;
    }
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    for (auto& x : p) x /= total;
    const auto results = d2l::generate(
        *m.encoder, *m.decoder, many,
        options(1).sampling_topk(c.topk).sampling_topp(c.topp).temperature(0.7).seed(3));
    std::vector<int64_t> counts(kTgtVocab, 0);
    for (const auto& r : results) {
      const auto& h = r.hypotheses[0];
      ++counts[static_cast<size_t>(h.finished ? kEos : h.tokens.at(0))];
    }
    for (int64_t v = 0; v < kTgtVocab; ++v) {
      if (p[v] == 0) EXPECT_EQ(counts[v], 0) << "token " << v << " was filtered out";
    }
    int64_t cells = 0;
    for (const double x : p) cells += x > 0;
    // The 0.999 quantile of chi-square with cells - 1 degrees of freedom
    // (at most 8 here): 26.1.
    EXPECT_LT(chi_square(counts, p, kDraws), 26.1) << "topk " << c.topk << " topp " << c.topp;
    EXPECT_GE(cells, 2);
  }
}

TEST(Generate, TwoThreadsSharingAModelGetWhatOneGets) {
  const auto srcs = sources(8, 7);
  for (const auto& m : models()) {
    const auto o = options(8).source_length(8).beam_size(3).num_hypotheses(2);
    const auto expected = d2l::generate(*m.encoder, *m.decoder, srcs, o);
    std::vector<std::vector<d2l::GenerationResult>> got(2);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        for (int rep = 0; rep < 3; ++rep) got[t] = d2l::generate(*m.encoder, *m.decoder, srcs, o);
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& g : got) {
      for (size_t i = 0; i < srcs.size(); ++i) {
        for (size_t h = 0; h < 2; ++h) {
          EXPECT_EQ(g[i].hypotheses[h].tokens, expected[i].hypotheses[h].tokens) << m.name;
          EXPECT_EQ(g[i].hypotheses[h].score, expected[i].hypotheses[h].score) << m.name;
        }
      }
    }
  }
}

TEST(Generate, RestoresEachModulesMode) {
  auto m = models()[2];
  m.net->train();
  auto& decoder = m.decoder->as_module();
  decoder.children()[0]->eval();  // one submodule in evaluation mode
  const auto modes = [&] {
    std::vector<bool> out;
    for (const auto& sub : m.net->modules()) out.push_back(sub->is_training());
    return out;
  };
  const auto before = modes();
  const auto result = d2l::generate(*m.encoder, *m.decoder, sources(3, 8), options(5));
  EXPECT_EQ(modes(), before);
  // Decoded in evaluation mode: the same as a model in evaluation mode.
  m.net->eval();
  const auto in_eval = d2l::generate(*m.encoder, *m.decoder, sources(3, 8), options(5));
  for (size_t i = 0; i < result.size(); ++i) {
    EXPECT_EQ(result[i].hypotheses[0].tokens, in_eval[i].hypotheses[0].tokens);
  }
}

TEST(Generate, ReturnsAttentionOfEveryToken) {
  const auto m = models()[2];
  const auto srcs = sources(3, 9);
  const auto results =
      d2l::generate(*m.encoder, *m.decoder, srcs,
                    options(6).source_length(6).beam_size(2).return_attention(true));
  for (const auto& r : results) {
    const auto& h = r.hypotheses[0];
    const auto length = static_cast<int64_t>(h.tokens.size()) + (h.finished ? 1 : 0);
    // (L, layers * heads, num_enc_steps), each row a distribution.
    ASSERT_EQ(h.attention.sizes(), (std::vector<int64_t>{length, 2 * 4, 6}));
    EXPECT_TRUE(torch::allclose(h.attention.sum(-1), torch::ones({length, 8})));
  }
}

TEST(Generate, RecordsAttentionWeightsOnlyWhenReturningThem) {
  // Every decoder that records weights: what generate leaves in its modules.
  for (const auto& m : models()) {
    SCOPED_TRACE(m.name);
    const auto recorded = [&] {
      std::vector<torch::Tensor> out;
      for (const auto& module : m.net->modules()) {
        if (auto* a = module->as<d2l::DotProductAttention>()) out.push_back(a->attention_weights);
        if (auto* a = module->as<d2l::AdditiveAttention>()) out.push_back(a->attention_weights);
        if (auto* a = module->as<d2l::v1::AdditiveAttention>()) out.push_back(a->attention_weights);
      }
      return out;
    };
    const auto before = recorded();  // from model_of's calls
    d2l::generate(*m.encoder, *m.decoder, sources(3, 5), options(4));
    const auto without = recorded();
    ASSERT_EQ(without.size(), before.size());
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(before[i].defined()) << i;
      EXPECT_TRUE(without[i].is_same(before[i])) << i;  // left as they were
    }
    if (dynamic_cast<d2l::AttentionDecoder*>(m.decoder) == nullptr) continue;
    d2l::generate(*m.encoder, *m.decoder, sources(2, 4), options(4).return_attention(true));
    const auto with = recorded();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_FALSE(with[i].is_same(before[i])) << i;
  }
}

TEST(Generate, RefusesBadOptionsAndSources) {
  const auto m = models()[2];
  const auto srcs = sources(2, 10);
  const auto refused = [&](const d2l::GenerationOptions& o,
                           const std::vector<std::vector<int64_t>>& s = {}) {
    return error_message([&] { d2l::generate(*m.encoder, *m.decoder, s.empty() ? srcs : s, o); });
  };
  EXPECT_THAT(refused(options(0)), HasSubstr("max_length must be positive, got 0"));
  EXPECT_THAT(refused(options(-3)), HasSubstr("max_length must be positive, got -3"));
  EXPECT_THAT(refused(options(5).beam_size(0)), HasSubstr("beam_size must be in [1, 256], got 0"));
  EXPECT_THAT(refused(options(5).beam_size(300)),
              HasSubstr("beam_size must be in [1, 256], got 300"));
  EXPECT_THAT(refused(options(5).beam_size(2).num_hypotheses(3)),
              HasSubstr("num_hypotheses must be in [1, beam_size=2], got 3"));
  EXPECT_THAT(refused(options(5).sampling_topk(0).temperature(0)),
              HasSubstr("temperature must be positive, got 0"));
  EXPECT_THAT(refused(options(5).sampling_topk(0).sampling_topp(1.5)),
              HasSubstr("sampling_topp must be in (0, 1], got 1.5"));
  EXPECT_THAT(refused(options(5).sampling_topk(0).sampling_topp(0)),
              HasSubstr("sampling_topp must be in (0, 1], got 0"));
  EXPECT_THAT(refused(options(5).sampling_topk(0).beam_size(2)),
              HasSubstr("sampling (sampling_topk=0) needs beam_size 1, got 2"));
  EXPECT_THAT(refused(options(5).max_batch_size(-2)),
              HasSubstr("max_batch_size must be 0 (one batch) or positive, got -2"));
  EXPECT_THAT(refused(options(5).length_penalty(-1)),
              HasSubstr("length_penalty must be finite and not negative, got -1"));
  EXPECT_THAT(refused(d2l::GenerationOptions()),
              HasSubstr("start_id, end_id and pad_id must be set"));
  EXPECT_THAT(refused(options(5), {{3, 4}, {}}), HasSubstr("sources[1] is empty"));
  EXPECT_THAT(refused(options(5), {{3, 40, kEos}}),
              HasSubstr("sources[0][1] is 40, outside the encoder's vocabulary [0, 11)"));
  EXPECT_THAT(refused(options(5).end_id(20)),
              HasSubstr("start_id 1 and end_id 20 must be in the decoder's vocabulary [0, 9)"));
  const auto plain = models()[3];
  EXPECT_THAT(error_message([&] {
                d2l::generate(*plain.encoder, *plain.decoder, srcs,
                              options(5).return_attention(true));
              }),
              HasSubstr("return_attention needs a d2l::AttentionDecoder"));
}

TEST(Generate, NoSourcesGiveNoResultsAfterTheOptionsAreChecked) {
  const auto m = models()[2];
  EXPECT_TRUE(d2l::generate(*m.encoder, *m.decoder, {}, options(5)).empty());
  EXPECT_TRUE(d2l::generate(*m.encoder, *m.decoder, {}, options(5).beam_size(4)).empty());
  EXPECT_THAT(error_message([&] { d2l::generate(*m.encoder, *m.decoder, {}, options(0)); }),
              HasSubstr("max_length must be positive, got 0"));
}

}  // namespace

namespace {

TEST(GenerateTokens, BestTokensAreWhatPartialSortGives) {
  // Ties (values on a coarse grid) go to the smaller index; counts from one
  // to the whole row.
  torch::manual_seed(21);
  std::vector<int64_t> best;
  for (const int64_t V : {1, 2, 7, 64, 200, 1000}) {
    for (const int64_t count : {int64_t{1}, int64_t{2}, int64_t{8}, V}) {
      if (count > V) continue;
      for (const bool ties : {false, true}) {
        auto row = torch::randn({V});
        if (ties) row = (row * 2).round();
        const float* x = row.data_ptr<float>();
        std::vector<int64_t> order(static_cast<size_t>(V));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(
            order.begin(), order.begin() + count, order.end(),
            [&](int64_t a, int64_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
        order.resize(static_cast<size_t>(count));
        d2l::detail::best_tokens(x, V, count, best);
        EXPECT_EQ(best, order) << fmt::format("V {} count {} ties {}", V, count, ties);
      }
    }
  }
}

}  // namespace

namespace {

TEST(Generate, SeesWeightsEditedThroughDataBetweenCalls) {
  // The packed copies of the weights are checked once per generate call
  // (PackedWeightsCheckedOnce), not once per batch: an edit through .data()
  // between two calls still reaches the second, batches and all.
  torch::manual_seed(17);
  d2l::TransformerEncoder encoder(30, 32, 32, 32, 32, {32}, 32, 64, 4, 2, 0.0);
  d2l::TransformerDecoder decoder(30, 32, 32, 32, 32, {32}, 32, 64, 4, 2, 0.0);
  std::vector<std::vector<int64_t>> sources;
  for (int64_t i = 0; i < 12; ++i) sources.push_back({4 + i % 20, 5 + i, 6, 2});
  const auto o =
      d2l::GenerationOptions().start_id(1).end_id(2).pad_id(0).max_length(8).max_batch_size(5);
  const auto tokens = [&] {
    std::vector<std::vector<int64_t>> out;
    for (const auto& r : d2l::generate(*encoder, *decoder, sources, o)) {
      out.push_back(r.hypotheses[0].tokens);
    }
    return out;
  };
  const auto before = tokens();
  // The output layer's rows reversed: every greedy choice changes.
  decoder->dense->weight.data().copy_(decoder->dense->weight.flip(0));
  decoder->dense->bias.data().copy_(decoder->dense->bias.flip(0));
  const auto after = tokens();
  d2l::detail::release_packed_weights();
  EXPECT_EQ(after, tokens());  // what a fresh packing gives
  EXPECT_NE(after, before);
}

}  // namespace
