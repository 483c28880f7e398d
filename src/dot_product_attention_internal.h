#pragma once

// The dot-product attention's layers, for the other ops built on it: the
// checks and composite path live in dot_product_attention.cpp, the choice of
// path in select.cpp,
// the flash autograd function in autograd/dot_product_attention.cpp, the
// kernels in cpu/dot_product_attention_{forward,backward}_kernel.cpp (the table in
// cpu/dot_product_attention_kernel.cpp).

#include <d2l/backend.h>
#include <d2l/torch_version.h>
#include <torch/types.h>

#include <optional>
#include <tuple>

#include "attention_mask_internal.h"
#include "checks.h"
#include "select.h"

namespace d2l::detail {

/// The checks of dot-product attention after check_qkv and check_masks:
/// the feature sizes and the dropout.
void check_dot_product_settings(const char* fn, const torch::Tensor& queries,
                                const torch::Tensor& keys, double dropout);

/// Runs dot-product attention by `path` (select_dot_product's for `params`,
/// or for placeholders of the same sizes): (output, weights or undefined
/// without need_weights).
std::tuple<torch::Tensor, torch::Tensor> run_dot_product_attention(const DotProductParams& params,
                                                                   DotProductPath path);

/// functional::dot_product_attention after check_qkv and check_masks, with
/// the masks resolved in `params` (resolve_masks: lengths and their range, as
/// the check returned them, or a boolean mask): the settings checked, the
/// path selected (and logged when D2L_LOG_PATH asks) and run. Errors name `fn`.
std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(const char* fn,
                                                               const DotProductParams& params);

/// explain_path for dot-product attention after check_qkv and check_masks,
/// with the same checks and errors as dot_product_attention.
PathExplanation explain_dot_product_attention(const char* fn, const DotProductParams& params);

#if D2L_HAS_SDPA
/// at::scaled_dot_product_attention with these arguments (enable_gqa from
/// LibTorch 2.5), or, where LibTorch's own CPU flash kernel refuses this
/// CPU, its math path with the same ones: Debian's LibTorch 2.6 on CPUs with
/// AMX throws "pack_vnni2 is only supported when avx512 is supported" for
/// bfloat16 and float16 (its kernels are built without AVX-512).
torch::Tensor libtorch_sdpa(const torch::Tensor& query, const torch::Tensor& key,
                            const torch::Tensor& value, const std::optional<torch::Tensor>& mask,
                            double dropout, bool is_causal, std::optional<double> scale,
                            bool enable_gqa);
#endif

/// The keys each row keeps under bands (X, P, 2) of int64 (Note [Bands of
/// keys]): (B, n, m) boolean, row b · n + i keeping first <= j < end of pair
/// (b · n + i) % (X · P).
torch::Tensor band_keep(const torch::Tensor& bands, int64_t B, int64_t n, int64_t m);

/// {softmax(scale · Q Kᵀ, masked by valid_lens) V, weights} by the flash CPU
/// kernel (Note [Flash attention]). Without need_weights the weights are
/// undefined and no (B, n, m) tensor is made; with it they are the one.
/// Autograd-aware; its backward is the kernel's, or ATen ops from the saved
/// weights when a gradient reaches them, or differentiable ATen ops when a
/// double backward is being recorded. Tensors on the CPU, non-empty,
/// already checked.
std::tuple<torch::Tensor, torch::Tensor> flash_attention(const torch::Tensor& queries,
                                                         const torch::Tensor& keys,
                                                         const torch::Tensor& values,
                                                         const torch::Tensor& valid_lens,
                                                         double scale, bool need_weights);

/// softmax(scale · Q Kᵀ, masked by valid_lens) V by the flash kernel's
/// bfloat16 kernel (Note [bfloat16 flash attention]), on bfloat16 queries,
/// keys and values, where select_dot_product chose it (kFlashBf16: the
/// kernel is there, no weights, enough queries). Autograd-aware as
/// flash_attention; a backward after the kernels' instruction set was
/// lowered below avx512_bf16 runs ATen ops.
torch::Tensor flash_attention_bf16(const torch::Tensor& queries, const torch::Tensor& keys,
                                   const torch::Tensor& values, const torch::Tensor& valid_lens,
                                   double scale);

}  // namespace d2l::detail
