// Google Benchmark timings of the Transformer's attention, each beside its
// peer, for `make bench-transformer`:
//
// - causal/<mask>/<pass>/threads:N: self-attention at n = m = 2048, d = 64,
//   2 heads' worth of batch, no weights: the flash kernel unmasked (`full`),
//   with the causal flag (`causal`) and with the book's dec_valid_lens
//   (`book_lens`), against LibTorch 2.x's SDPA unmasked and with is_causal
//   (`sdpa_full`, `sdpa_causal`).
// - mha/<impl>/<pass>/threads:N: multi-head self-attention at the book's
//   Transformer shapes (batch 64, 10 steps, 32 hidden units, 4 heads) with
//   the causal mask: ours (`d2l`, as the decoder calls it, recording the
//   weights; `d2l_composite`, the book's ops), and LibTorch's
//   torch::nn::MultiheadAttention with the same mask as -inf (`torch_nn`).
//   `mha_bf16/<impl>/...`: the same in bfloat16 (modules and input converted).
// - mha_size/d2l/h:H/n:N/fwd_bwd/threads:1: multi-head self-attention by
//   size (n = m = N, 4 heads of H / 4 features).
// - decode/batch:B/threads:1: greedy decoding with the book's Transformer
//   (32 hidden units, 4 heads, 2 blocks, FFN 64, vocabulary 200, source of
//   10 tokens), evaluation mode, no autograd: init_state, then 10 decoder
//   steps of one token each, feeding back the argmax. The time is per step.
//
// <pass> is `fwd` (no autograd) or `fwd_bwd` (forward, then backward into
// the inputs and parameters). Pick cases with --benchmark_filter.

#include <benchmark/benchmark.h>
#include <d2l/attention.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace F = d2l::functional;
using Run = std::function<torch::Tensor(bool grad)>;

// Times `run`: with `grad`, forward and backward of sum(out * upstream) into
// leaves whose gradients are reset every iteration.
void register_case(const std::string& name, int threads, bool grad,
                   std::function<Run()> make) {
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
    d2l::set_num_threads(threads);
    const Run run = make();
    const auto once = [&] {
      if (!grad) {
        torch::NoGradGuard no_grad;
        benchmark::DoNotOptimize(run(false));
        return;
      }
      benchmark::DoNotOptimize(run(true));
    };
    once();  // warm-up: allocator, thread pool, lazy initialisation
    for (auto _ : state) once();
    state.counters["threads"] = threads;
  })
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

// Leaves that keep their gradients zeroed between iterations.
struct Leaves {
  std::vector<torch::Tensor> tensors;
  explicit Leaves(std::vector<torch::Tensor> ts) {
    for (auto& t : ts) tensors.push_back(t.detach().requires_grad_());
  }
  void reset() {
    for (auto& t : tensors) t.mutable_grad().reset();
  }
};

Run backward_of(std::function<torch::Tensor()> forward, std::shared_ptr<Leaves> leaves,
                std::vector<torch::Tensor> params = {}) {
  return [=](bool grad) mutable {
    if (!grad) return forward();
    leaves->reset();
    for (auto& p : params) p.mutable_grad().reset();
    auto out = forward();
    out.backward(torch::ones_like(out));
    return out;
  };
}

void causal_cases(int threads) {
  constexpr int64_t BH = 2, n = 2048, d = 64;
  const auto inputs = [] {
    torch::manual_seed(0);
    return std::make_shared<Leaves>(std::vector<torch::Tensor>{
        torch::randn({BH, n, d}), torch::randn({BH, n, d}), torch::randn({BH, n, d})});
  };
  const auto ours = [](F::DotProductAttentionFuncOptions options) {
    return [options](const std::vector<torch::Tensor>& t) {
      return std::get<0>(F::dot_product_attention(t[0], t[1], t[2], options));
    };
  };
  const auto base = F::DotProductAttentionFuncOptions().need_weights(false);
  std::vector<std::pair<std::string, std::function<torch::Tensor(const std::vector<torch::Tensor>&)>>>
      cases{{"full", ours(base)},
            {"causal", ours(F::DotProductAttentionFuncOptions(base).is_causal(true))},
            {"book_lens", ours(F::DotProductAttentionFuncOptions(base).valid_lens(
                              torch::arange(1, n + 1).repeat({BH, 1})))}};
#if D2L_HAS_SDPA
  for (const bool causal : {false, true}) {
    cases.emplace_back(causal ? "sdpa_causal" : "sdpa_full",
                       [causal](const std::vector<torch::Tensor>& t) {
                         return at::scaled_dot_product_attention(t[0], t[1], t[2], std::nullopt,
                                                                 0.0, causal);
                       });
  }
#endif
  for (const auto& [mask, f] : cases) {
    for (const bool grad : {false, true}) {
      register_case(fmt::format("causal/{}/{}/threads:{}", mask, grad ? "fwd_bwd" : "fwd",
                                threads),
                    threads, grad, [=] {
                      auto leaves = inputs();
                      return backward_of([leaves, f] { return f(leaves->tensors); }, leaves);
                    });
    }
  }
}

void mha_cases(int threads, torch::Dtype dtype) {
  constexpr int64_t B = 64, n = 10, h = 32, heads = 4;
  const std::string group = dtype == torch::kBFloat16 ? "mha_bf16" : "mha";
  const auto make_input = [dtype] {
    torch::manual_seed(1);
    return std::make_shared<Leaves>(
        std::vector<torch::Tensor>{torch::randn({B, n, h}).to(dtype)});
  };
  const auto dec_valid_lens = torch::arange(1, n + 1).repeat({B, 1});
  std::vector<std::pair<d2l::AttentionBackend, std::string>> backends = {
      {d2l::AttentionBackend::kAuto, "d2l"}, {d2l::AttentionBackend::kComposite, "d2l_composite"}};
  for (const auto& [backend, impl] : backends) {
    for (const bool grad : {false, true}) {
      register_case(fmt::format("{}/{}/{}/threads:{}", group, impl, grad ? "fwd_bwd" : "fwd",
                                threads),
                    threads, grad, [=, backend = backend] {
                      auto x = make_input();
                      d2l::MultiHeadAttention attention(
                          d2l::MultiHeadAttentionOptions(h, h, h, h, heads).backend(backend));
                      attention->to(dtype);
                      attention->train();  // dropout 0, as the decoder in training
                      return backward_of(
                          [=]() mutable {
                            const auto& t = x->tensors[0];
                            return attention->forward(t, t, t, dec_valid_lens);
                          },
                          x, attention->parameters());
                    });
    }
  }
  for (const bool grad : {false, true}) {
    register_case(
        fmt::format("{}/torch_nn/{}/threads:{}", group, grad ? "fwd_bwd" : "fwd", threads),
        threads, grad, [=] {
          torch::manual_seed(1);
          // LibTorch's layout is (L, N, E): the input is made so.
          auto x = std::make_shared<Leaves>(
              std::vector<torch::Tensor>{torch::randn({n, B, h}).to(dtype)});
          torch::nn::MultiheadAttention attention(
              torch::nn::MultiheadAttentionOptions(h, heads).bias(false));
          attention->to(dtype);
          attention->train();
          const auto mask = torch::zeros({n, n}, dtype).masked_fill(
              torch::ones({n, n}, torch::kBool).triu(1), -INFINITY);
          return backward_of(
              [=]() mutable {
                const auto& t = x->tensors[0];
                return std::get<0>(attention->forward(t, t, t, {}, /*need_weights=*/true, mask));
              },
              x, attention->parameters());
        });
  }
}

// Multi-head self-attention of 4 heads by size, batch 16, no mask, weights
// recorded, at 1 thread: where the small-head kernels hand over to the flash
// kernel (detail::small_heads, which says how it was chosen).
void mha_size_cases(int threads) {
  constexpr int64_t B = 16, heads = 4;
  for (const int64_t h : {32, 64, 256}) {
    for (const int64_t n : {8, 16, 24, 32, 40, 48, 64}) {
      register_case(fmt::format("mha_size/d2l/h:{}/n:{}/fwd_bwd/threads:{}", h, n, threads),
                    threads, true, [=] {
                      torch::manual_seed(1);
                      auto x = std::make_shared<Leaves>(
                          std::vector<torch::Tensor>{torch::randn({B, n, h})});
                      d2l::MultiHeadAttention attention(h, h, h, h, heads, 0.0);
                      return backward_of(
                          [=]() mutable {
                            const auto& t = x->tensors[0];
                            return attention->forward(t, t, t, torch::Tensor());
                          },
                          x, attention->parameters());
                    });
    }
  }
}

// A decoding step of the book's Transformer as predict_seq2seq takes it.
void decode_cases(int threads) {
  constexpr int64_t vocab = 200, h = 32, heads = 4, layers = 2, ffn = 64, src_len = 10,
                    steps = 10;
  for (const int64_t B : {1, 64}) {
    benchmark::RegisterBenchmark(
        fmt::format("decode/batch:{}/threads:{}", B, threads).c_str(),
        [=](benchmark::State& state) {
          d2l::set_num_threads(threads);
          torch::manual_seed(3);
          d2l::TransformerEncoder encoder(vocab, h, h, h, h, {h}, h, ffn, heads, layers, 0.1);
          d2l::TransformerDecoder decoder(vocab, h, h, h, h, {h}, h, ffn, heads, layers, 0.1);
          encoder->eval();
          decoder->eval();
          torch::NoGradGuard no_grad;
          const auto src = torch::randint(vocab, {B, src_len});
          const auto src_lens = torch::randint(1, src_len + 1, {B});
          const auto enc = encoder->forward(src, src_lens);
          const auto decode = [&] {
            auto dec_state = decoder->init_state(enc, src_lens);
            auto X = torch::zeros({B, 1}, torch::kLong);
            for (int64_t t = 0; t < steps; ++t) {
              auto [Y, next] = decoder->forward(X, dec_state);
              dec_state = std::move(next);
              X = Y.argmax(2);
            }
            return X;
          };
          decode();  // warm-up
          for (auto _ : state) benchmark::DoNotOptimize(decode());
          state.counters["threads"] = threads;
          state.counters["per_step_ms"] = benchmark::Counter(
              static_cast<double>(steps) * 1e-3,
              benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::AddCustomContext("d2l_cpu_isa", d2l::to_string(d2l::cpu_isa()));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  for (const int threads : {1, 2}) {
    causal_cases(threads);
    mha_cases(threads, torch::kFloat);
    mha_cases(threads, torch::kBFloat16);
    if (threads == 1) {
      mha_size_cases(threads);
      decode_cases(threads);
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
