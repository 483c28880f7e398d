// Times the attention modules on one device (CUDA when present, else the
// CPU) next to LibTorch's scaled_dot_product_attention, forward and
// forward+backward, with peak memory; prints a markdown table. Needs no
// Google Benchmark, so it builds on a GPU machine that has only a torch wheel.
//
//   device_timing [--device cuda|cpu] [--shapes mid,big,long] [--repetitions 10]
//
// Shapes (B, n, m, d, h): mid (32, 128, 128, 64, 64), big (8, 512, 512, 64, 128),
// long (2, 4096, 4096, 64, 64). Float32, random valid lengths in 1..m. Time is
// the median over repetitions of one call, synchronised; peak memory is the
// CUDA caching allocator's peak above the inputs (CUDA) or the growth of the
// resident-set high-water mark (CPU).

#include <d2l/attention.h>
#include <torch/torch.h>

#if __has_include(<c10/cuda/CUDACachingAllocator.h>) && D2L_TORCH_VERSION_AT_LEAST(2, 0) && \
    !defined(D2L_NO_CUDA_ALLOCATOR_STATS)
#include <c10/cuda/CUDACachingAllocator.h>
#define D2L_HAVE_CUDA_ALLOCATOR_STATS 1
#endif

#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

using d2l::bench::Shape;

const std::vector<Shape> kShapes = {
    {"mid", 32, 128, 128, 64, 64}, {"big", 8, 512, 512, 64, 128}, {"long", 2, 4096, 4096, 64, 64}};

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize();
}

// Peak bytes one call of `fn` adds on `device`.
double peak_bytes(const torch::Device& device, const std::function<void()>& fn) {
#ifdef D2L_HAVE_CUDA_ALLOCATOR_STATS
  if (device.is_cuda()) {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    synchronize(device);
    const auto index = device.has_index() ? device.index() : 0;
    alloc::resetPeakStats(index);
    const auto before = alloc::getDeviceStats(index).allocated_bytes[0].current;
    fn();
    synchronize(device);
    return static_cast<double>(alloc::getDeviceStats(index).allocated_bytes[0].peak - before);
  }
#endif
  return device.is_cpu() ? d2l::bench::peak_rss_delta(fn) : -1;
}

double median_seconds(const torch::Device& device, int repetitions,
                      const std::function<void()>& fn) {
  fn();  // warm-up: kernels, allocator, autotuning
  synchronize(device);
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    synchronize(device);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

using Forward =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

std::function<void()> pass(const Forward& f, const torch::Tensor& q, const torch::Tensor& k,
                           const torch::Tensor& v, bool backward) {
  if (!backward) {
    return [=] {
      torch::NoGradGuard no_grad;
      f(q, k, v);
    };
  }
  auto leaves = std::vector<torch::Tensor>{q.detach().clone().requires_grad_(),
                                           k.detach().clone().requires_grad_(),
                                           v.detach().clone().requires_grad_()};
  return [=]() mutable {
    for (auto& t : leaves) t.mutable_grad().reset();
    f(leaves[0], leaves[1], leaves[2]).sum().backward();
  };
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device_name = torch::cuda::is_available() ? "cuda" : "cpu";
  std::vector<std::string> shapes = {"mid", "big", "long"};
  int repetitions = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--device")
      device_name = argv[i + 1];
    else if (arg == "--shapes")
      shapes = split(argv[i + 1]);
    else if (arg == "--repetitions")
      repetitions = std::max(1, std::stoi(argv[i + 1]));
    else {
      std::cerr << "unknown argument " << arg << "\n";
      return 2;
    }
  }
  const torch::Device device(device_name);
  std::printf("device %s, LibTorch %s, d2l kernels %s\n\n", device.str().c_str(),
              d2l::torch_version().c_str(), d2l::to_string(d2l::cpu_isa()).c_str());
  std::printf("| shape | case | fwd | fwd peak | fwd+bwd | fwd+bwd peak |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (const auto& shape : kShapes) {
    if (std::find(shapes.begin(), shapes.end(), shape.name) == shapes.end()) continue;
    torch::manual_seed(0);
    const auto opts = torch::TensorOptions().device(device);
    const auto q = torch::randn({shape.B, shape.n, shape.d}, opts);
    const auto k = torch::randn({shape.B, shape.m, shape.d}, opts);
    const auto v = torch::randn({shape.B, shape.m, shape.d}, opts);
    const auto lens = torch::randint(1, shape.m + 1, {shape.B}, opts.dtype(torch::kLong));

    std::vector<std::pair<std::string, Forward>> cases;
    for (auto [name, path, weights] :
         std::vector<std::tuple<std::string, d2l::AttentionBackend, bool>>{
             {"dot, weights (kAuto)", d2l::AttentionBackend::kAuto, true},
             {"dot, no weights (kAuto)", d2l::AttentionBackend::kAuto, false},
             {"dot (kComposite)", d2l::AttentionBackend::kComposite, true}}) {
      cases.emplace_back(
          name, [=, path = path, weights = weights](const auto& a, const auto& b, const auto& c) {
            return std::get<0>(d2l::functional::dot_product_attention(
                a, b, c,
                d2l::functional::DotProductAttentionFuncOptions()
                    .valid_lens(lens)
                    .dropout(0.0)
                    .training(false)
                    .backend(path)
                    .need_weights(weights)));
          });
    }
#if D2L_HAS_SDPA
    cases.emplace_back("SDPA, key-padding mask", [=](const auto& a, const auto& b, const auto& c) {
      const auto mask = (torch::arange(shape.m, lens.options()) < lens.view({-1, 1}))
                            .view({shape.B, 1, 1, shape.m});
      return at::scaled_dot_product_attention(a.unsqueeze(1), b.unsqueeze(1), c.unsqueeze(1), mask)
          .squeeze(1);
    });
#endif
    d2l::AdditiveAttention additive(
        d2l::AdditiveAttentionOptions(shape.d, shape.d, shape.h).record_attention_weights(false));
    additive->to(device);
    cases.emplace_back("additive (kAuto)",
                       [=](const auto& a, const auto& b, const auto& c) mutable {
                         return additive(a, b, c, lens);
                       });
    d2l::MultiHeadAttention mha(
        d2l::MultiHeadAttentionOptions(shape.d, shape.d, shape.d, shape.d, 8)
            .record_attention_weights(false));
    mha->to(device);
    cases.emplace_back(
        "multi-head, 8 heads, no weights",
        [=](const auto& a, const auto& b, const auto& c) mutable { return mha(a, b, c, lens); });

    for (const auto& [name, f] : cases) {
      // Additive attention at `long` evaluates 2^31 tanh: seconds a call on
      // the CPU, where `make bench` measures it at smaller shapes anyway.
      const bool huge = name.rfind("additive", 0) == 0 && shape.name == "long" && device.is_cpu();
      if (huge) continue;
      const auto fwd = pass(f, q, k, v, false), fwdbwd = pass(f, q, k, v, true);
      const double t_fwd = median_seconds(device, repetitions, fwd);
      const double p_fwd = peak_bytes(device, fwd);
      const double t_bwd = median_seconds(device, repetitions, fwdbwd);
      const double p_bwd = peak_bytes(device, fwdbwd);
      std::printf("| %s | %s | %.3f ms | %.1f MiB | %.3f ms | %.1f MiB |\n", shape.name.c_str(),
                  name.c_str(), t_fwd * 1e3, std::max(0.0, p_fwd) / (1 << 20), t_bwd * 1e3,
                  std::max(0.0, p_bwd) / (1 << 20));
      std::fflush(stdout);
    }
  }
  return 0;
}
