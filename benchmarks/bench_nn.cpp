// Google Benchmark timings of the drop-ins of <d2l/nn.h> beside LibTorch's own
// modules, in one process, for `make bench-nn` (docs/performance.md, "The
// torch::nn drop-ins"). Every case is forward and backward (into the inputs
// and every parameter) at 1 thread; the inputs are LibTorch's (L, N, E).
//
// - nn/mha_<shape>/default/<impl>: self-attention, the default call (no
//   mask, weights returned and averaged over the heads).
// - nn/mha_<shape>/causal/<impl>: causal self-attention without weights
//   (ours: is_causal; LibTorch's: the same mask as a -inf float attn_mask).
//   Shapes: small (L 10, N 64, E 32, 4 heads) and large (L 128, N 32, E 512,
//   8 heads).
// - nn/mha_large/floor/projections: the four projections alone (forward and
//   backward of three Linears of one input and the output Linear): the GEMMs
//   that both implementations run, a floor for either.
// - nn/encoder6/default/<impl>: 6 TransformerEncoderLayers (d_model 512,
//   nhead 8, dim_feedforward 2048, dropout 0.1, training) on (L 128, N 8).
//
// <impl> is `d2l` (d2l::nn) or `torch_nn` (torch::nn). Names:
// nn/<case>/<call>/<impl>/fwd_bwd/threads:1.

#include <benchmark/benchmark.h>
#include <d2l/backend.h>
#include <d2l/nn.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace {

struct MhaShape {
  const char* name;
  int64_t L, N, E, heads;
};

// Times forward and backward of sum(out) into `x` and `params`, gradients
// reset every iteration.
void register_case(const std::string& name,
                   std::function<torch::Tensor(const torch::Tensor&)> forward, torch::Tensor x,
                   std::vector<torch::Tensor> params) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [=](benchmark::State& state) mutable {
                                 d2l::set_num_threads(1);
                                 x = x.detach().requires_grad_();
                                 const auto once = [&] {
                                   x.mutable_grad().reset();
                                   for (auto& p : params) p.mutable_grad().reset();
                                   auto out = forward(x);
                                   out.backward(torch::ones_like(out));
                                   benchmark::DoNotOptimize(out);
                                 };
                                 once();  // warm-up: allocator, lazy initialisation
                                 for (auto _ : state) once();
                                 state.counters["threads"] = 1;
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void mha_cases(const MhaShape& s) {
  torch::manual_seed(1);
  const auto x = torch::randn({s.L, s.N, s.E});
  const auto causal = torch::full({s.L, s.L}, -INFINITY).triu(1);
  d2l::nn::MultiheadAttention ours(s.E, s.heads);
  torch::nn::MultiheadAttention theirs(s.E, s.heads);
  {
    torch::NoGradGuard no_grad;
    auto mine = ours->named_parameters();
    for (const auto& p : theirs->named_parameters()) mine[p.key()].copy_(p.value());
  }
  const auto prefix = fmt::format("nn/mha_{}", s.name);
  register_case(
      prefix + "/default/d2l/fwd_bwd/threads:1",
      [=](const torch::Tensor& t) mutable {
        auto [out, w] = ours(t, t, t);
        benchmark::DoNotOptimize(w);
        return out;
      },
      x, ours->parameters());
  register_case(
      prefix + "/default/torch_nn/fwd_bwd/threads:1",
      [=](const torch::Tensor& t) mutable {
        auto [out, w] = theirs(t, t, t);
        benchmark::DoNotOptimize(w);
        return out;
      },
      x, theirs->parameters());
  register_case(
      prefix + "/causal/d2l/fwd_bwd/threads:1",
      [=](const torch::Tensor& t) mutable {
        return std::get<0>(ours(t, t, t, torch::Tensor(), /*need_weights=*/false, torch::Tensor(),
                                true, /*is_causal=*/true));
      },
      x, ours->parameters());
  register_case(
      prefix + "/causal/torch_nn/fwd_bwd/threads:1",
      [=](const torch::Tensor& t) mutable {
        return std::get<0>(theirs(t, t, t, torch::Tensor(), /*need_weights=*/false, causal));
      },
      x, theirs->parameters());
}

// The four projections of self-attention alone (three from one input, the
// output projection of their sum): what any implementation spends in GEMMs.
void projection_floor(const MhaShape& s) {
  torch::manual_seed(3);
  const auto x = torch::randn({s.N, s.L, s.E});
  std::vector<torch::Tensor> W;
  for (int i = 0; i < 4; ++i) {
    W.push_back((torch::randn({s.E, s.E}) / std::sqrt(static_cast<double>(s.E))).requires_grad_());
  }
  register_case(
      fmt::format("nn/mha_{}/floor/projections/fwd_bwd/threads:1", s.name),
      [W](const torch::Tensor& t) {
        namespace F = torch::nn::functional;
        return F::linear(F::linear(t, W[0]) + F::linear(t, W[1]) + F::linear(t, W[2]), W[3]);
      },
      x, W);
}

void encoder_cases() {
  constexpr int64_t layers = 6, d_model = 512, nhead = 8, L = 128, N = 8;
  torch::manual_seed(2);
  const auto x = torch::randn({L, N, d_model});
  torch::nn::Sequential theirs, ours;
  for (int64_t i = 0; i < layers; ++i) {
    torch::nn::TransformerEncoderLayer ref(
        torch::nn::TransformerEncoderLayerOptions(d_model, nhead));
    d2l::nn::TransformerEncoderLayer mine(d2l::nn::TransformerEncoderLayerOptions(d_model, nhead));
    torch::NoGradGuard no_grad;
    auto params = mine->named_parameters();
    for (const auto& p : ref->named_parameters()) params[p.key()].copy_(p.value());
    theirs->push_back(ref);
    ours->push_back(mine);
  }
  theirs->train();
  ours->train();
  register_case(
      "nn/encoder6/default/d2l/fwd_bwd/threads:1",
      [=](const torch::Tensor& t) mutable { return ours->forward(t); }, x, ours->parameters());
  register_case(
      "nn/encoder6/default/torch_nn/fwd_bwd/threads:1",
      [=](const torch::Tensor& t) mutable { return theirs->forward(t); }, x, theirs->parameters());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("d2l_cpu_isa", d2l::to_string(d2l::cpu_isa()));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  mha_cases({"small", 10, 64, 32, 4});
  mha_cases({"large", 128, 32, 512, 8});
  projection_floor({"large", 128, 32, 512, 8});
  encoder_cases();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
