// detail::linear (linear.h): Linear layers whose matrix products run on
// ATen's intra-op threads when OpenBLAS would run them on one.
//
// With OpenBLAS at 1 thread (the setting README, "Two thread pools",
// recommends, so that OpenMP's pool is the only one), every GEMM of a Linear
// layer runs on the calling thread while the fused kernels around it use all
// of ATen's: at 2 threads the projections of AdditiveAttention were about a
// quarter of its forward+backward time at the bench's mid shape, all of it
// serial. Here each thread calls BLAS on its own slice, one GEMM per thread.

#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include <d2l/backend.h>

#include "cpu/few_rows_linear_kernel.h"
#include "cpu/packed_linear_kernel.h"
#include "linear.h"
#include "packed_weights.h"
#include "parallel.h"
#include "select.h"

namespace d2l::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Multiply-adds below which one thread does the product: a parallel region
// costs a few microseconds, a 32×32 projection of 64 rows (one step of the
// book's decoder) less than that. The book's (64, 10, 32) queries and keys
// through 32×32 projections (655k multiply-adds each) are split: with them
// AdditiveAttention's forward there went from 168 to 149 µs at 2 threads
// (medians of interleaved runs, 2 vCPUs).
constexpr int64_t kMinMultiplyAdds = int64_t{1} << 18;

// out[r] = a[r] · b for row slices of `a` and `out` (both 2-D, `out`
// contiguous), one slice per thread; plus `bias` where defined.
void rows_over_threads(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                       const torch::Tensor& bias = torch::Tensor()) {
  const int64_t rows = a.size(0);
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, rows, (rows + threads - 1) / threads, [&](int64_t r0, int64_t r1) {
    // Worker threads start with grad mode on; these tensors need none.
    torch::NoGradGuard no_grad;
    auto slice = out.narrow(0, r0, r1 - r0);
    if (bias.defined()) {
      at::addmm_out(slice, bias, a.narrow(0, r0, r1 - r0), b);
    } else {
      at::mm_out(slice, a.narrow(0, r0, r1 - r0), b);
    }
  });
}

// Rows below which a product runs on few_rows_linear_kernel.cpp, by slices of
// W's rows (out's columns) over ATen's threads: a decoding step multiplies
// one row per hypothesis, and BLAS runs products of so few rows
// (matrix-vector products) on one thread, MKL included, and below the speed
// of memory (the kernel's note). At 2 threads the base-size Transformer of
// benchmarks/ct2_table.py decoded one sentence at a time no faster than at
// 1 before.
constexpr int64_t kColumnSplitRows = cpu::kFewRows;

// f(t0, t1) over [0, n) in chunks of `chunk` that ATen's threads claim one
// at a time, each as it finishes its last: a step's products are too short
// for one fixed share per thread, as the threads do not run at one speed (a
// VM's vCPUs; the calling thread comes from serial work with other data in
// its caches). With equal shares, one thread of 2 did 15% more of the
// base-size decoder's products than the other, which waited at the end of
// each (benchmarks/ct2_table.py's base size, greedy, batch 32, 2 threads,
// Zen 3); with the packed kernel's panels claimed, the two did equal shares
// (and decoding took 5% less time in one A/B, within the VM's noise in
// another).
// (The few-rows kernel, bound by memory rather than arithmetic, keeps one
// slice per thread: claimed slices of 64 or 256 columns gained nothing
// there.) Which thread computes an output does not change its bits.
template <typename F>
void claim_over_threads(int64_t n, int64_t chunk, const F& f) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, std::min<int64_t>(chunks, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      f(c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

// One thread's share of `columns` output columns, in whole cache lines of
// out's rows.
int64_t column_grain(int64_t columns) {
  const int64_t threads = at::get_num_threads();
  return ((columns + threads - 1) / threads + 15) / 16 * 16;
}

// out = a · b for `a` of few rows, by slices of the columns of b and out,
// one slice per thread.
void columns_over_threads(const torch::Tensor& out, const torch::Tensor& a,
                          const torch::Tensor& b) {
  const int64_t columns = b.size(1);
  at::parallel_for(0, columns, column_grain(columns), [&](int64_t c0, int64_t c1) {
    torch::NoGradGuard no_grad;
    auto slice = out.narrow(1, c0, c1 - c0);
    at::mm_out(slice, a, b.narrow(1, c0, c1 - c0));
  });
}

// out = x · Wᵀ (+ bias) for x of at most kFewRows rows, on the kernel, by
// slices of W's rows over ATen's threads.
void few_rows_linear(const torch::Tensor& out, const torch::Tensor& x, const torch::Tensor& W,
                     const torch::Tensor& bias) {
  const auto xc = x.contiguous(), Wc = W.contiguous();
  const auto bc = bias.defined() ? bias.contiguous() : torch::empty({0}, W.options());
  const int64_t columns = W.size(0);
  const auto& kernels = cpu::few_rows_linear_kernels();
  at::parallel_for(0, columns, column_grain(columns),
                   [&](int64_t c0, int64_t c1) { kernels.forward(xc, Wc, bc, out, c0, c1); });
}

// `b` is a (0) tensor for no bias: LibTorch 1.13's autograd functions take
// no undefined tensors as inputs.
struct ParallelLinearFunction : torch::autograd::Function<ParallelLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& W, const torch::Tensor& b) {
    const bool has_bias = b.numel() > 0;
    ctx->save_for_backward({x, W});
    ctx->saved_data["bias"] = has_bias;
    const int64_t in = W.size(1), out = W.size(0);
    const auto x2 = x.detach().reshape({-1, in});
    auto y = torch::empty({x2.size(0), out}, x.options());
    const auto bias = has_bias ? b.detach() : torch::Tensor();
    if (x2.size(0) < kColumnSplitRows) {
      few_rows_linear(y, x2, W.detach(), bias);
    } else {
      rows_over_threads(y, x2, W.detach().t(), bias);
    }
    auto sizes = x.sizes().vec();
    sizes.back() = out;
    return y.view(sizes);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &W = saved[1];
    const bool has_bias = ctx->saved_data["bias"].toBool();
    const int64_t in = W.size(1), out = W.size(0);
    const auto x2 = x.reshape({-1, in});
    const auto dy = grads[0].reshape({-1, out}).contiguous();
    torch::Tensor dx, dW, db;
    if (torch::GradMode::is_enabled()) {
      // create_graph=true: differentiable ATen ops, for a double backward.
      if (ctx->needs_input_grad(0)) dx = dy.mm(W).view(x.sizes());
      if (ctx->needs_input_grad(1)) dW = dy.t().mm(x2);
    } else {
      if (ctx->needs_input_grad(0)) {
        dx = torch::empty({dy.size(0), in}, dy.options());
        rows_over_threads(dx, dy, W);
        dx = dx.view(x.sizes());
      }
      if (ctx->needs_input_grad(1)) {
        // dW = dyᵀ x, by rows of dW: rows of dyᵀ are columns of dy.
        dW = torch::empty({out, in}, W.options());
        rows_over_threads(dW, dy.t(), x2.contiguous());
      }
    }
    if (has_bias && ctx->needs_input_grad(2)) db = dy.sum(0);
    return {dx, dW, db};
  }
};

// Whether a product of `rows` rows and `multiply_adds` in all, on the CPU in
// float or double, is split by rows over ATen's threads.
bool product_splits(int64_t rows, int64_t multiply_adds) {
  if (at::in_parallel_region() || multiply_adds < kMinMultiplyAdds) return false;
  if (rows < kColumnSplitRows) return true;  // few_rows_linear, at any number of threads
  if (at::get_num_threads() < 2) return false;
  return rows >= at::get_num_threads() && cpu_threads().openblas == 1;
}

}  // namespace

bool linear_splits_over_threads(const torch::Tensor& x, const torch::Tensor& W) {
  const auto type = x.scalar_type();
  if (!x.device().is_cpu() || !W.device().is_cpu() || W.scalar_type() != type ||
      (type != torch::kFloat && type != torch::kDouble) || W.dim() != 2 || x.dim() < 1 ||
      x.size(-1) != W.size(1)) {
    return false;
  }
  const int64_t rows = x.numel() / std::max<int64_t>(1, x.size(-1));
  return product_splits(rows, rows * W.size(0) * W.size(1));
}

bool mm_widens(const torch::Tensor& a, const torch::Tensor& b) {
  const auto type = a.scalar_type();
  return (type == torch::kBFloat16 || type == torch::kHalf) && b.scalar_type() == type &&
         a.device().is_cpu() && b.device().is_cpu() && !cpu_isa_available(CpuIsa::kAvx512Bf16);
}

torch::Tensor mm_over_threads(const torch::Tensor& a, const torch::Tensor& b) {
  const auto type = a.scalar_type();
  // bfloat16 and float16 on a CPU without bfloat16 dot products (no
  // AVX512-BF16: AVX2-only CPUs): widened to float, multiplied, rounded once,
  // as ATen's own reduced-precision products accumulate in float and round
  // once. ATen's ran at under 1 GFLOP/s there: the four projections of
  // multi-head attention at the book's Transformer shapes took 3.6 ms in
  // bfloat16 against 0.31 ms for the whole node in float (Zen 3, LibTorch
  // 2.11).
  if (mm_widens(a, b)) return mm_over_threads(a.to(torch::kFloat), b.to(torch::kFloat)).to(type);
  const bool splits = a.device().is_cpu() && b.device().is_cpu() && b.scalar_type() == type &&
                      (type == torch::kFloat || type == torch::kDouble) &&
                      product_splits(a.size(0), a.size(0) * a.size(1) * b.size(1));
  if (!splits) return at::mm(a, b);
  auto out = torch::empty({a.size(0), b.size(1)}, a.options());
  if (a.size(0) < kColumnSplitRows) {
    columns_over_threads(out, a, b);
  } else {
    rows_over_threads(out, a, b);
  }
  return out;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b,
                     AttentionBackend backend) {
  if (select_linear(x, W, b, backend) == LinearPath::kFunctional) {
    // Without autograd, a contiguous input as one 2-D product: at::linear's
    // matmul adds reshapes, transposes and conjugate checks (about ten ATen
    // calls a product).
    if (!torch::GradMode::is_enabled() && backend != AttentionBackend::kComposite && x.dim() >= 2 &&
        x.is_contiguous() && W.dim() == 2 && x.size(-1) == W.size(1) && x.device().is_cpu()) {
      const auto x2 = x.view({-1, x.size(-1)});
      auto sizes = x.sizes().vec();
      sizes.back() = W.size(0);
      return (b.defined() ? at::addmm(b, x2, W.t()) : at::mm(x2, W.t())).view(sizes);
    }
    return torch::nn::functional::linear(x, W, b);
  }
  return ParallelLinearFunction::apply(x, W, b.defined() ? b : torch::empty({0}, W.options()));
}

template <typename T>
void linear_into(T* out, const T* x, int64_t rows, const torch::Tensor& W, const torch::Tensor& b,
                 bool check_bytes) {
  const int64_t N = W.size(0), K = W.size(1);
  const T* w = W.data_ptr<T>();
  const T* bias = b.defined() ? b.data_ptr<T>() : nullptr;
  const auto& kernels = cpu::few_rows_linear_kernels();
  const auto forward = [&] {
    if constexpr (std::is_same_v<T, float>) {
      return kernels.forward_float;
    } else {
      return kernels.forward_double;
    }
  }();
  const int64_t multiply_adds = rows * K * N;
  if constexpr (std::is_same_v<T, float>) {
    // Rows of a batch on a large weight, and any rows on a small one: the
    // packed kernel (Note [Packed linear]), by panels over ATen's threads.
    if (rows >= kColumnSplitRows || W.numel() < kPackedMinimumElements) {
      if (const auto packed = packed_weights(W, check_bytes)) {
        const auto& packed_kernels = cpu::packed_linear_kernels();
        const int64_t panels = (N + packed->panel - 1) / packed->panel;
        const auto run = [&](int64_t p0, int64_t p1) {
          packed_kernels.forward(x, rows, K, packed->data.data(), N, bias, out, p0, p1);
        };
        if (at::in_parallel_region() || multiply_adds < kMinMultiplyAdds) {
          run(0, panels);
        } else {
          // Groups of the kernel's panels (Note [Packed linear]).
          claim_over_threads(panels, packed_kernels.group_panels, run);
        }
        return;
      }
    }
  }
  // Double, and fewer rows than a tile by a large float weight, on the
  // few-rows kernel: each row's sums are its own, so a row's bits do not
  // depend on the rows beside it (a source decoded in a batch gets what it
  // gets alone).
  if (multiply_adds < kMinMultiplyAdds || at::in_parallel_region()) {
    forward(x, rows, K, w, N, bias, out, 0, N);
  } else if (rows < kColumnSplitRows) {
    at::parallel_for(0, N, column_grain(N),
                     [&](int64_t c0, int64_t c1) { forward(x, rows, K, w, N, bias, out, c0, c1); });
  } else {
    const auto options = W.options();
    // The caller's arrays as tensors (their memory, no copy).
    const auto xt = torch::from_blob(const_cast<T*>(x), {rows, K}, options);
    auto yt = torch::from_blob(out, {rows, N}, options);
    if (product_splits(rows, multiply_adds)) {
      rows_over_threads(yt, xt, W.t(), b);
    } else if (b.defined()) {
      at::addmm_out(yt, b, xt, W.t());
    } else {
      at::mm_out(yt, xt, W.t());
    }
  }
}

template void linear_into<float>(float*, const float*, int64_t, const torch::Tensor&,
                                 const torch::Tensor&, bool);
template void linear_into<double>(double*, const double*, int64_t, const torch::Tensor&,
                                  const torch::Tensor&, bool);

}  // namespace d2l::detail
