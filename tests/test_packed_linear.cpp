// The packed linear kernel (cpu/packed_linear_kernel.cpp, Note [Packed
// linear]) under detail::linear_into, and the table of packed weights that
// feeds it (Note [Packed weights]).

#include <d2l/backend.h>
#include <d2l/multi_head_attention.h>

#include <c10/core/InferenceMode.h>

#include <fmt/format.h>

#include <vector>

#include "fused_helpers.h"
#include "linear.h"
#include "packed_weights.h"
#include "test_utils.h"

namespace packed_linear_tests {

using d2l::testing::Fused;
using d2l::testing::max_rel_error;

torch::Tensor product(const torch::Tensor& x, const torch::Tensor& W,
                      const torch::Tensor& b = torch::Tensor()) {
  auto y = torch::empty({x.size(0), W.size(0)}, x.options());
  d2l::detail::linear_into<float>(y.data_ptr<float>(), x.data_ptr<float>(), x.size(0), W, b);
  return y;
}

torch::Tensor reference(const torch::Tensor& x, const torch::Tensor& W,
                        const torch::Tensor& b = torch::Tensor()) {
  return torch::nn::functional::linear(x.to(torch::kDouble), W.to(torch::kDouble),
                                       b.defined() ? b.to(torch::kDouble) : torch::Tensor());
}

class PackedLinear : public Fused {};

TEST_P(PackedLinear, MatchesTheProductInDouble) {
  torch::manual_seed(3);
  // N not a multiple of any panel; K from 1; rows around the tiles (6 and 8)
  // and the lone rows' groups of panels.
  for (const auto [K, N] :
       {std::pair<int64_t, int64_t>{1, 70000}, {5, 13108}, {300, 1000}, {512, 2048}, {129, 515}}) {
    const auto W = torch::randn({N, K});
    ASSERT_GE(W.numel(), d2l::detail::kPackedMinimumElements);
    for (const int64_t rows : {8, 9, 13, 16, 37, 70}) {
      for (const bool bias : {false, true}) {
        const auto x = torch::randn({rows, K});
        const auto b = bias ? torch::randn({N}) : torch::Tensor();
        const auto expected = reference(x, W, b);
        const double functional_error =
            max_rel_error(torch::nn::functional::linear(x, W, b).to(torch::kDouble), expected);
        EXPECT_LT(max_rel_error(product(x, W, b).to(torch::kDouble), expected),
                  4 * functional_error + 1e-7)
            << fmt::format("rows {} K {} N {} bias {} (functional::linear's error {})", rows, K, N,
                           bias, functional_error);
      }
    }
  }
  EXPECT_GT(d2l::detail::packed_weights_held(), 0);
}

TEST_P(PackedLinear, SmallWeightsAreMultipliedAtAnyRows) {
  // Below kPackedMinimumElements every product is packed, from one row:
  // the book's sizes (32 × 32, the FFN's 64 × 32, 200 words), K and N off
  // the vectors, and the rows that fill no tile.
  torch::manual_seed(13);
  for (const auto [K, N] :
       {std::pair<int64_t, int64_t>{32, 32}, {32, 64}, {64, 32}, {32, 200}, {7, 45}, {1, 3}}) {
    const auto W = torch::randn({N, K});
    ASSERT_LT(W.numel(), d2l::detail::kPackedMinimumElements);
    for (const int64_t rows : {1, 2, 3, 7, 8, 9, 17}) {
      const auto x = torch::randn({rows, K});
      const auto b = torch::randn({N});
      const auto expected = reference(x, W, b);
      const double functional_error =
          max_rel_error(torch::nn::functional::linear(x, W, b).to(torch::kDouble), expected);
      // The DEFAULT build rounds products and sums apart (test_fused_linear.cpp).
      const double factor = GetParam() == d2l::CpuIsa::kDefault ? 8 : 4;
      EXPECT_LT(max_rel_error(product(x, W, b).to(torch::kDouble), expected),
                factor * functional_error + 1e-7)
          << fmt::format("rows {} K {} N {} (functional::linear's error {})", rows, K, N,
                         functional_error);
    }
    // A row's bits whatever the rows beside it, from a batch of one.
    const auto x = torch::randn({12, K});
    const auto all = product(x, W);
    for (const int64_t rows : {1, 2, 5, 8, 11}) {
      const auto some = product(x.narrow(0, 12 - rows, rows).contiguous(), W);
      EXPECT_TRUE(torch::equal(some[rows - 1], all[11])) << rows << " rows, K " << K << " N " << N;
    }
  }
}

TEST_P(PackedLinear, ARowGetsTheSameBitsInAnyBatchAndAtAnyThreads) {
  torch::manual_seed(5);
  const int64_t K = 200, N = 777;
  const auto W = torch::randn({N, K});
  const auto b = torch::randn({N});
  const auto x = torch::randn({70, K});
  const auto all = product(x, W, b);
  for (const int64_t rows : {8, 9, 14, 31}) {
    // Row `rows - 1` (the last: a lone row past the tiles in some batches,
    // in a tile in others) among other rows.
    const auto some = product(x.narrow(0, 70 - rows, rows).contiguous(), W, b);
    EXPECT_TRUE(torch::equal(some[rows - 1], all[69])) << rows << " rows";
    const auto copies = x[5].unsqueeze(0).expand({rows, K}).contiguous();
    EXPECT_TRUE(torch::equal(product(copies, W, b)[rows - 1], all[5])) << rows << " copies";
  }
  const auto saved = d2l::cpu_threads();
  d2l::set_num_threads(1);
  const auto one = product(x, W, b);
  d2l::set_num_threads(2);
  const auto two = product(x, W, b);
  d2l::set_num_threads(saved.intra_op, std::max<int64_t>(saved.openblas, 1));
  EXPECT_TRUE(torch::equal(one, all));
  EXPECT_TRUE(torch::equal(two, all));
}

INSTANTIATE_TEST_SUITE_P(Isa, PackedLinear, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

TEST(PackedLinear, FusedInstructionSetsGiveTheSameBits) {
  torch::manual_seed(7);
  const auto W = torch::randn({1000, 96});
  const auto x = torch::randn({11, 96});
  const auto saved = d2l::cpu_isa();
  std::vector<torch::Tensor> outputs;
  for (const auto isa : {d2l::CpuIsa::kAvx2, d2l::CpuIsa::kAvx512}) {
    if (!d2l::cpu_isa_available(isa)) continue;
    d2l::set_cpu_isa(isa);
    outputs.push_back(product(x, W));
  }
  d2l::set_cpu_isa(saved);
  if (outputs.size() < 2) GTEST_SKIP() << "one fused instruction set on this CPU";
  EXPECT_TRUE(torch::equal(outputs[0], outputs[1]));
}

TEST(PackedWeights, FollowEveryChangeOfTheWeight) {
  torch::manual_seed(9);
  auto W = torch::randn({512, 256});
  const auto x = torch::randn({12, 256});
  const auto check = [&](const char* what) {
    EXPECT_LT(max_rel_error(product(x, W).to(torch::kDouble), reference(x, W)), 1e-4) << what;
  };
  check("first product");
  {
    torch::NoGradGuard no_grad;
    W.mul_(2);  // the version counter
  }
  check("after an in-place change");
  W.data().add_(1);  // not seen by the version counter: by the bytes, after a recheck
  d2l::detail::recheck_packed_weights();
  check("after a change through .data() and a recheck");
  W.set_data(torch::randn({512, 256}));  // another data pointer
  check("after set_data");
  W = torch::randn({300, 256});  // another tensor, another shape
  check("another weight");
}

TEST(PackedWeights, ACachesProjectionsFollowEditsThroughData) {
  // project_memory without autograd projects 64 rows or more by a packed
  // W_k and W_v (multi_head_attention_cache.cpp), comparing their bytes at
  // each call: an edit through `.data()` between two caches is seen.
  torch::manual_seed(15);
  d2l::MultiHeadAttention m(d2l::MultiHeadAttentionOptions(256, 256, 256, 256, 4).bias(true));
  m->eval();
  torch::NoGradGuard no_grad;
  const auto keys = torch::randn({2, 40, 256});
  const auto values = torch::randn({2, 40, 256});
  const auto check = [&](const char* what) {
    const auto cache = m->project_memory(keys, values);
    const auto expected = reference(keys.reshape({80, 256}), m->W_k->weight, m->W_k->bias);
    EXPECT_LT(max_rel_error(cache.keys().reshape({80, 256}), expected), 1e-5) << what;
  };
  check("first cache");
  EXPECT_GT(d2l::detail::packed_weights_held(), 0);
  m->W_k->weight.data().mul_(-1);
  check("after an edit through .data()");
}

TEST(PackedWeights, AreDroppedWithTheirWeights) {
  d2l::detail::release_packed_weights();
  const auto x = torch::randn({8, 256});
  {
    const auto W = torch::randn({512, 256});
    product(x, W);
    EXPECT_EQ(d2l::detail::packed_weights_held(), 1);
  }
  const auto other = torch::randn({512, 256});
  product(x, other);  // packing drops the copies of weights that are gone
  EXPECT_EQ(d2l::detail::packed_weights_held(), 1);
  // Not packed: inference tensors, few rows by a large weight.
  {
    c10::InferenceMode inference;
    product(x, torch::randn({512, 256}));
  }
  const auto few = torch::randn({7, 256});
  product(few, torch::randn({512, 256}));
  EXPECT_EQ(d2l::detail::packed_weights_held(), 1);
  // A small weight is packed for any rows.
  const auto small = torch::randn({200, 256});
  product(few, small);
  EXPECT_EQ(d2l::detail::packed_weights_held(), 2);
  d2l::detail::release_packed_weights();
  EXPECT_EQ(d2l::detail::packed_weights_held(), 0);
}

}  // namespace packed_linear_tests
