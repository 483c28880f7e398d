// d2l::nn::functional::scaled_dot_product_attention beside LibTorch's own
// at::scaled_dot_product_attention on the same inputs and arguments, with
// grouped-query heads (make bench-gqa; benchmarks/gqa_table.py reads the
// JSON). Names: `<impl>_<dtype>_<pass>/<shape>/threads:<N>`, impl `ours` or
// `torch`, dtype `f32` or `bf16`, pass `fwd` or `fwdbwd`; shapes
// `gqa<ratio>_b<B>_n<n>[_causal]`: Hq = 32 query heads over 32 / ratio key
// and value heads, L = S = n, E = Ev = 128, no mask or is_causal.
//
//   bench_sdpa_gqa [--threads 1,2] [--shapes gqa4_b1_n512,...] [Google Benchmark flags]

#include <benchmark/benchmark.h>
#include <d2l/attention.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include "bench_cli.h"

#include <functional>
#include <string>
#include <vector>

#if D2L_TORCH_VERSION_AT_LEAST(2, 5)
namespace {

struct GqaShape {
  std::string name;
  int64_t ratio, B, n;
  bool causal;
};

constexpr int64_t kHeads = 32, kFeatures = 128;

std::vector<GqaShape> all_shapes() {
  std::vector<GqaShape> shapes;
  for (const int64_t ratio : {4, 8}) {
    for (const auto& [B, n] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 512}, {4, 512}, {8, 512}, {1, 2048}, {1, 8192}}) {
      for (const bool causal : {false, true}) {
        shapes.push_back({fmt::format("gqa{}_b{}_n{}{}", ratio, B, n, causal ? "_causal" : ""),
                          ratio, B, n, causal});
      }
    }
  }
  return shapes;
}

struct Inputs {
  torch::Tensor q, k, v, upstream;
};

Inputs make_inputs(const GqaShape& s, torch::Dtype dtype) {
  torch::manual_seed(0);
  const int64_t hkv = kHeads / s.ratio;
  return {torch::randn({s.B, kHeads, s.n, kFeatures}).to(dtype),
          torch::randn({s.B, hkv, s.n, kFeatures}).to(dtype),
          torch::randn({s.B, hkv, s.n, kFeatures}).to(dtype),
          torch::randn({s.B, kHeads, s.n, kFeatures}).to(dtype)};
}

torch::Tensor ours(const GqaShape& s, const torch::Tensor& q, const torch::Tensor& k,
                   const torch::Tensor& v) {
  return d2l::nn::functional::scaled_dot_product_attention(
      q, k, v,
      d2l::nn::functional::ScaledDotProductAttentionFuncOptions().enable_gqa(true).is_causal(
          s.causal));
}

torch::Tensor theirs(const GqaShape& s, const torch::Tensor& q, const torch::Tensor& k,
                     const torch::Tensor& v) {
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, s.causal, std::nullopt,
                                          /*enable_gqa=*/true);
}

using Impl = torch::Tensor (*)(const GqaShape&, const torch::Tensor&, const torch::Tensor&,
                               const torch::Tensor&);

// Q Kᵀ and P V over the pairs that take part (half of them, about, when
// causal): 4 · B · Hq · pairs · E multiply-adds' flops; 3.5 times that
// forward and backward.
double useful_flop(const GqaShape& s, bool backward) {
  const double pairs = s.causal ? s.n * (s.n + 1) / 2.0 : static_cast<double>(s.n) * s.n;
  return 4.0 * s.B * kHeads * pairs * kFeatures * (backward ? 3.5 : 1.0);
}

void register_case(const std::string& name, const GqaShape& shape, int threads, Impl impl,
                   torch::Dtype dtype, bool backward) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [=](benchmark::State& state) {
                                 d2l::set_num_threads(threads);
                                 const auto in = make_inputs(shape, dtype);
                                 std::function<void()> body;
                                 if (backward) {
                                   auto q = in.q.clone().requires_grad_(),
                                        k = in.k.clone().requires_grad_(),
                                        v = in.v.clone().requires_grad_();
                                   body = [=]() mutable {
                                     for (auto* t : {&q, &k, &v}) t->mutable_grad().reset();
                                     impl(shape, q, k, v).backward(in.upstream);
                                   };
                                 } else {
                                   body = [=] {
                                     torch::NoGradGuard no_grad;
                                     benchmark::DoNotOptimize(impl(shape, in.q, in.k, in.v));
                                   };
                                 }
                                 body();
                                 for (auto _ : state) body();
                                 state.counters["threads"] = threads;
                                 state.counters["useful_flop"] = useful_flop(shape, backward);
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  const auto cli = d2l::bench::parse_command_line(argc, argv, "--shapes");
  for (const auto& shape : all_shapes()) {
    if (!cli.wants(shape.name)) continue;
    for (const int t : cli.threads) {
      for (const auto& [dtype, dname] :
           {std::pair{torch::kFloat, "f32"}, std::pair{torch::kBFloat16, "bf16"}}) {
        for (const bool backward : {false, true}) {
          for (const auto& [impl, iname] :
               {std::pair<Impl, const char*>{ours, "ours"}, {theirs, "torch"}}) {
            register_case(fmt::format("{}_{}_{}/{}/threads:{}", iname, dname,
                                      backward ? "fwdbwd" : "fwd", shape.name, t),
                          shape, t, impl, dtype, backward);
          }
        }
      }
    }
  }
  return d2l::bench::run_registered(cli);
}
#else
#include <cstdio>
int main() {
  std::fprintf(stderr, "bench_sdpa_gqa: LibTorch's SDPA has enable_gqa from 2.5; this is %s\n",
               TORCH_VERSION);
  return 1;
}
#endif
