// Reliability, concurrency: one AdditiveAttention or DotProductAttention
// module shared by 8 threads (half under InferenceMode, half recording the
// graph), every output equal to one thread's. The TSan preset runs these
// (docs/reliability.md says what runs where).

#include <d2l/additive_attention.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/scaled_dot_product_attention.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <optional>
#include <string>
#include <thread>

#include "linear.h"
#include "packed_weights.h"
#include "test_utils.h"

namespace {

using d2l::AttentionBackend;

// ---------------------------------------------------------------------------
// Concurrency: one module, 8 threads, 1,000 forwards each.

struct QKV {
  torch::Tensor queries, keys, values, valid_lens;
};

// A few input sets, so that threads interleave different problems: no
// lengths, (B) lengths and (B, n) lengths with empty and over-long rows.
std::vector<QKV> concurrency_inputs(int64_t query_size, int64_t key_size) {
  torch::manual_seed(31);
  const int64_t B = 2, n = 3, m = 10;
  std::vector<QKV> sets;
  for (const auto& lens : {torch::Tensor(), torch::tensor({2, 6}),
                           torch::tensor({{0, 10, 4}, {7, 1, 30}}), torch::tensor({9, 3})}) {
    sets.push_back({torch::randn({B, n, query_size}), torch::randn({B, m, key_size}),
                    torch::randn({B, m, 4}), lens});
  }
  return sets;
}

// Every forward of every thread must equal, bit for bit, the output of the
// same input computed alone beforehand. Even threads run under InferenceMode,
// odd ones with autograd recording the graph, as a server's mix of callers
// would. With recording on, `attention_weights` must afterwards hold the
// weights of one of the calls; with it off, it must stay undefined.
template <typename Holder>
void expect_threads_agree_with_one_thread(Holder module, const std::vector<QKV>& inputs) {
  constexpr int kThreads = 8, kCalls = 1000;
  module->eval();
  std::vector<torch::Tensor> expected, expected_weights;
  for (const auto& in : inputs) {
    expected.push_back(module(in.queries, in.keys, in.values, in.valid_lens).detach());
    if (module->options.record_attention_weights()) {
      expected_weights.push_back(module->attention_weights.detach());
    }
  }
  module->attention_weights = torch::Tensor();

  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::optional<c10::InferenceMode> inference;
      if (t % 2 == 0) inference.emplace();
      try {
        for (int call = 0; call < kCalls; ++call) {
          const size_t which = static_cast<size_t>(call + t) % inputs.size();
          const auto& in = inputs[which];
          const auto out = module(in.queries, in.keys, in.values, in.valid_lens);
          if (!torch::equal(out, expected[which])) ++mismatches[t];
        }
      } catch (const c10::Error& e) {
        errors[t] = e.what_without_backtrace();
      }
    });
  }
  for (auto& thread : threads) thread.join();

  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(mismatches[t], 0) << "thread " << t << " got outputs unlike one thread's";
    EXPECT_EQ(errors[t], "") << "thread " << t;
  }
  if (module->options.record_attention_weights()) {
    ASSERT_TRUE(module->attention_weights.defined());
    const bool one_of_them =
        std::any_of(expected_weights.begin(), expected_weights.end(), [&](const auto& w) {
          return w.sizes() == module->attention_weights.sizes() &&
                 torch::equal(w, module->attention_weights);
        });
    EXPECT_TRUE(one_of_them) << "attention_weights holds none of the calls' weights";
    EXPECT_TRUE(torch::equal(module->last_attention_weights(), module->attention_weights));
    EXPECT_FALSE(module->attention_weights.requires_grad()) << "a shared module holds a graph";
  } else {
    EXPECT_FALSE(module->attention_weights.defined());
    EXPECT_FALSE(module->last_attention_weights().defined());
  }
}

TEST(ReliabilityConcurrency, SharedAdditiveAttentionRecordingWeights) {
  for (AttentionBackend path : {AttentionBackend::kAuto, AttentionBackend::kComposite}) {
    torch::manual_seed(30);
    d2l::AdditiveAttention module(d2l::AdditiveAttentionOptions(5, 6, 8).backend(path));
    expect_threads_agree_with_one_thread(module, concurrency_inputs(6, 5));
  }
}

TEST(ReliabilityConcurrency, SharedAdditiveAttentionNotRecording) {
  torch::manual_seed(30);
  d2l::AdditiveAttention module(
      d2l::AdditiveAttentionOptions(5, 6, 8).record_attention_weights(false));
  expect_threads_agree_with_one_thread(module, concurrency_inputs(6, 5));
}

TEST(ReliabilityConcurrency, SharedDotProductAttentionRecordingWeights) {
  for (AttentionBackend path : {AttentionBackend::kAuto, AttentionBackend::kComposite}) {
    d2l::DotProductAttention module(d2l::DotProductAttentionOptions().dropout(0.5).backend(path));
    expect_threads_agree_with_one_thread(module, concurrency_inputs(5, 5));
  }
}

TEST(ReliabilityConcurrency, SharedDotProductAttentionNotRecording) {
  d2l::DotProductAttention module(
      d2l::DotProductAttentionOptions().dropout(0.5).record_attention_weights(false));
  expect_threads_agree_with_one_thread(module, concurrency_inputs(5, 5));
}

// Threads packing one weight, rechecking it and multiplying by it at once
// (Note [Packed weights]).
TEST(ReliabilityConcurrency, ThreadsShareAWeightsPackedCopy) {
  d2l::detail::release_packed_weights();
  torch::manual_seed(13);
  const auto W = torch::randn({640, 128});
  const auto x = torch::randn({16, 128});
  const auto expected = torch::nn::functional::linear(x.to(torch::kDouble), W.to(torch::kDouble));
  std::vector<torch::Tensor> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        if (i % 5 == 0) d2l::detail::recheck_packed_weights();
        auto y = torch::empty({16, 640});
        d2l::detail::linear_into<float>(y.data_ptr<float>(), x.data_ptr<float>(), 16, W, {});
        results[t] = y;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& r : results) {
    EXPECT_LT((r.to(torch::kDouble) - expected).abs().max().item<double>(), 1e-3);
    EXPECT_TRUE(torch::equal(r, results[0]));
  }
}

// Threads calling Python's SDPA at once, forward and backward, grouped heads
// and a prefix mask (the flash kernel), each result equal to one thread's.
TEST(ReliabilityConcurrency, ThreadsCallScaledDotProductAttentionAtOnce) {
  namespace F = d2l::nn::functional;
  torch::manual_seed(17);
  const auto q = torch::randn({2, 8, 40, 16}), k = torch::randn({2, 2, 50, 16}),
             v = torch::randn({2, 2, 50, 16});
  const auto mask = torch::arange(50) < torch::tensor({30, 50}).view({2, 1, 1, 1});
  const auto options = F::ScaledDotProductAttentionFuncOptions().attn_mask(mask).enable_gqa(true);
  const auto run = [&] {
    auto qq = q.clone().requires_grad_();
    auto out = F::scaled_dot_product_attention(qq, k, v, options);
    out.sum().backward();
    return std::make_pair(out.detach(), qq.grad());
  };
  const auto expected = run();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) results[t] = run();
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& [out, grad] : results) {
    EXPECT_TRUE(torch::equal(out, expected.first));
    EXPECT_TRUE(torch::equal(grad, expected.second));
  }
}

}  // namespace
