#pragma once

// Shared by the flash kernel's test files (test_flash_attention*.cpp): its
// fixture, the calls of each path and the comparison with the composite
// oracle, and the sizes and lengths the tests sweep.

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <d2l/dot_product_attention.h>

#include <algorithm>
#include <string>
#include <vector>

#include "checks.h"
#include "fused_helpers.h"
#include "test_utils.h"

namespace d2l::testing {

/// The Fused fixture (one run per instruction set) under the flash suite's name.
class Flash : public Fused {};

inline torch::Tensor attend(const std::vector<torch::Tensor>& qkv, const torch::Tensor& lens,
                            AttentionBackend path) {
  return std::get<0>(
      d2l::functional::dot_product_attention(qkv[0], qkv[1], qkv[2],
                                             d2l::functional::DotProductAttentionFuncOptions()
                                                 .valid_lens(lens)
                                                 .dropout(0.0)
                                                 .training(false)
                                                 .backend(path)
                                                 .need_weights(false)));
}

// Output, weights and the q, k, v gradients of sum(out ∘ G) + sum(weights ∘
// H) (H only when `weights_grad`), on `path` with weights asked for.
inline std::vector<torch::Tensor> with_weights(const std::vector<torch::Tensor>& qkv,
                                               const torch::Tensor& lens, AttentionBackend path,
                                               bool weights_grad, const torch::Tensor& G,
                                               const torch::Tensor& H) {
  std::vector<torch::Tensor> in;
  for (const auto& t : qkv) in.push_back(t.detach().clone().requires_grad_());
  auto [out, weights] =
      d2l::functional::dot_product_attention(in[0], in[1], in[2],
                                             d2l::functional::DotProductAttentionFuncOptions()
                                                 .valid_lens(lens)
                                                 .dropout(0.0)
                                                 .training(false)
                                                 .backend(path)
                                                 .need_weights(true));
  auto loss = (out * G.to(out.scalar_type())).sum();
  if (weights_grad) loss = loss + (weights * H.to(weights.scalar_type())).sum();
  loss.backward();
  return {out.detach(), weights.detach(), in[0].grad(), in[1].grad(), in[2].grad()};
}

// f() on one intra-op thread. The composite oracle runs so: its ATen loops are
// then inline, and under ThreadSanitizer (the tsan preset runs the tests that
// set two threads) only the fused kernels' own threads run at once, not
// libgomp's, whose barriers TSan cannot see.
template <typename F>
auto on_one_thread(const F& f) {
  struct Restore {
    int threads;
    ~Restore() { at::set_num_threads(threads); }
  } restore{at::get_num_threads()};
  at::set_num_threads(1);
  return f();
}

// Value and q, k, v gradients of the flash path against the composite path.
// In float and double both are compared in that dtype. In float16 and
// bfloat16 the composite path rounds its scores and weights to the dtype
// while the kernel accumulates in float, so both are compared with the
// composite path in double: the kernel must be within the dtype's tolerance
// of it, and no further from it than the composite path in that dtype is.
// With `weights` (0: none asked, 1: asked, 2: asked and given a gradient),
// the weights are compared too, as output 1.
inline void check_against_composite(const std::vector<torch::Tensor>& qkv,
                                    const torch::Tensor& lens, const DtypeTolerance& tol,
                                    const std::string& what, int weights = 0) {
  const auto upstream =
      torch::randn({qkv[0].size(0), qkv[0].size(1), qkv[2].size(2)}, torch::kDouble);
  const auto upstream_weights =
      torch::randn({qkv[0].size(0), qkv[0].size(1), qkv[1].size(1)}, torch::kDouble);
  auto run = [&](AttentionBackend path, const std::vector<torch::Tensor>& in) {
    if (weights > 0) return with_weights(in, lens, path, weights == 2, upstream, upstream_weights);
    return value_and_grads([&](const auto& x) { return attend(x, lens, path); }, in, upstream);
  };
  const auto flash = run(AttentionBackend::kFused, qkv);
  const auto composite = on_one_thread([&] { return run(AttentionBackend::kComposite, qkv); });
  const bool reduced = tol.dtype == torch::kHalf || tol.dtype == torch::kBFloat16;
  if (!reduced) {
    // Sums over hundreds of keys, in another order than bmm's: in float the
    // two paths differ by a few times the softmax's 2e-6.
    const DtypeTolerance sums{tol.dtype,
                              std::max(tol.forward, tol.dtype == torch::kFloat ? 1e-5 : 0.0),
                              std::max(tol.backward, tol.dtype == torch::kFloat ? 2e-5 : 0.0)};
    return expect_close(flash, composite, sums, what);
  }
  std::vector<torch::Tensor> qkv64;
  for (const auto& t : qkv) qkv64.push_back(t.to(torch::kDouble));
  const auto exact = on_one_thread([&] { return run(AttentionBackend::kComposite, qkv64); });
  for (size_t i = 0; i < flash.size(); ++i) {
    EXPECT_EQ(flash[i].scalar_type(), tol.dtype) << what << " output " << i;
    const double error = max_rel_error(flash[i], exact[i]);
    const bool forward = i == 0 || (weights > 0 && i == 1);
    EXPECT_LT(error, forward ? tol.forward : tol.backward) << what << " output " << i;
    // Two roundings of the dtype (2⁻⁸ for bfloat16, 2⁻¹¹ for float16) of slack.
    const double rounding = tol.dtype == torch::kBFloat16 ? 0x1p-7 : 0x1p-10;
    EXPECT_LE(error, max_rel_error(composite[i], exact[i]) * 1.25 + rounding)
        << what << " output " << i;
  }
}

inline std::vector<DtypeTolerance> runnable_dtypes() {
  std::vector<DtypeTolerance> dtypes;
  for (const auto& tol : kFastPathDtypes) {
    if (tol.dtype != torch::kHalf || d2l::detail::cpu_float16_matmul_available()) {
      dtypes.push_back(tol);
    }
  }
  return dtypes;
}

struct Sizes {
  int64_t B, n, m, d, dv;
};

// Queries (doubled, for sharper rows), keys and values in double.
inline std::vector<torch::Tensor> random_qkv(const Sizes& c) {
  return {torch::randn({c.B, c.n, c.d}, torch::kDouble) * 2,
          torch::randn({c.B, c.m, c.d}, torch::kDouble),
          torch::randn({c.B, c.m, c.dv}, torch::kDouble)};
}

// No lengths, (B) and (B, n), with zeros and lengths above m.
inline std::vector<torch::Tensor> every_kind_of_lengths(const Sizes& c) {
  return {torch::Tensor(), torch::randint(0, c.m + 3, {c.B}),
          torch::randint(0, c.m + 3, {c.B, c.n})};
}

inline std::vector<torch::Tensor> in_dtype(const std::vector<torch::Tensor>& qkv,
                                           torch::ScalarType dtype) {
  return {qkv[0].to(dtype), qkv[1].to(dtype), qkv[2].to(dtype)};
}

// The intra-op thread count and torch's deterministic-algorithms flag for a
// scope, both restored after it.
class ThreadsAndDeterminism {
 public:
  ThreadsAndDeterminism(int threads, bool deterministic)
      : threads_(at::get_num_threads()),
        deterministic_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::set_num_threads(threads);
    at::globalContext().setDeterministicAlgorithms(deterministic, false);
  }
  ~ThreadsAndDeterminism() {
    at::set_num_threads(threads_);
    at::globalContext().setDeterministicAlgorithms(deterministic_, warn_only_);
  }
  ThreadsAndDeterminism(const ThreadsAndDeterminism&) = delete;
  ThreadsAndDeterminism& operator=(const ThreadsAndDeterminism&) = delete;

 private:
  int threads_;
  bool deterministic_, warn_only_;
};

}  // namespace d2l::testing
