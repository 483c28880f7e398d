// Sliding windows and packed sequences (make bench-bands;
// benchmarks/bands_table.py reads the JSON). Names:
// `<impl>_<dtype>_<pass>/<case>/threads:<N>`, impl `ours` or `torch`
// (at::scaled_dot_product_attention with the same attention as a boolean
// mask: it has no window and no packed form), dtype `f32` or `bf16`, pass
// `fwd` or `fwdbwd`. H 8 heads, E = Ev = 128. Cases:
//   window512_n8192  one sequence of 8192, is_causal, window_left 511: each
//                    query sees at most 512 keys
//   blocks16_n512    16 sequences of 512, no mask: as many (query, key)
//                    pairs; the window's cost if it is linear in n
//   packed16         16 causal sequences of lengths 64 to 1024 (8,704
//                    tokens), packed (scaled_dot_product_attention_varlen)
//   separate16       the same sequences, each its own call (no padding)
//   padded16         the same, padded to 1024 with the keys' lengths as a
//                    mask (is_causal joined to it)
//
//   bench_sdpa_bands [--threads 1,2] [--cases window512_n8192,...] [Google Benchmark flags]

#include <benchmark/benchmark.h>
#include <d2l/attention.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include "bench_cli.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace F = d2l::nn::functional;
constexpr int64_t kHeads = 8, kFeatures = 128, kWindow = 512;

// 16 lengths from 64 to 1024, a fixed draw: 8,704 tokens.
const std::vector<int64_t> kLengths = {64,  1024, 320, 832, 128, 960, 448, 576,
                                       192, 704,  256, 896, 384, 640, 512, 768};

// LibTorch's own SDPA, where it has one.
torch::Tensor libtorch_sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& keep) {
#if D2L_HAS_SDPA
  return at::scaled_dot_product_attention(
      q, k, v, keep.defined() ? std::optional<torch::Tensor>(keep) : std::nullopt);
#else
  TORCH_CHECK(false, "LibTorch ", TORCH_VERSION, " has no scaled_dot_product_attention");
#endif
}

struct Inputs {
  std::vector<torch::Tensor> qkv;  // what the call differentiates
  torch::Tensor upstream;
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> call;
  double pairs = 0;  // (query, key) pairs that take part, per head
};

torch::Tensor randn(std::vector<int64_t> sizes, torch::Dtype dtype) {
  return torch::randn(sizes).to(dtype);
}

Inputs make(const std::string& name, bool torch_impl, torch::Dtype dtype) {
  torch::manual_seed(0);
  Inputs in;
  if (name == "window512_n8192" || name == "blocks16_n512") {
    const bool window = name == "window512_n8192";
    const int64_t B = window ? 1 : 16, n = window ? 8192 : 512;
    for (int i = 0; i < 3; ++i) in.qkv.push_back(randn({B, kHeads, n, kFeatures}, dtype));
    in.upstream = randn({B, kHeads, n, kFeatures}, dtype);
    in.pairs = window ? kWindow * (n - kWindow) + kWindow * (kWindow + 1) / 2.0
                      : static_cast<double>(B) * n * n;
    if (!window) {
      in.call = [torch_impl](const std::vector<torch::Tensor>& x) {
        return torch_impl ? libtorch_sdpa(x[0], x[1], x[2], torch::Tensor())
                          : F::scaled_dot_product_attention(x[0], x[1], x[2]);
      };
    } else if (torch_impl) {
      const auto i = torch::arange(n).unsqueeze(1), j = torch::arange(n).unsqueeze(0);
      const auto keep = (j <= i).logical_and(j > i - kWindow);
      in.call = [keep](const std::vector<torch::Tensor>& x) {
        return libtorch_sdpa(x[0], x[1], x[2], keep);
      };
    } else {
      in.call = [](const std::vector<torch::Tensor>& x) {
        return F::scaled_dot_product_attention(
            x[0], x[1], x[2],
            F::ScaledDotProductAttentionFuncOptions().is_causal(true).window_left(kWindow - 1));
      };
    }
    return in;
  }
  const auto& lens = kLengths;
  int64_t total = 0;
  for (const auto L : lens) total += L;
  const int64_t longest = 1024, B = lens.size();
  for (const auto L : lens) in.pairs += L * (L + 1) / 2.0;
  if (name == "packed16") {
    for (int i = 0; i < 3; ++i) in.qkv.push_back(randn({total, kHeads, kFeatures}, dtype));
    in.upstream = randn({total, kHeads, kFeatures}, dtype);
    std::vector<int64_t> cu = {0};
    for (const auto L : lens) cu.push_back(cu.back() + L);
    const auto offsets = torch::tensor(cu, torch::kLong);
    in.call = [offsets](const std::vector<torch::Tensor>& x) {
      return F::scaled_dot_product_attention_varlen(
          x[0], x[1], x[2], offsets, offsets,
          F::ScaledDotProductAttentionFuncOptions().is_causal(true));
    };
    return in;
  }
  if (name == "separate16") {
    // Each sequence its own call, (1, H, L, E) views of the packed rows.
    for (int i = 0; i < 3; ++i) in.qkv.push_back(randn({total, kHeads, kFeatures}, dtype));
    in.upstream = randn({total, kHeads, kFeatures}, dtype);
    in.call = [lens](const std::vector<torch::Tensor>& x) {
      std::vector<torch::Tensor> outs;
      int64_t start = 0;
      for (const auto L : lens) {
        const auto part = [&](const torch::Tensor& t) {
          return t.narrow(0, start, L).transpose(0, 1).unsqueeze(0);
        };
        outs.push_back(F::scaled_dot_product_attention(
                           part(x[0]), part(x[1]), part(x[2]),
                           F::ScaledDotProductAttentionFuncOptions().is_causal(true))
                           .squeeze(0)
                           .transpose(0, 1));
        start += L;
      }
      return torch::cat(outs, 0);
    };
    return in;
  }
  // padded16: the keys' lengths and the causal mask as one boolean mask,
  // a prefix in every row (the kernels take it as lengths).
  for (int i = 0; i < 3; ++i) in.qkv.push_back(randn({B, kHeads, longest, kFeatures}, dtype));
  in.upstream = randn({B, kHeads, longest, kFeatures}, dtype);
  const auto len = torch::tensor(lens, torch::kLong).view({B, 1, 1, 1});
  const auto i = torch::arange(longest).view({1, 1, longest, 1});
  const auto j = torch::arange(longest).view({1, 1, 1, longest});
  const auto keep = (j < len).logical_and(j <= i);
  in.call = [keep, torch_impl](const std::vector<torch::Tensor>& x) {
    if (torch_impl) return libtorch_sdpa(x[0], x[1], x[2], keep);
    return F::scaled_dot_product_attention(
        x[0], x[1], x[2], F::ScaledDotProductAttentionFuncOptions().attn_mask(keep));
  };
  return in;
}

void register_case(const std::string& bench, const std::string& name, bool torch_impl, int threads,
                   torch::Dtype dtype, bool backward) {
  benchmark::RegisterBenchmark(bench.c_str(),
                               [=](benchmark::State& state) {
                                 d2l::set_num_threads(threads);
                                 const auto in = make(name, torch_impl, dtype);
                                 std::function<void()> body;
                                 if (backward) {
                                   std::vector<torch::Tensor> leaves;
                                   for (const auto& t : in.qkv) {
                                     leaves.push_back(t.clone().requires_grad_());
                                   }
                                   body = [=]() mutable {
                                     for (auto& t : leaves) t.mutable_grad().reset();
                                     in.call(leaves).backward(in.upstream);
                                   };
                                 } else {
                                   body = [=] {
                                     torch::NoGradGuard no_grad;
                                     benchmark::DoNotOptimize(in.call(in.qkv));
                                   };
                                 }
                                 body();
                                 for (auto _ : state) body();
                                 state.counters["threads"] = threads;
                                 // Q Kᵀ and P V: 4 flops per pair and feature; 3.5x with the
                                 // backward.
                                 state.counters["useful_flop"] =
                                     4.0 * kHeads * in.pairs * kFeatures * (backward ? 3.5 : 1.0);
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  const auto cli = d2l::bench::parse_command_line(argc, argv, "--cases");
  for (const std::string name :
       {"window512_n8192", "blocks16_n512", "packed16", "separate16", "padded16"}) {
    if (!cli.wants(name)) continue;
    for (const int t : cli.threads) {
      for (const auto& [dtype, dname] :
           {std::pair{torch::kFloat, "f32"}, std::pair{torch::kBFloat16, "bf16"}}) {
        for (const bool backward : {false, true}) {
          for (const bool torch_impl : {false, true}) {
            // LibTorch's SDPA: only where it has one, and not the window's
            // backward (every one of the 8192² pairs, minutes a run).
            if (torch_impl && (!D2L_HAS_SDPA || name == "separate16" || name == "packed16" ||
                               (name == "window512_n8192" && backward))) {
              continue;
            }
            register_case(fmt::format("{}_{}_{}/{}/threads:{}", torch_impl ? "torch" : "ours",
                                      dname, backward ? "fwdbwd" : "fwd", name, t),
                          name, torch_impl, t, dtype, backward);
          }
        }
      }
    }
  }
  return d2l::bench::run_registered(cli);
}
