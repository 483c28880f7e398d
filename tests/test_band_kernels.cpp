// The flash kernels on bands of keys (Note [Bands of keys]): lengths of
// shape (X, P, 2) give each row its own first and last key. Sliding windows,
// windows with keys to the right, packed sequences (block-diagonal bands),
// random bands with empty rows, and bands shared by every batch entry with
// a period, through the float, double and bfloat16 kernels (rows, blocks and
// the key split), forward and backward, with and without weights, against
// an independent double-precision reference under every instruction set.

#include <d2l/backend.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "dot_product_attention_internal.h"
#include "fused_helpers.h"
#include "test_utils.h"

namespace band_tests {

using d2l::testing::normwise_error;

// Row r (of B · n) keeps key j where band r % (X · P) holds it.
torch::Tensor keep_of(const torch::Tensor& bands, int64_t B, int64_t n, int64_t m) {
  const auto flat = bands.reshape({-1, 2});
  const auto pick = torch::arange(B * n, torch::kLong).remainder(flat.size(0));
  const auto rows = flat.index_select(0, pick);
  const auto j = torch::arange(m, torch::kLong).unsqueeze(0);
  return (j >= rows.select(1, 0).unsqueeze(1))
      .logical_and(j < rows.select(1, 1).unsqueeze(1))
      .view({B, n, m});
}

// softmax(scale · Q Kᵀ) V over each row's band in double, zeros for a row
// with no key; returns {out, weights}, differentiable.
std::vector<torch::Tensor> reference(const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, const torch::Tensor& keep,
                                     double scale) {
  const auto scores =
      torch::bmm(q, k.transpose(1, 2)).mul(scale).masked_fill(keep.logical_not(), -1e300);
  const auto dead = keep.any(-1, /*keepdim=*/true).logical_not();
  const auto weights = torch::softmax(scores, -1).masked_fill(keep.logical_not(), 0);
  const auto w = weights.masked_fill(dead, 0);
  return {torch::bmm(w, v), w};
}

struct Case {
  std::string name;
  int64_t B, n, m, d, dv;
  torch::Tensor bands;  // (X, P, 2) int64
};

torch::Tensor band_tensor(const std::vector<std::pair<int64_t, int64_t>>& rows, int64_t X) {
  std::vector<int64_t> flat;
  for (const auto& [first, end] : rows) {
    flat.push_back(first);
    flat.push_back(end);
  }
  const int64_t P = static_cast<int64_t>(rows.size()) / X;
  return torch::tensor(flat, torch::kLong).view({X, P, 2});
}

// Row i sees keys [i - left, i + right], clipped to [0, m); the empty band
// is [0, 0).
std::vector<std::pair<int64_t, int64_t>> window(int64_t n, int64_t m, int64_t left, int64_t right,
                                                int64_t offset = 0) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = i + offset;
    const int64_t first = std::max<int64_t>(0, p - left), end = std::min(m, p + right + 1);
    rows.push_back(first < end ? std::make_pair(first, end)
                               : std::make_pair(int64_t{0}, int64_t{0}));
  }
  return rows;
}

// Sequences of these lengths packed into one entry: causal within each.
std::vector<std::pair<int64_t, int64_t>> packed(const std::vector<int64_t>& lengths, bool causal) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  int64_t start = 0;
  for (const int64_t L : lengths) {
    for (int64_t i = 0; i < L; ++i) rows.emplace_back(start, causal ? start + i + 1 : start + L);
    start += L;
  }
  return rows;
}

std::vector<std::pair<int64_t, int64_t>> random_bands(int64_t rows, int64_t m, uint64_t seed) {
  std::vector<std::pair<int64_t, int64_t>> out;
  uint64_t x = seed;
  const auto next = [&]() {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>(x >> 33);
  };
  for (int64_t r = 0; r < rows; ++r) {
    if (next() % 7 == 0) {
      out.emplace_back(0, 0);
      continue;
    }
    const int64_t first = next() % m;
    // Now and then an end past the keys (clipped to m by the kernels).
    const int64_t end = next() % 9 == 0 ? m + 3 : first + 1 + next() % (m - first);
    out.emplace_back(first, end);
  }
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"window_blocks", 2, 300, 300, 64, 64, band_tensor(window(300, 300, 40, 0), 1)});
  c.push_back({"window_right", 1, 200, 260, 40, 48, band_tensor(window(200, 260, 70, 9, 60), 1)});
  c.push_back({"window_rows", 3, 3, 500, 64, 64, band_tensor(window(3, 500, 100, 0, 400), 1)});
  c.push_back({"window_few_rows", 2, 9, 700, 64, 32, band_tensor(window(9, 700, 300, 2, 500), 1)});
  c.push_back({"window_split", 1, 2, 3000, 64, 64, band_tensor(window(2, 3000, 1500, 0, 2990), 1)});
  c.push_back({"window_long", 1, 1100, 1100, 64, 64, band_tensor(window(1100, 1100, 256, 0), 1)});
  c.push_back(
      {"packed_causal", 2, 230, 230, 64, 64, band_tensor(packed({37, 1, 100, 30, 62}, true), 1)});
  c.push_back(
      {"packed_full", 1, 230, 230, 48, 64, band_tensor(packed({37, 1, 100, 30, 62}, false), 1)});
  c.push_back({"random", 2, 75, 90, 64, 64,
               torch::cat({band_tensor(random_bands(75, 90, 1), 1),
                           band_tensor(random_bands(75, 90, 2), 1)})});
  c.push_back({"random_rows", 4, 4, 130, 32, 32, band_tensor(random_bands(16, 130, 3), 4)});
  // One band per position, shared by three entries of two periods each (the
  // grouped-heads fold).
  c.push_back({"shared_period", 3, 120, 150, 64, 64, band_tensor(window(60, 150, 30, 5, 40), 1)});
  return c;
}

class Bands : public d2l::testing::Fused {};

// On one thread and on two: with two, rows of few queries split their keys
// over the threads (window_split, window_rows).
TEST_P(Bands, MatchTheReferenceForwardAndBackward) {
  const int saved = at::get_num_threads();
  for (const int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (const auto& c : cases()) {
      for (const auto dtype : {torch::kDouble, torch::kFloat, torch::kBFloat16}) {
        for (const bool need_weights : {false, true}) {
          if (need_weights && dtype == torch::kBFloat16) continue;
          SCOPED_TRACE(fmt::format("{} {} weights {} threads {}", c.name, c10::toString(dtype),
                                   need_weights, threads));
          torch::manual_seed(7);
          const auto opts = torch::TensorOptions().dtype(dtype);
          const auto q = torch::randn({c.B, c.n, c.d}).to(opts);
          const auto k = torch::randn({c.B, c.m, c.d}).to(opts);
          const auto v = torch::randn({c.B, c.m, c.dv}).to(opts);
          const auto G = torch::randn({c.B, c.n, c.dv}).to(opts);
          const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
          const auto keep = keep_of(c.bands, c.B, c.n, c.m);
          std::vector<torch::Tensor> exact_in;
          for (const auto& t : {q, k, v}) {
            exact_in.push_back(t.to(torch::kDouble).detach().requires_grad_());
          }
          const auto exact = reference(exact_in[0], exact_in[1], exact_in[2], keep, scale);
          (exact[0] * G.to(torch::kDouble)).sum().backward();

          std::vector<torch::Tensor> in;
          for (const auto& t : {q, k, v}) in.push_back(t.detach().requires_grad_());
          torch::Tensor out, weights;
          if (dtype == torch::kBFloat16 && d2l::cpu_isa() >= d2l::CpuIsa::kAvx512Bf16) {
            out = d2l::detail::flash_attention_bf16(in[0], in[1], in[2], c.bands, scale);
          } else {
            std::tie(out, weights) =
                d2l::detail::flash_attention(in[0], in[1], in[2], c.bands, scale, need_weights);
          }
          (out * G).sum().backward();
          const double tol = dtype == torch::kDouble ? 1e-10 : dtype == torch::kFloat ? 2e-5 : 3e-2;
          EXPECT_LT(normwise_error(out, exact[0].detach()), tol);
          EXPECT_LT(normwise_error(in[0].grad(), exact_in[0].grad()), 2 * tol);
          EXPECT_LT(normwise_error(in[1].grad(), exact_in[1].grad()), 2 * tol);
          EXPECT_LT(normwise_error(in[2].grad(), exact_in[2].grad()), 2 * tol);
          // Keys outside every band get exact zeros.
          const auto unseen = keep.any(1).logical_not().unsqueeze(-1);
          EXPECT_TRUE(in[1].grad().masked_select(unseen).eq(0).all().item<bool>());
          EXPECT_TRUE(in[2].grad().masked_select(unseen).eq(0).all().item<bool>());
          if (need_weights) {
            EXPECT_LT(normwise_error(weights, exact[1].detach()), tol);
            EXPECT_TRUE(weights.masked_select(keep.logical_not()).eq(0).all().item<bool>());
          }
        }
      }
    }
  }
  at::set_num_threads(saved);
}

// The same bands on two threads and on one give the same numbers.
TEST_P(Bands, ThreadsSplitTheWorkNotTheAnswer) {
  const auto c = cases()[6];  // packed_causal
  torch::manual_seed(3);
  const auto q = torch::randn({c.B, c.n, c.d}), k = torch::randn({c.B, c.m, c.d}),
             v = torch::randn({c.B, c.m, c.dv});
  const int saved = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = std::get<0>(d2l::detail::flash_attention(q, k, v, c.bands, 0.125, false));
  at::set_num_threads(2);
  const auto two = std::get<0>(d2l::detail::flash_attention(q, k, v, c.bands, 0.125, false));
  at::set_num_threads(saved);
  EXPECT_TRUE(torch::allclose(one, two, 1e-6, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Isa, Bands, ::testing::ValuesIn(d2l::testing::all_isas()),
                         [](const auto& info) { return d2l::to_string(info.param); });

}  // namespace band_tests
