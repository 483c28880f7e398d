// Reliability, concurrency of the modules built on the scorers:
// NWKernelRegression, MultiHeadAttention, Seq2SeqEncoder, Seq2SeqDecoder,
// Seq2SeqAttentionDecoder and EncoderDecoder, each shared by 8 threads (half
// under InferenceMode, half recording the graph) while a ninth thread reads
// the recorded weights through the module's accessor. The TSan preset runs
// these (tests named ReliabilityConcurrency.*); the contract they check is
// Note [Recording attention weights] in src/attention_weights.h.

#include <d2l/multi_head_attention.h>
#include <d2l/nadaraya_watson.h>
#include <d2l/seq2seq.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "seq2seq_models.h"
#include "test_utils.h"

namespace {

using Outputs = std::vector<torch::Tensor>;

// One shared module seen through two functions: `call(i)` runs input set i
// and returns what the caller gets back; `weights()` (may be empty) reads the
// recorded weights through the module's thread-safe accessor.
struct SharedModule {
  size_t inputs = 0;
  std::function<Outputs(size_t)> call;
  std::function<torch::Tensor()> weights;
};

bool same(const Outputs& a, const Outputs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || !torch::equal(a[i], b[i])) return false;
  }
  return true;
}

bool is_one_of(const torch::Tensor& w, const std::vector<torch::Tensor>& candidates) {
  return std::any_of(candidates.begin(), candidates.end(), [&](const torch::Tensor& c) {
    return c.defined() && c.sizes() == w.sizes() && torch::equal(c, w);
  });
}

// Every call of every thread must return, bit for bit, what the same input
// returned when computed alone beforehand (the module is in eval mode). Even
// threads run under InferenceMode, odd ones with autograd on. Meanwhile a
// reader thread loads the weights: each load must be undefined or the whole
// weights of one call. Afterwards the weights must equal one call's
// (`records`), or stay undefined (`!records`).
void expect_threads_agree(const SharedModule& m, int calls_per_thread, bool records) {
  constexpr int kThreads = 8;
  std::vector<Outputs> expected;
  std::vector<torch::Tensor> expected_weights;
  for (size_t i = 0; i < m.inputs; ++i) {
    Outputs out = m.call(i);
    for (auto& t : out) t = t.detach();
    expected.push_back(std::move(out));
    if (m.weights) {
      const auto w = m.weights();
      expected_weights.push_back(w.defined() ? w.detach() : w);
    }
  }
  if (m.weights && records) {
    for (const auto& w : expected_weights) ASSERT_TRUE(w.defined());
  }

  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  std::atomic<bool> done{false};
  std::atomic<int> bad_loads{0};
  std::thread reader([&] {
    if (!m.weights) return;
    while (!done.load()) {
      const auto w = m.weights();
      if (w.defined() && !is_one_of(w, expected_weights)) ++bad_loads;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::optional<c10::InferenceMode> inference;
      if (t % 2 == 0) inference.emplace();
      try {
        for (int call = 0; call < calls_per_thread; ++call) {
          const size_t which = static_cast<size_t>(call + t) % m.inputs;
          if (!same(m.call(which), expected[which])) ++mismatches[t];
        }
      } catch (const c10::Error& e) {
        errors[t] = e.what_without_backtrace();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  reader.join();

  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(mismatches[t], 0) << "thread " << t << " got outputs unlike one thread's";
    EXPECT_EQ(errors[t], "") << "thread " << t;
  }
  EXPECT_EQ(bad_loads.load(), 0) << "a concurrent read saw weights of no single call";
  if (!m.weights) return;
  const auto last = m.weights();
  if (records) {
    ASSERT_TRUE(last.defined());
    EXPECT_TRUE(is_one_of(last, expected_weights)) << "the weights are none of the calls'";
  } else {
    EXPECT_FALSE(last.defined());
  }
}

TEST(ReliabilityConcurrency, SharedNWKernelRegression) {
  torch::manual_seed(40);
  d2l::NWKernelRegression net;
  net->eval();
  struct In {
    torch::Tensor q, k, v;
  };
  std::vector<In> inputs;
  for (int64_t n_q : {3, 5, 8}) {
    inputs.push_back({torch::rand({n_q}) * 5, torch::rand({n_q, 7}) * 5, torch::randn({n_q, 7})});
  }
  SharedModule m;
  m.inputs = inputs.size();
  m.call = [&](size_t i) { return Outputs{net(inputs[i].q, inputs[i].k, inputs[i].v)}; };
  m.weights = [&] { return net->last_attention_weights(); };
  expect_threads_agree(m, 500, /*records=*/true);
}

std::vector<Outputs> mha_inputs() {
  torch::manual_seed(41);
  std::vector<Outputs> sets;
  for (const auto& lens :
       {torch::Tensor(), torch::tensor({2, 4}), torch::tensor({{0, 4, 1}, {3, 9, 2}})}) {
    sets.push_back(
        {torch::randn({2, 3, 6}), torch::randn({2, 4, 5}), torch::randn({2, 4, 7}), lens});
  }
  return sets;
}

void expect_shared_multi_head_agrees(bool record) {
  torch::manual_seed(42);
  d2l::MultiHeadAttention mha(
      d2l::MultiHeadAttentionOptions(5, 6, 7, 8, 2).dropout(0.5).record_attention_weights(record));
  mha->eval();
  const auto inputs = mha_inputs();
  SharedModule m;
  m.inputs = inputs.size();
  m.call = [&](size_t i) {
    const auto& in = inputs[i];
    return Outputs{mha(in[0], in[1], in[2], in[3])};
  };
  m.weights = [&] { return mha->last_attention_weights(); };
  expect_threads_agree(m, 300, record);
}

TEST(ReliabilityConcurrency, SharedMultiHeadAttentionRecordingWeights) {
  expect_shared_multi_head_agrees(true);
}

TEST(ReliabilityConcurrency, SharedMultiHeadAttentionNotRecording) {
  expect_shared_multi_head_agrees(false);
}

using d2l::testing::kEmbed;
using d2l::testing::kHiddens;
using d2l::testing::kLayers;
using d2l::testing::kVocab;

// Token ids (B=2, steps) for a few step counts.
std::vector<torch::Tensor> token_sets(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> sets;
  for (int64_t steps : {1, 4, 6}) sets.push_back(torch::randint(0, kVocab, {2, steps}));
  return sets;
}

const std::vector<torch::Tensor>& source_lens() {
  static const std::vector<torch::Tensor> lens{torch::Tensor(), torch::tensor({3, 1}),
                                               torch::tensor({0, 5})};
  return lens;
}

TEST(ReliabilityConcurrency, SharedSeq2SeqEncoder) {
  torch::manual_seed(43);
  d2l::Seq2SeqEncoder encoder(kVocab, kEmbed, kHiddens, kLayers, 0.5);
  encoder->eval();
  const auto X = token_sets(44);
  SharedModule m;
  m.inputs = X.size();
  m.call = [&](size_t i) {
    auto out = encoder(X[i]);
    return Outputs{out.outputs, out.hidden_state};
  };
  expect_threads_agree(m, 100, /*records=*/false);
}

TEST(ReliabilityConcurrency, SharedSeq2SeqDecoder) {
  torch::manual_seed(45);
  const d2l::Seq2SeqOptions o(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqEncoder encoder(o);
  d2l::Seq2SeqDecoder decoder(d2l::Seq2SeqOptions(o).dropout(0.5));
  decoder->eval();
  const auto X = token_sets(46);
  const auto state = decoder->init_state(encoder(X[2]));
  SharedModule m;
  m.inputs = X.size();
  m.call = [&](size_t i) {
    auto [logits, next] = decoder(X[i], state);
    return Outputs{logits, next.hidden_state};
  };
  expect_threads_agree(m, 100, /*records=*/false);
}

TEST(ReliabilityConcurrency, SharedSeq2SeqAttentionDecoder) {
  torch::manual_seed(47);
  const d2l::Seq2SeqOptions o(kVocab, kEmbed, kHiddens, kLayers);
  d2l::Seq2SeqEncoder encoder(o);
  d2l::Seq2SeqAttentionDecoder decoder(d2l::Seq2SeqOptions(o).dropout(0.5));
  decoder->eval();
  const auto X = token_sets(48);
  const auto enc = encoder(torch::randint(0, kVocab, {2, 5}));
  SharedModule m;
  m.inputs = X.size();
  // Each call makes its own state, as every request of a server would.
  m.call = [&](size_t i) {
    const auto state = decoder->init_state(enc, source_lens()[i]);
    auto [logits, next] = decoder(X[i], state);
    return Outputs{logits, next.hidden_state, state.enc_outputs};
  };
  m.weights = [&] { return decoder->attention_weights(); };
  expect_threads_agree(m, 100, /*records=*/true);
}

TEST(ReliabilityConcurrency, SharedEncoderDecoder) {
  torch::manual_seed(49);
  auto model =
      d2l::testing::make_model(true, d2l::Seq2SeqOptions(kVocab, kEmbed, kHiddens, kLayers));
  model->eval();
  const auto decoder = std::dynamic_pointer_cast<d2l::AttentionDecoder>(model->decoder);
  ASSERT_TRUE(decoder);
  const auto source = token_sets(50), target = token_sets(51);
  SharedModule m;
  m.inputs = source.size();
  m.call = [&](size_t i) {
    auto [logits, state] = model(source[i], target[(i + 1) % target.size()], source_lens()[i]);
    return Outputs{logits, state.hidden_state};
  };
  m.weights = [&] { return decoder->attention_weights(); };
  expect_threads_agree(m, 100, /*records=*/true);
}

}  // namespace
