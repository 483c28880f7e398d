#pragma once

// How the op layer and the autograd functions prepare tensors for the CPU
// kernels, which compute in float or double on contiguous memory and take
// lengths as int64.

#include <torch/types.h>

#include <cstdint>

namespace d2l::detail {

/// The kernels work in float or double; float16 and bfloat16 are widened to
/// float (their accumulation type) and narrowed back by the caller.
inline torch::Tensor compute_type(const torch::Tensor& t) {
  const bool reduced = t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
  return (reduced ? t.to(torch::kFloat) : t).contiguous();
}

/// Autograd functions take no undefined tensors: "no lengths" travels as an
/// empty int64 tensor (a batch of zero rows needs none either).
inline torch::Tensor lengths_arg(const torch::Tensor& valid_lens) {
  if (!valid_lens.defined()) return torch::empty({0}, torch::kLong);
  // A floating-point length may be a whole number beyond int64 (1e20), which
  // converts to a negative one; any length past the keys means "all valid".
  // (LibTorch 1.13 has no float16 clamp on the CPU: float16 goes to float.)
  if (at::isFloatingType(valid_lens.scalar_type())) {
    const auto wide =
        valid_lens.scalar_type() == torch::kHalf ? valid_lens.to(torch::kFloat) : valid_lens;
    return wide.clamp_max(static_cast<double>(int64_t{1} << 62)).to(torch::kLong).contiguous();
  }
  // Skipping no-op conversions matters at toy sizes: each is a dispatcher call.
  const auto lens =
      valid_lens.scalar_type() == torch::kLong ? valid_lens : valid_lens.to(torch::kLong);
  return lens.contiguous();
}

/// Outputs of at least this many bytes go on transparent huge pages
/// (empty_output): glibc's malloc maps each buffer this large on its own
/// (its mmap threshold rises at most to 32 MiB), and unmaps it when freed.
/// Smaller ones may come from the heap, and advising heap pages would
/// outlive the tensor: khugepaged may later collapse them, with other
/// allocations' free pages, into resident 2 MiB pages (a test measuring the
/// resident set over 10,000 small calls saw it grow past 4 MiB once that way).
constexpr size_t kHugePageOutputBytes = size_t{32} << 20;

/// torch::empty for a CPU output that a kernel then writes in full (the
/// attention weights, gradients of keys and values). From
/// kHugePageOutputBytes it asks Linux for transparent huge pages
/// (madvise(MADV_HUGEPAGE), where THP is left to madvise, as on Debian): a
/// buffer that large comes fresh from mmap on every call, and its first
/// touch costs a page fault per 4 KiB page. At 64 MiB of weights (B 4,
/// 2048 x 2048) that was 35 of the flash forward's 61 ms on this VM; with
/// 2 MiB pages, 34 ms in all.
torch::Tensor empty_output(at::IntArrayRef sizes, const torch::TensorOptions& options);

inline torch::Tensor empty_output_like(const torch::Tensor& t) {
  return empty_output(t.sizes(), t.options());
}

/// t.contiguous(), in t's autograd graph, with a copy of at least
/// kHugePageOutputBytes made into empty_output's memory: a transposed input
/// that large (packed sequences' (T, H, E) rows, a (B, L, H, E) view) is
/// otherwise copied into memory fresh from mmap each call, whose first touch
/// costs a page fault per 4 KiB (33.5 MB: 13 ms on 4 KiB pages, 3 ms on
/// 2 MiB ones, on the Intel AMX VM).
torch::Tensor contiguous_input(const torch::Tensor& t);

/// `t` in `dtype`, without a dispatcher round trip when it already is.
inline torch::Tensor as_dtype(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

}  // namespace d2l::detail
