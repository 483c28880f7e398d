#pragma once

// The dot-product attention's layers, for the other ops built on it: the
// checks, composite path and choice of path live in dot_product_attention.cpp,
// the flash autograd function in autograd/dot_product_attention.cpp, the
// kernel in cpu/dot_product_attention_kernel.cpp.

#include <torch/types.h>

namespace d2l::detail {

/// softmax(scale · Q Kᵀ, masked by valid_lens) V by the flash CPU kernel
/// (Note [Flash attention]): no attention weights, no (B, n, m) tensor.
/// Autograd-aware; its backward is the kernel's, or differentiable ATen ops
/// when a double backward is being recorded. Tensors on the CPU, non-empty,
/// already checked.
torch::Tensor flash_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                              const torch::Tensor& values, const torch::Tensor& valid_lens,
                              double scale);

}  // namespace d2l::detail
