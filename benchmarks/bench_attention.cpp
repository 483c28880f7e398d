// Google Benchmark timings of the library's fused paths, its composite (book)
// paths and the floors they are judged against, on the shapes of
// benchmarks/book_reference.py. Names: `[composite:]<case>/<shape>/threads:<N>`,
// read by benchmarks/compare.py.
//
//   bench_attention [--threads 1,2] [--shapes toy,d2l,mid,big,sdpa128,...,sdpa4096,limits]
//                   [--no-memory] [--composite-big] [--deterministic] [Google Benchmark flags]
//
// `limits` times what the attention rows are quoted against (sdpa_table.py):
// one core's float32 FMA peak and bfloat16 VDPBF16PS peak (register-only
// loops, as tools' fma_peak.c and benchmarks/compute_peak.c), and LibTorch's
// own 2048² torch::mm in float32 and bfloat16.
//
// --deterministic runs everything with torch's deterministic algorithms on
// (the flash backward then sums dQ in a fixed order, README "Threads").

#include <benchmark/benchmark.h>
#include <d2l/attention.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include <immintrin.h>

#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cpu/additive_attention_kernel.h"
#include "heap_peak.h"

namespace {

using d2l::bench::peak_rss_delta;
using d2l::bench::Shape;

const std::vector<Shape> kShapes = {{"toy", 2, 1, 10, 2, 8},
                                    {"d2l", 64, 10, 10, 32, 32},
                                    {"mid", 32, 128, 128, 64, 64},
                                    {"big", 8, 512, 512, 64, 128}};

// Inputs shared by every case of a shape, drawn as the Python script does:
// float32, standard normal, one random valid length per batch row in [1, m].
struct Inputs {
  torch::Tensor scores, lens, queries, keys, values, upstream_scores, upstream_out;
};

// `sdpa<n>full`: an SDPA shape without masking (every key valid): no
// lengths for us, no mask for SDPA.
bool unmasked(const Shape& s) {
  return s.name.size() > 4 && s.name.substr(s.name.size() - 4) == "full";
}

// The same inputs in bfloat16 (lengths as they are).
Inputs in_bf16(const Inputs& in) {
  const auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  return {bf16(in.scores),  in.lens,           bf16(in.queries),         bf16(in.keys),
          bf16(in.values), bf16(in.upstream_scores), bf16(in.upstream_out)};
}

Inputs make_inputs(const Shape& s) {
  torch::manual_seed(0);
  const auto lens = unmasked(s) ? torch::Tensor() : torch::randint(1, s.m + 1, {s.B});
  return {torch::randn({s.B, s.n, s.m}), lens,
          torch::randn({s.B, s.n, s.d}), torch::randn({s.B, s.m, s.d}),
          torch::randn({s.B, s.m, s.d}), torch::randn({s.B, s.n, s.m}),
          torch::randn({s.B, s.n, s.d})};
}

// ---------------------------------------------------------------- cases

using Body = std::function<void()>;
using CaseFactory = std::function<Body(const Shape&, const Inputs&)>;

Body forward_only(std::function<torch::Tensor()> f) {
  return [f] {
    torch::NoGradGuard no_grad;
    benchmark::DoNotOptimize(f());
  };
}

// Forward, then backward of `upstream` into fresh leaves (grads reset each time).
Body forward_backward(std::vector<torch::Tensor> leaves, torch::Tensor upstream,
                      std::function<torch::Tensor(const std::vector<torch::Tensor>&)> f,
                      std::vector<torch::Tensor> params = {}) {
  for (auto& t : leaves) t = t.detach().clone().requires_grad_();
  return [=]() mutable {
    for (auto& t : leaves) t.mutable_grad().reset();
    for (auto& p : params) p.mutable_grad().reset();
    f(leaves).backward(upstream);
  };
}

d2l::AdditiveAttention additive_module(const Shape& s, d2l::AttentionBackend path) {
  torch::manual_seed(1);
  d2l::AdditiveAttention a(d2l::AdditiveAttentionOptions(s.d, s.d, s.h).backend(path));
  a->eval();
  return a;
}

d2l::DotProductAttention dot_module(d2l::AttentionBackend path) {
  d2l::DotProductAttention a(d2l::DotProductAttentionOptions().backend(path));
  a->eval();
  return a;
}

std::map<std::string, CaseFactory> cases_for(d2l::AttentionBackend path) {
  auto softmax = [path](const torch::Tensor& X, const torch::Tensor& lens) {
    return d2l::masked_softmax(X, lens, path);
  };
  std::map<std::string, CaseFactory> c;
  c["masked_softmax_fwd"] = [=](const Shape&, const Inputs& in) {
    return forward_only([=] { return softmax(in.scores, in.lens); });
  };
  c["masked_softmax_fwdbwd"] = [=](const Shape&, const Inputs& in) {
    return forward_backward({in.scores}, in.upstream_scores,
                            [=](const auto& x) { return softmax(x[0], in.lens); });
  };
  c["dot_fwd"] = [=](const Shape&, const Inputs& in) {
    auto a = dot_module(path);
    return forward_only([=]() mutable { return a(in.queries, in.keys, in.values, in.lens); });
  };
  c["dot_fwdbwd"] = [=](const Shape&, const Inputs& in) {
    auto a = dot_module(path);
    return forward_backward({in.queries, in.keys, in.values}, in.upstream_out,
                            [=](const auto& x) mutable { return a(x[0], x[1], x[2], in.lens); });
  };
  c["additive_fwd"] = [=](const Shape& s, const Inputs& in) {
    auto a = additive_module(s, path);
    return forward_only([=]() mutable { return a(in.queries, in.keys, in.values, in.lens); });
  };
  c["additive_fwdbwd"] = [=](const Shape& s, const Inputs& in) {
    auto a = additive_module(s, path);
    return forward_backward(
        {in.queries, in.keys, in.values}, in.upstream_out,
        [=](const auto& x) mutable { return a(x[0], x[1], x[2], in.lens); }, a->parameters());
  };
  return c;
}

constexpr int64_t kTanhBlock = 16384;  // floats: 64 KiB, within L2

Body tanh_blocks(const Shape& s, std::function<void(torch::Tensor&, const torch::Tensor&)> f) {
  const int64_t total = s.B * s.n * s.m * s.h;
  const auto x = torch::randn({kTanhBlock}) * 2;
  return [=] {
    auto y = torch::empty_like(x);
    for (int64_t done = 0; done < total; done += kTanhBlock) {
      auto xs = x.narrow(0, 0, std::min(kTanhBlock, total - done));
      auto ys = y.narrow(0, 0, xs.numel());
      f(ys, xs);
    }
  };
}

// Floors: what the fused paths are measured against.
std::map<std::string, CaseFactory> floor_cases() {
  std::map<std::string, CaseFactory> c;
  c["softmax_fwd"] = [](const Shape&, const Inputs& in) {
    return forward_only([=] { return torch::softmax(in.scores, -1); });
  };
  c["softmax_fwdbwd"] = [](const Shape&, const Inputs& in) {
    return forward_backward({in.scores}, in.upstream_scores,
                            [](const auto& x) { return torch::softmax(x[0], -1); });
  };
  c["dot_parts_fwd"] = [](const Shape&, const Inputs& in) {
    return forward_only([=] {
      const auto p = torch::softmax(torch::bmm(in.queries, in.keys.transpose(1, 2)), -1);
      return torch::bmm(p, in.values);
    });
  };
  // ATen's copy of the scores into a buffer allocated once: one read and one
  // write of (B, n, m), what the masked softmax's forward must at least do.
  // Its 1 -> 2 thread speed-up is what this machine's memory allows such an
  // op at this size.
  c["copy_floor"] = [](const Shape&, const Inputs& in) -> Body {
    auto y = torch::empty_like(in.scores);
    return [=]() mutable { y.copy_(in.scores); };
  };
  // A parallel region over every intra-op thread with nothing in it (ATen's
  // parallel_for, as the kernels open theirs): what starting and joining the
  // threads costs, whatever the shape. At 1 thread it runs inline. An op
  // whose whole work is near this cost cannot gain from a second thread.
  c["parallel_floor"] = [](const Shape&, const Inputs&) -> Body {
    return [] {
      const int64_t threads = at::get_num_threads();
      std::vector<int64_t> seen(threads, 0);
      at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) seen[t] = at::get_thread_num();
      });
      TORCH_CHECK(threads == 1 || seen[0] != seen[threads - 1],
                  "parallel_floor: the region ran on one thread (built without OpenMP?)");
      benchmark::DoNotOptimize(seen.data());
    };
  };
  // tanh alone on B*n*m*h floats, the floor of additive attention: our
  // kernel's tanh, and ATen's (SLEEF) for reference. Computed block by block
  // on a cache-resident buffer, as the kernel meets its operands, so that
  // the floor is arithmetic rather than memory streaming.
  c["tanh_floor"] = [](const Shape& s, const Inputs&) {
    return tanh_blocks(s, [](torch::Tensor& y, const torch::Tensor& x) {
      d2l::cpu::additive_attention_kernels().tanh(x, y);
    });
  };
  c["aten_tanh"] = [](const Shape& s, const Inputs&) {
    return tanh_blocks(s, [](torch::Tensor& y, const torch::Tensor& x) { torch::tanh_out(y, x); });
  };
  return c;
}

// ------------------------------------------- dot-product attention vs SDPA
// LibTorch 2.x's scaled_dot_product_attention against our dot-product paths
// without weights, on (BH, n = m, d = 64) with random valid lengths in
// [1, m]. SDPA gets the equivalent boolean key-padding mask, as a user
// calling it directly would give it. Shapes `sdpa128` ... `sdpa8192`, and
// `sdpa128full` ... without masking. `sdpa<m>q1`: one query against m keys
// (a decoding step: batch x heads = BH queries, each over its cache of keys);
// `sdpa16384q1` is one such query alone (BH = 1, fewer rows than threads).

const std::vector<Shape> kSdpaShapes = {
    {"sdpa128", 32, 128, 128, 64, 0},   {"sdpa512", 8, 512, 512, 64, 0},
    {"sdpa1024", 4, 1024, 1024, 64, 0}, {"sdpa2048", 4, 2048, 2048, 64, 0},
    {"sdpa4096", 2, 4096, 4096, 64, 0}, {"sdpa8192", 1, 8192, 8192, 64, 0},
    {"sdpa512q1", 32, 1, 512, 64, 0},   {"sdpa2048q1", 32, 1, 2048, 64, 0},
    {"sdpa8192q1", 8, 1, 8192, 64, 0},  {"sdpa16384q1", 1, 1, 16384, 64, 0}};

torch::Tensor dot_attention(const Inputs& in, const std::vector<torch::Tensor>& qkv,
                            d2l::AttentionBackend path, bool need_weights) {
  auto options = d2l::functional::DotProductAttentionFuncOptions().valid_lens(in.lens);
  return std::get<0>(d2l::functional::dot_product_attention(
      qkv[0], qkv[1], qkv[2], options.backend(path).need_weights(need_weights)));
}

std::map<std::string, CaseFactory> sdpa_cases() {
  std::map<std::string, CaseFactory> c;
  // The flash kernel (kFused and kAuto without weights), and the same call
  // with the weights asked for: since 21bed17 the kernel then also writes
  // the (B, n, m) weights (before, bmm, fused masked softmax, bmm).
  struct Variant {
    std::string name;
    d2l::AttentionBackend path;
    bool need_weights;
  };
  for (const auto& [name, path, need_weights] :
       std::vector<Variant>{{"dot_fused_noweights", d2l::AttentionBackend::kFused, false},
                            {"dot_fused_weights", d2l::AttentionBackend::kFused, true}}) {
    c[name + "_fwd"] = [path = path, need_weights = need_weights](const Shape&, const Inputs& in) {
      return forward_only([=] {
        return dot_attention(in, {in.queries, in.keys, in.values}, path, need_weights);
      });
    };
    c[name + "_fwdbwd"] = [path = path, need_weights = need_weights](const Shape&,
                                                                     const Inputs& in) {
      return forward_backward(
          {in.queries, in.keys, in.values}, in.upstream_out,
          [=](const auto& x) { return dot_attention(in, x, path, need_weights); });
    };
  }
  // The path the flash kernel replaced: bmm, the fused masked-softmax
  // kernel, bmm, with the (B, n, m) scores and weights in memory. Issue 12's
  // "at least 2x our own previous path" is measured against it, on 1.13 too.
  auto unfused = [](const Inputs& in, const std::vector<torch::Tensor>& x) {
    const auto scores =
        torch::bmm(x[0], x[1].transpose(1, 2)) / std::sqrt(static_cast<double>(x[0].size(2)));
    return torch::bmm(d2l::masked_softmax(scores, in.lens, d2l::AttentionBackend::kFused), x[2]);
  };
  c["dot_unfused_fwd"] = [=](const Shape&, const Inputs& in) {
    return forward_only([=] { return unfused(in, {in.queries, in.keys, in.values}); });
  };
  c["dot_unfused_fwdbwd"] = [=](const Shape&, const Inputs& in) {
    return forward_backward({in.queries, in.keys, in.values}, in.upstream_out,
                            [=](const auto& x) { return unfused(in, x); });
  };
#if D2L_HAS_SDPA
  auto sdpa = [](const Inputs& in, const std::vector<torch::Tensor>& x) {
    std::optional<torch::Tensor> mask;
    if (in.lens.defined()) {
      mask = (torch::arange(x[1].size(1)) < in.lens.view({-1, 1}))
                 .view({x[1].size(0), 1, 1, x[1].size(1)});
    }
    return at::scaled_dot_product_attention(x[0].unsqueeze(1), x[1].unsqueeze(1), x[2].unsqueeze(1),
                                            mask)
        .squeeze(1);
  };
  c["sdpa_fwd"] = [=](const Shape&, const Inputs& in) {
    return forward_only([=] { return sdpa(in, {in.queries, in.keys, in.values}); });
  };
  c["sdpa_fwdbwd"] = [=](const Shape&, const Inputs& in) {
    return forward_backward({in.queries, in.keys, in.values}, in.upstream_out,
                            [=](const auto& x) { return sdpa(in, x); });
  };
  c["sdpa_bf16_fwd"] = [=](const Shape&, const Inputs& f) {
    const Inputs in = in_bf16(f);
    return forward_only([=] { return sdpa(in, {in.queries, in.keys, in.values}); });
  };
  c["sdpa_bf16_fwdbwd"] = [=](const Shape&, const Inputs& f) {
    const Inputs in = in_bf16(f);
    return forward_backward({in.queries, in.keys, in.values}, in.upstream_out,
                            [=](const auto& x) { return sdpa(in, x); });
  };
#endif
  // The flash kernel on bfloat16 inputs: its bfloat16 kernel where the CPU
  // has AVX512-BF16 (Note [bfloat16 flash attention]), else the float kernel
  // on inputs widened to float.
  c["dot_fused_noweights_bf16_fwd"] = [](const Shape&, const Inputs& f) {
    const Inputs in = in_bf16(f);
    return forward_only([=] {
      return dot_attention(in, {in.queries, in.keys, in.values}, d2l::AttentionBackend::kFused,
                           false);
    });
  };
  c["dot_fused_noweights_bf16_fwdbwd"] = [](const Shape&, const Inputs& f) {
    const Inputs in = in_bf16(f);
    return forward_backward({in.queries, in.keys, in.values}, in.upstream_out, [=](const auto& x) {
      return dot_attention(in, x, d2l::AttentionBackend::kFused, false);
    });
  };
  return c;
}

// Multiply-adds per (query, key) pair the attention rows count as useful
// work: Q Kᵀ and P V over valid keys only (SDPA's padding does not count),
// 2 · (d + dv) flops a pair forward, 3.5 times that forward and backward
// (five products of the same size against two).
double useful_flop(const Shape& s, const Inputs& in, bool backward) {
  double pairs = static_cast<double>(s.B * s.n * s.m);
  if (in.lens.defined()) pairs = in.lens.clamp_max(s.m).sum().item<double>() * s.n;
  return pairs * 2.0 * (2 * s.d) * (backward ? 3.5 : 1.0);
}

// ------------------------------------------------------------- the limits
// Register-only loops of 16 independent accumulators, long enough to hide
// every latency: the most one core does of each instruction. Compiled for
// AVX-512 (and AVX512-BF16) here only; registered where the CPU runs them.

constexpr int64_t kPeakSteps = 4000000;

__attribute__((target("avx512f"))) double fma_loop() {
  __m512 acc[16];
  const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t k = 0; k < kPeakSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  float sum = 0;
  for (int i = 0; i < 16; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  benchmark::DoNotOptimize(sum);
  return kPeakSteps * 16.0 * 16 * 2;
}

// The same on AVX2's 8 lanes (12 chains fill its 16 registers with room):
// the peak of a CPU without AVX-512, and of one whose kernels are pinned to
// avx2 (D2L_CPU_ISA), which run no AVX-512 instruction.
__attribute__((target("avx2,fma"))) double fma_loop_avx2() {
  __m256 acc[12];
  const __m256 b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  for (int64_t k = 0; k < kPeakSteps; ++k) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  alignas(32) float lanes[8];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (const float x : lanes) sum += x;
  }
  benchmark::DoNotOptimize(sum);
  return kPeakSteps * 12.0 * 8 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_loop() {
  __m512 acc[16];
  const auto x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
  const auto y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t k = 0; k < kPeakSteps; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  }
  float sum = 0;
  for (int i = 0; i < 16; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  benchmark::DoNotOptimize(sum);
  return kPeakSteps * 16.0 * 32 * 2;
}

struct Limit {
  std::string name;
  std::function<bool()> runs_here;
  std::function<std::function<double()>()> make;  // the body, returning its flops
};

std::vector<Limit> limits() {
  const auto mm = [](torch::ScalarType dtype) {
    return [dtype]() -> std::function<double()> {
      const auto a = torch::randn({2048, 2048}).to(dtype), b = torch::randn({2048, 2048}).to(dtype);
      return [=] {
        benchmark::DoNotOptimize(torch::mm(a, b));
        return 2.0 * 2048 * 2048 * 2048;
      };
    };
  };
  const auto always = [] { return true; };
  // fma_peak: the widest float32 FMA the kernels run with, AVX-512's or,
  // on an AVX2 CPU or with the kernels pinned to avx2, AVX2's. mm_bf16 only
  // where the CPU multiplies bfloat16 itself (elsewhere LibTorch converts,
  // minutes a call, and there is no bfloat16 rate to quote).
  const bool avx512 = d2l::cpu_isa() >= d2l::CpuIsa::kAvx512;
  const bool bf16 = __builtin_cpu_supports("avx512bf16") != 0;
  return {{"fma_peak",
           [] {
             return __builtin_cpu_supports("avx512f") != 0 ||
                    (__builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0);
           },
           [avx512] { return std::function<double()>(avx512 ? fma_loop : fma_loop_avx2); }},
          {"dpbf16_peak", [bf16] { return bf16; },
           [] { return std::function<double()>(dpbf16_loop); }},
          {"mm_fp32", always, mm(torch::kFloat)},
          {"mm_bf16", [bf16] { return bf16; }, mm(torch::kBFloat16)}};
}

struct Config {
  std::vector<int> threads{1, 2};
  std::vector<std::string> shapes{"toy", "d2l", "mid", "big"};
  bool memory = true;
  bool composite_big = false;
  bool deterministic = false;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// Takes our own flags out of argv, leaving Google Benchmark's.
Config parse(int& argc, char** argv) {
  Config config;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      config.threads.clear();
      for (const auto& t : split(argv[++i])) config.threads.push_back(std::stoi(t));
    } else if (arg == "--shapes" && i + 1 < argc) {
      config.shapes = split(argv[++i]);
    } else if (arg == "--no-memory") {
      config.memory = false;
    } else if (arg == "--composite-big") {
      config.composite_big = true;
    } else if (arg == "--deterministic") {
      config.deterministic = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return config;
}

void register_case(const std::string& name, const Shape& shape, int threads,
                   const CaseFactory& factory, bool memory, bool count_flop = false) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [=](benchmark::State& state) {
                                 // ATen's pool at `threads`, OpenBLAS's at 1: the
                                 // library's recommended set-up (README, "Two thread
                                 // pools"); the process-wide OpenBLAS pool also serves
                                 // the composite and floor cases.
                                 d2l::set_num_threads(threads);
                                 const Inputs inputs = make_inputs(shape);
                                 Body body = factory(shape, inputs);
                                 body();  // warm-up: allocator, OpenMP pool, lazy initialisation
                                 if (memory) {
                                   state.counters["peak_rss_delta_bytes"] = peak_rss_delta(body);
                                   if (d2l::bench::heap_counting()) {
                                     state.counters["peak_heap_delta_bytes"] =
                                         static_cast<double>(d2l::bench::peak_heap_delta(body));
                                   }
                                 }
                                 for (auto _ : state) body();
                                 state.counters["threads"] = threads;
                                 if (count_flop) {
                                   const bool backward = name.find("_fwdbwd/") != std::string::npos;
                                   state.counters["useful_flop"] =
                                       useful_flop(shape, inputs, backward);
                                 }
                               })
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  const Config config = parse(argc, argv);
  benchmark::AddCustomContext("d2l_cpu_isa", d2l::to_string(d2l::cpu_isa()));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  // Other programs on the cores change the timings: the 1, 5 and 15 minute
  // load averages as the run starts.
  std::ifstream loadavg("/proc/loadavg");
  std::string one, five, fifteen;
  loadavg >> one >> five >> fifteen;
  benchmark::AddCustomContext("load_average", one + " " + five + " " + fifteen);
  at::globalContext().setDeterministicAlgorithms(config.deterministic, false);
  benchmark::AddCustomContext("deterministic_algorithms", config.deterministic ? "on" : "off");
  for (const auto& shape : kShapes) {
    if (std::find(config.shapes.begin(), config.shapes.end(), shape.name) == config.shapes.end()) {
      continue;
    }
    for (int threads : config.threads) {
      const auto suffix = fmt::format("/{}/threads:{}", shape.name, threads);
      for (const auto& [name, factory] : cases_for(d2l::AttentionBackend::kAuto)) {
        register_case(name + suffix, shape, threads, factory, config.memory);
      }
      for (const auto& [name, factory] : floor_cases()) {
        register_case(name + suffix, shape, threads, factory, config.memory);
      }
      for (const auto& [name, factory] : cases_for(d2l::AttentionBackend::kComposite)) {
        // The book's additive path at the big shape takes seconds and gigabytes.
        const bool slow = shape.name == "big" && name.rfind("additive", 0) == 0;
        if (slow && !config.composite_big) continue;
        register_case("composite:" + name + suffix, shape, threads, factory, config.memory);
      }
    }
  }
  for (const auto& masked : kSdpaShapes) {
    for (auto shape :
         {masked, Shape{masked.name + "full", masked.B, masked.n, masked.m, masked.d, 0}}) {
      if (std::find(config.shapes.begin(), config.shapes.end(), shape.name) ==
          config.shapes.end()) {
        continue;
      }
      for (int threads : config.threads) {
        for (const auto& [name, factory] : sdpa_cases()) {
          register_case(fmt::format("{}/{}/threads:{}", name, shape.name, threads), shape, threads,
                        factory, config.memory, /*count_flop=*/true);
        }
      }
    }
  }
  if (std::find(config.shapes.begin(), config.shapes.end(), "limits") != config.shapes.end()) {
    for (const auto& limit : limits()) {
      if (!limit.runs_here()) continue;
      for (int threads : config.threads) {
        benchmark::RegisterBenchmark(
            fmt::format("{}/limits/threads:{}", limit.name, threads).c_str(),
            [=](benchmark::State& state) {
              d2l::set_num_threads(threads);
              const auto body = limit.make();
              double flop = body();
              for (auto _ : state) flop = body();
              state.counters["flop"] = flop;
              state.counters["threads"] = threads;
            })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
