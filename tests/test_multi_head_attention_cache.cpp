// MultiHeadAttention over keys and values projected once
// (MultiHeadAttentionCache, forward_cached; Note [Cached keys and values]):
// the numbers of forward over the concatenated keys, in every mode and path,
// the buffers, the choice of path and the errors.

#include <d2l/multi_head_attention.h>

#include <gmock/gmock.h>

#include <algorithm>
#include <array>
#include <functional>
#include <set>

#include "test_utils.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::max_rel_error;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kKeySize = 5, kQuerySize = 7, kValueSize = 6;

d2l::MultiHeadAttention cache_module(int64_t hiddens, int64_t heads, bool bias,
                                     torch::ScalarType dtype, double dropout = 0.0) {
  torch::manual_seed(11);
  d2l::MultiHeadAttention m(
      d2l::MultiHeadAttentionOptions(kKeySize, kQuerySize, kValueSize, hiddens, heads)
          .bias(bias)
          .dropout(dropout));
  m->to(dtype);
  m->eval();
  return m;
}

// bfloat16 keeps 8 bits: projecting keys in another grouping may round a
// projection's last bit otherwise.
double tolerance_of(torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 ? 2e-2 : dtype == torch::kFloat ? 2e-5 : 1e-12;
}

// Steps of s new keys each, with n queries each: each cached call against
// forward over every key so far, output and weights, masked by `mask_of`
// (the keys so far -> the mask over them). With `exact` (the same module in
// float64), for bfloat16: the products round as the BLAS kernels LibTorch
// picks for this CPU and for each shape do, so the bound is tolerance_of or
// 2.5 times forward's own error against `exact`, whichever is larger (the
// cached result as accurate as forward's, the two differ by up to twice
// that error; and a quarter more for the luck of the draw).
void expect_steps_match_forward(d2l::MultiHeadAttention& m, torch::ScalarType dtype, int64_t batch,
                                const std::vector<std::pair<int64_t, int64_t>>& steps,
                                const std::function<d2l::AttentionMask(int64_t, int64_t)>& mask_of,
                                d2l::MultiHeadAttention* exact = nullptr) {
  const auto options = torch::TensorOptions().dtype(dtype);
  d2l::MultiHeadAttentionCache cache;
  torch::Tensor keys, values;
  for (const auto& [s, n] : steps) {
    const auto k = torch::randn({batch, s, kKeySize}, options);
    const auto v = torch::randn({batch, s, kValueSize}, options);
    const auto q = torch::randn({batch, n, kQuerySize}, options);
    keys = keys.defined() ? torch::cat({keys, k}, 1) : k;
    values = values.defined() ? torch::cat({values, v}, 1) : v;
    const auto mask = mask_of(keys.size(1), n);
    const auto cached = m->forward_cached(q, k, v, cache, mask);
    const auto cached_weights = m->last_attention_weights();
    const auto expected = m->forward(q, keys, values, mask);
    ASSERT_EQ(cache.size(), keys.size(1));
    double out_bound = tolerance_of(dtype), weights_bound = tolerance_of(dtype);
    if (exact != nullptr) {
      const auto wide = (*exact)->forward(q.to(torch::kDouble), keys.to(torch::kDouble),
                                          values.to(torch::kDouble), mask);
      out_bound = std::max(out_bound, 2.5 * max_rel_error(expected, wide));
      const auto wide_weights = (*exact)->last_attention_weights();
      weights_bound =
          std::max(weights_bound, 2.5 * max_rel_error(m->last_attention_weights(), wide_weights));
    }
    EXPECT_LT(max_rel_error(cached, expected), out_bound)
        << "step with " << s << " keys, " << n << " queries, " << keys.size(1) << " keys in all";
    EXPECT_LT(max_rel_error(cached_weights, m->last_attention_weights()), weights_bound);
    EXPECT_EQ(cached_weights.sizes(), m->last_attention_weights().sizes());
  }
}

const std::vector<std::pair<int64_t, int64_t>> kSteps{{3, 3}, {1, 1}, {5, 2},
                                                      {1, 1}, {9, 1}, {1, 1}};

TEST(MultiHeadAttentionCache, ForwardCachedEqualsForwardOverTheConcatenatedKeys) {
  torch::NoGradGuard no_grad;
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    for (const bool bias : {false, true}) {
      for (const int64_t batch : {1, 4}) {
        auto m = cache_module(8, 2, bias, dtype);
        SCOPED_TRACE(::testing::Message()
                     << c10::toString(dtype) << " bias " << bias << " batch " << batch);
        expect_steps_match_forward(m, dtype, batch, kSteps,
                                   [](int64_t, int64_t) { return d2l::AttentionMask(); });
      }
    }
  }
}

TEST(MultiHeadAttentionCache, MasksAreOverEveryCachedKey) {
  torch::NoGradGuard no_grad;
  const int64_t batch = 3;
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto m = cache_module(8, 2, true, dtype);
    // The book's lengths, (B) and (B, n); a key-padding mask; the causal flag.
    expect_steps_match_forward(m, dtype, batch, kSteps, [](int64_t keys, int64_t) {
      return d2l::AttentionMask().valid_lens(
          torch::tensor({keys, std::max<int64_t>(1, keys - 2), int64_t{1}}));
    });
    expect_steps_match_forward(m, dtype, batch, kSteps, [](int64_t keys, int64_t n) {
      return d2l::AttentionMask().valid_lens(torch::randint(0, keys + 2, {batch, n}, torch::kLong));
    });
    expect_steps_match_forward(m, dtype, batch, kSteps, [](int64_t keys, int64_t) {
      auto padding = torch::zeros({batch, keys}, torch::kBool);
      padding[1].narrow(0, keys / 2, keys - keys / 2).fill_(true);
      return d2l::AttentionMask().key_padding_mask(padding);
    });
    expect_steps_match_forward(m, dtype, batch, kSteps, [](int64_t, int64_t) {
      return d2l::AttentionMask().is_causal(true);
    });
    // A mask that is not a prefix: the composite path over the cached keys.
    expect_steps_match_forward(m, dtype, batch, kSteps, [](int64_t keys, int64_t n) {
      auto blocked = torch::rand({n, keys}) < 0.4;
      blocked.select(1, 0).fill_(false);
      return d2l::AttentionMask().attn_mask(blocked);
    });
  }
}

TEST(MultiHeadAttentionCache, LargeHeadsTakeThePerHeadPath) {
  // 16 features a head and 40 keys: past small_heads' 32 x 32.
  torch::NoGradGuard no_grad;
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    auto m = cache_module(32, 2, false, dtype);
    expect_steps_match_forward(m, dtype, 2, {{20, 20}, {20, 20}, {1, 1}, {1, 1}},
                               [](int64_t, int64_t) { return d2l::AttentionMask(); });
  }
}

TEST(MultiHeadAttentionCache, BFloat16StridedViewsAndEmptySizes) {
  torch::NoGradGuard no_grad;
  // bfloat16 runs the per-head path, as forward does.
  auto m = cache_module(8, 2, true, torch::kBFloat16);
  auto exact = cache_module(8, 2, true, torch::kBFloat16);  // the same bfloat16 weights,
  exact->to(torch::kDouble);                                // in float64
  expect_steps_match_forward(
      m, torch::kBFloat16, 2, {{3, 3}, {1, 1}, {2, 1}},
      [](int64_t, int64_t) { return d2l::AttentionMask(); }, &exact);
  // Views with strides of their own give the numbers of their contiguous copies
  // (to rounding: a BLAS such as MKL sums a transposed operand in another order).
  auto f = cache_module(8, 2, false, torch::kFloat);
  const auto k = torch::randn({5, 2, kKeySize}).transpose(0, 1);
  const auto v = torch::randn({2, 5, 2 * kValueSize}).narrow(2, 1, kValueSize);
  const auto q = torch::randn({kQuerySize, 2, 3}).permute({1, 2, 0});
  d2l::MultiHeadAttentionCache strided, contiguous;
  EXPECT_LT(d2l::testing::max_rel_error(
                f->forward_cached(q, k, v, strided),
                f->forward_cached(q.contiguous(), k.contiguous(), v.contiguous(), contiguous)),
            1e-6);
  // No queries, and a batch of none.
  EXPECT_EQ(f->forward_cached(q.narrow(1, 0, 0), {}, {}, strided).sizes(),
            (std::vector<int64_t>{2, 0, 8}));
  d2l::MultiHeadAttentionCache none;
  EXPECT_EQ(f->forward_cached(torch::randn({0, 1, kQuerySize}), torch::randn({0, 2, kKeySize}),
                              torch::randn({0, 2, kValueSize}), none)
                .sizes(),
            (std::vector<int64_t>{0, 1, 8}));
}

TEST(MultiHeadAttentionCache, ExplainPathIsForwardsForTheSameKeys) {
  torch::NoGradGuard no_grad;
  for (const bool record : {true, false}) {
    for (const int64_t hiddens : {8, 128}) {
      torch::manual_seed(3);
      d2l::MultiHeadAttention m(
          d2l::MultiHeadAttentionOptions(kKeySize, kQuerySize, kValueSize, hiddens, 2)
              .record_attention_weights(record));
      m->eval();
      const auto past = torch::randn({2, 40, kKeySize});
      auto cache = m->project_memory(past, torch::randn({2, 40, kValueSize}));
      // One query (a decoding step) for small heads; 40 queries of 64
      // features a head over 41 keys are past small_heads.
      const int64_t n = hiddens == 8 ? 1 : 40;
      const auto q = torch::randn({2, n, kQuerySize});
      const auto k = torch::randn({2, 1, kKeySize});
      const auto v = torch::randn({2, 1, kValueSize});
      const auto all_keys = torch::zeros({2, 41, kKeySize});
      const auto all_values = torch::zeros({2, 41, kValueSize});
      const auto cached = m->explain_path_cached(q, k, v, cache);
      const auto plain = m->explain_path(q, all_keys, all_values);
      EXPECT_EQ(cached.path, plain.path) << cached.to_string();
      EXPECT_EQ(cached.reasons, plain.reasons);
      EXPECT_EQ(cached.op, "d2l::MultiHeadAttention::forward_cached");
      // Without weights to keep, the larger heads run the flash kernel.
      if (hiddens == 8) EXPECT_EQ(cached.path, "small_heads");
      if (hiddens == 128 && !record) EXPECT_EQ(cached.path, "flash") << cached.to_string();
      EXPECT_EQ(cache.size(), 40) << "explain_path_cached appended";
    }
  }
}

TEST(MultiHeadAttentionCache, BuffersGrowByDoublingAndKeepThePast) {
  torch::NoGradGuard no_grad;
  auto m = cache_module(8, 2, false, torch::kFloat);
  d2l::MultiHeadAttentionCache cache;
  std::vector<const void*> data;
  for (int64_t t = 0; t < 20; ++t) {
    const auto k = torch::randn({2, 1, kKeySize});
    m->forward_cached(torch::randn({2, 1, kQuerySize}), k, torch::randn({2, 1, kValueSize}), cache);
    data.push_back(cache.keys().data_ptr());
  }
  // The first key's own buffer, then 8, 16 and 32 rows: four for twenty steps.
  EXPECT_EQ(std::set<const void*>(data.begin(), data.end()).size(), 4u);
  EXPECT_EQ(data[1], data[7]);
  EXPECT_NE(data[7], data[8]);
  EXPECT_EQ(data[8], data[15]);
  // A clone branches: appending to it leaves the original alone.
  auto branch = cache.clone();
  m->extend_cache(branch, torch::randn({2, 2, kKeySize}), torch::randn({2, 2, kValueSize}));
  EXPECT_EQ(branch.size(), 22);
  EXPECT_EQ(cache.size(), 20);
  EXPECT_TRUE(torch::equal(branch.keys().narrow(1, 0, 20), cache.keys()));
  cache.clear();
  EXPECT_TRUE(cache.empty());
  EXPECT_FALSE(cache.keys().defined());
}

// Beam search's reorder: each select_rows writes into the buffers of the
// cache two reorders back once nothing else holds them, and never into a
// buffer a cache, a copy or a view still holds.
TEST(MultiHeadAttentionCache, SelectRowsReusesOnlyBuffersNothingElseHolds) {
  torch::NoGradGuard no_grad;
  auto m = cache_module(8, 2, false, torch::kFloat);
  const auto step = [&](d2l::MultiHeadAttentionCache& c) {
    m->extend_cache(c, torch::randn({3, 1, kKeySize}), torch::randn({3, 1, kValueSize}));
  };
  d2l::MultiHeadAttentionCache cache;
  step(cache);
  step(cache);  // 2 keys in buffers of 8
  const auto index = torch::tensor({2, 0, 0}, torch::kLong);
  std::vector<const void*> data;
  for (int t = 0; t < 5; ++t) {  // a beam's loop: the cache before each reorder dropped
    const auto keys = cache.keys().index_select(0, index);
    const auto values = cache.values().index_select(0, index);
    cache = cache.select_rows(index);
    EXPECT_TRUE(torch::equal(cache.keys(), keys)) << t;
    EXPECT_TRUE(torch::equal(cache.values(), values)) << t;
    data.push_back(cache.keys().data_ptr());
    step(cache);
  }
  EXPECT_EQ(std::set<const void*>(data.begin(), data.end()).size(), 2u);
  EXPECT_NE(data[0], data[1]);
  EXPECT_EQ(data[1], data[3]);
  // A copy held on to: neither its buffers nor the spares it shares are written.
  const auto kept = cache;
  const auto kept_keys = kept.keys().clone();
  auto first = cache.select_rows(index);
  auto second = first.select_rows(index);
  EXPECT_TRUE(torch::equal(kept.keys(), kept_keys));
  EXPECT_NE(second.keys().data_ptr(), kept.keys().data_ptr());
  // A tensor sharing the memory of a cache that is gone (a detached view:
  // no handle on the buffer, only its storage) keeps the buffer from reuse.
  const auto view = second.keys().detach();
  const auto view_values = view.clone();
  auto third = second.select_rows(index);
  second = d2l::MultiHeadAttentionCache();
  const auto fourth = third.select_rows(index);
  EXPECT_TRUE(torch::equal(view, view_values));
  EXPECT_NE(fourth.keys().data_ptr(), view.data_ptr());
}

// Beam search's rows of finished sources dropped: a reorder into fewer rows
// writes into the first rows of the spare buffers rather than allocating.
TEST(MultiHeadAttentionCache, SelectRowsIntoFewerRowsReusesTheBuffers) {
  torch::NoGradGuard no_grad;
  auto m = cache_module(8, 2, false, torch::kFloat);
  const auto step = [&](d2l::MultiHeadAttentionCache& c, int64_t rows) {
    m->extend_cache(c, torch::randn({rows, 1, kKeySize}), torch::randn({rows, 1, kValueSize}));
  };
  d2l::MultiHeadAttentionCache cache;
  step(cache, 6);
  step(cache, 6);  // 2 keys in buffers of 8
  std::vector<const void*> data;
  for (const int64_t rows : {6, 6, 5, 3, 2, 1}) {
    const auto index = torch::arange(rows, torch::kLong).flip(0) % 4;
    const auto keys = cache.keys().index_select(0, index);
    const auto values = cache.values().index_select(0, index);
    cache = cache.select_rows(index);
    EXPECT_EQ(cache.keys().size(0), rows);
    EXPECT_TRUE(torch::equal(cache.keys(), keys)) << rows;
    EXPECT_TRUE(torch::equal(cache.values(), values)) << rows;
    data.push_back(cache.keys().data_ptr());
    step(cache, rows);
  }
  // Each reorder writes into the buffer of the one two before it.
  for (size_t i = 2; i < data.size(); ++i) EXPECT_EQ(data[i], data[i - 2]) << i;
  EXPECT_NE(data[0], data[1]);
}

TEST(MultiHeadAttentionCache, DropoutInTrainingDrawsAsForwardDraws) {
  // Small heads (4 features, 3 x 20), then the per-head path (32, 40 x 40).
  for (const auto& [hiddens, n, m_keys] :
       std::vector<std::array<int64_t, 3>>{{8, 3, 20}, {64, 40, 40}}) {
    auto m = cache_module(hiddens, 2, false, torch::kDouble, 0.5);
    m->train();
    torch::NoGradGuard no_grad;
    const auto opts = torch::TensorOptions().dtype(torch::kDouble);
    const auto k = torch::randn({2, m_keys, kKeySize}, opts);
    const auto v = torch::randn({2, m_keys, kValueSize}, opts);
    const auto q = torch::randn({2, n, kQuerySize}, opts);
    auto cache = m->project_memory(k.narrow(1, 0, m_keys - 3), v.narrow(1, 0, m_keys - 3));
    torch::manual_seed(5);
    const auto cached =
        m->forward_cached(q, k.narrow(1, m_keys - 3, 3), v.narrow(1, m_keys - 3, 3), cache);
    torch::manual_seed(5);
    EXPECT_LT(max_rel_error(cached, m->forward(q, k, v)), 1e-12) << hiddens;
  }
}

TEST(MultiHeadAttentionCache, GradientsFlowThroughTheCacheAsThroughForward) {
  for (const int64_t hiddens : {8, 64}) {
    const auto opts = torch::TensorOptions().dtype(torch::kDouble);
    const auto k = torch::randn({2, 6, kKeySize}, opts), v = torch::randn({2, 6, kValueSize}, opts);
    const auto q = torch::randn({2, 6, kQuerySize}, opts);
    auto run = [&](bool cached) {
      auto m = cache_module(hiddens, 2, true, torch::kDouble);
      const auto kl = k.clone().requires_grad_(), vl = v.clone().requires_grad_();
      torch::Tensor loss = torch::zeros({}, opts);
      d2l::MultiHeadAttentionCache cache;
      for (int64_t t = 0; t < 3; ++t) {  // two keys and two queries a step
        const auto qt = q.narrow(1, 2 * t, 2);
        const auto out =
            cached ? m->forward_cached(qt, kl.narrow(1, 2 * t, 2), vl.narrow(1, 2 * t, 2), cache)
                   : m->forward(qt, kl.narrow(1, 0, 2 * t + 2), vl.narrow(1, 0, 2 * t + 2));
        loss = loss + (out * out).sum();
      }
      loss.backward();
      std::vector<torch::Tensor> grads{kl.grad(), vl.grad()};
      for (const auto& p : m->parameters()) grads.push_back(p.grad());
      return grads;
    };
    const auto cached = run(true), expected = run(false);
    ASSERT_EQ(cached.size(), expected.size());
    for (size_t i = 0; i < cached.size(); ++i) {
      ASSERT_TRUE(cached[i].defined()) << i;
      EXPECT_LT(max_rel_error(cached[i], expected[i]), 1e-10) << "gradient " << i;
    }
  }
}

TEST(MultiHeadAttentionCache, ErrorsNameTheFunctionTheArgumentAndTheShapes) {
  torch::NoGradGuard no_grad;
  auto m = cache_module(8, 2, false, torch::kFloat);
  const std::string fn = "d2l::MultiHeadAttention::forward_cached";
  d2l::MultiHeadAttentionCache cache;
  const auto q = torch::randn({2, 1, kQuerySize});
  const auto k = torch::randn({2, 1, kKeySize});
  const auto v = torch::randn({2, 1, kValueSize});
  EXPECT_THAT(error_message([&] { m->forward_cached(q, {}, {}, cache); }),
              AllOf(StartsWith(fn), HasSubstr("holds no keys"), HasSubstr("[2, 1, 7]")));
  EXPECT_THAT(error_message([&] { m->forward_cached(q, k, {}, cache); }),
              AllOf(StartsWith(fn), HasSubstr("new_keys and new_values"), HasSubstr("[2, 1, 5]")));
  EXPECT_THAT(error_message([&] {
                m->forward_cached(q, torch::randn({2, 1, 4}), v, cache);
              }),
              AllOf(StartsWith(fn), HasSubstr("key_size=5"), HasSubstr("new_keys [2, 1, 4]")));
  EXPECT_THAT(error_message([&] { m->forward_cached(q, k.to(torch::kDouble), v, cache); }),
              AllOf(StartsWith(fn), HasSubstr("new_keys"), HasSubstr("Double")));
  EXPECT_THAT(error_message([&] {
                m->project_memory(torch::randn({2, 3, 4}), v);
              }),
              AllOf(StartsWith("d2l::MultiHeadAttention::project_memory"),
                    HasSubstr("keys must have shape [batch_size, s, key_size=5]"),
                    HasSubstr("keys [2, 3, 4]")));
  m->forward_cached(q, k, v, cache);
  EXPECT_THAT(error_message([&] {
                m->forward_cached(torch::randn({3, 1, kQuerySize}), torch::randn({3, 1, kKeySize}),
                                  torch::randn({3, 1, kValueSize}), cache);
              }),
              AllOf(StartsWith(fn), HasSubstr("batch size"), HasSubstr("[3, 1, 5]"),
                    HasSubstr("[2, 1, 8]")));
  EXPECT_THAT(error_message([&] {
                m->forward_cached(torch::randn({3, 1, kQuerySize}), {}, {}, cache);
              }),
              AllOf(StartsWith(fn), HasSubstr("queries"), HasSubstr("[3, 1, 7]")));
  // Masks are checked against every key held, before anything is appended.
  EXPECT_THAT(error_message([&] {
                m->forward_cached(
                    q, k, v, cache,
                    d2l::AttentionMask().key_padding_mask(torch::zeros({2, 1}, torch::kBool)));
              }),
              AllOf(StartsWith(fn), HasSubstr("key_padding_mask"), HasSubstr("[2, 1]")));
  EXPECT_EQ(cache.size(), 1);
  auto other = cache_module(8, 2, false, torch::kFloat);
  EXPECT_THAT(error_message([&] { other->forward_cached(q, k, v, cache); }),
              AllOf(StartsWith(fn), HasSubstr("another MultiHeadAttention")));
  m->W_k->weight.add_(1);
  EXPECT_THAT(error_message([&] { m->forward_cached(q, k, v, cache); }),
              AllOf(StartsWith(fn), HasSubstr("W_k or W_v changed")));
  EXPECT_THAT(error_message([&] { m->extend_cache(cache, k, v); }),
              StartsWith("d2l::MultiHeadAttention::extend_cache: cache was filled before"));
  EXPECT_EQ(cache.size(), 1);
}

// Note [Caches keyed on weights]: edits that autograd's version counter does
// not see (through .data(), the usual C++ idiom for loading weights) and
// Module::to are refused by name, never answered with the old projections.
TEST(MultiHeadAttentionCache, EditsThroughDataAndToAreRefused) {
  torch::NoGradGuard no_grad;
  const std::string fn = "d2l::MultiHeadAttention::forward_cached";
  const auto q = torch::randn({2, 1, kQuerySize});
  const auto k = torch::randn({2, 3, kKeySize});
  const auto v = torch::randn({2, 3, kValueSize});
  for (const bool bias : {false, true}) {
    for (const int which : {0, 1, 2}) {  // W_k's weight, W_v's weight, W_k's bias
      if (which == 2 && !bias) continue;
      SCOPED_TRACE(::testing::Message() << "bias " << bias << ", parameter " << which);
      auto m = cache_module(8, 2, bias, torch::kFloat);
      auto memory = m->project_memory(k, v);
      auto param = which == 0 ? m->W_k->weight : which == 1 ? m->W_v->weight : m->W_k->bias;
      // One element, as an edit of one weight would: a fingerprint of a
      // sample of the weights would miss it.
      const auto saved = param.detach().clone();
      param.data().view(-1)[param.numel() - 1] += 0.5;
      EXPECT_THAT(error_message([&] { m->forward_cached(q, {}, {}, memory); }),
                  AllOf(StartsWith(fn), HasSubstr("W_k or W_v changed"), HasSubstr(".data()")));
      // Put back bit for bit: the cache serves again, with forward's numbers.
      param.data().copy_(saved);
      const auto direct = m->forward(q, k, v);
      const auto reference = m->forward_cached(q, {}, {}, memory);
      EXPECT_LE(max_rel_error(reference, direct), 1e-5);
    }
  }
  auto m = cache_module(8, 2, true, torch::kFloat);
  auto memory = m->project_memory(k, v);
  m->to(torch::kDouble);
  EXPECT_THAT(error_message([&] { m->forward_cached(q.to(torch::kDouble), {}, {}, memory); }),
              AllOf(StartsWith(fn), HasSubstr("W_k or W_v changed")));
  // A weight swapped in place for another tensor's values (Module::load's
  // set_data) is another pointer, the same parameter object.
  auto n = cache_module(8, 2, false, torch::kFloat);
  auto held = n->project_memory(k, v);
  n->W_v->weight.set_data(n->W_v->weight.detach().clone());
  EXPECT_THAT(error_message([&] { n->forward_cached(q, {}, {}, held); }),
              AllOf(StartsWith(fn), HasSubstr("W_k or W_v changed")));
  // A decoding loop that knows its weights fixed leaves the bytes out (as the
  // library's decoders do): an edit through .data() is then its own to
  // announce, and every other change is still refused.
  auto fast = cache_module(8, 2, false, torch::kFloat);
  auto step_cache = fast->project_memory(k, v);
  EXPECT_TRUE(step_cache.check_weight_bytes());
  step_cache.set_check_weight_bytes(false);
  fast->W_k->weight.data().view(-1)[0] += 0.5;
  EXPECT_NO_THROW(fast->forward_cached(q, {}, {}, step_cache));
  fast->W_k->weight.mul_(2);
  EXPECT_THAT(error_message([&] { fast->forward_cached(q, {}, {}, step_cache); }),
              AllOf(StartsWith(fn), HasSubstr("W_k or W_v changed")));
}

}  // namespace
