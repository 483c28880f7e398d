#pragma once

// Note [Choosing a path]
// Every op takes a d2l::AttentionBackend, and each op's path under it is
// chosen by one select_* function here, beside the others, in the manner of
// PyTorch's sdp_utils: the call gathers what decides (shapes, dtype, device,
// its masks resolved once, backend, need_weights, training and dropout) into
// the op's parameter struct, and select_* returns the path and, when asked,
// why it refused the faster ones. The call then runs that path, and
// explain_path returns that same selection to users, with the same checks
// before it. kComposite and kFused are taken as asked (kFused is an error
// off the CPU); kAuto runs the fused CPU kernels for CPU tensors and the
// composite path elsewhere (for additive scores, the chunked path, which
// bounds memory), except that dot-product attention asked for no weights
// runs the flash kernel on the CPU and LibTorch's SDPA on CUDA. A mask that
// lengths cannot express (Note [Masks as lengths]) keeps every op off the
// kernels that mask by lengths. kSdpa is an error for every op but
// dot-product attention. docs/api.md ("Choosing a backend") says the same
// for users; keep the two in step.

#include <torch/types.h>

#include <d2l/backend.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention_mask_internal.h"

namespace d2l::detail {

/// A path, and why each faster one was refused ("<path>: <why>") when the
/// caller asked.
template <class Path>
struct Selection {
  Path path;
  std::vector<std::string> reasons;
};

/// What masked_softmax runs.
enum class MaskedSoftmaxPath {
  kFused,      // the fused CPU kernel
  kComposite,  // the book's ops
};

/// The masked softmax's path for tensors on `device`: the fused kernel on the
/// CPU unless kComposite is asked; throws (naming `fn`) for kFused off the
/// CPU and for kSdpa. Also the gate of every fused kernel below.
MaskedSoftmaxPath select_masked_softmax(const char* fn, AttentionBackend backend,
                                        const c10::Device& device);

/// What the attention modules' projections (detail::linear) run.
enum class LinearPath {
  kSplit,       // the products split by rows over ATen's threads
  kFunctional,  // torch::nn::functional::linear
};

/// The path of y = x Wᵀ + b: split where linear_splits_over_threads says it
/// pays (and the bias fits), functional::linear under kComposite or else.
LinearPath select_linear(const torch::Tensor& x, const torch::Tensor& W, const torch::Tensor& b,
                         AttentionBackend backend);

/// What functional::dot_product_attention runs.
enum class DotProductPath {
  kComposite,     // bmm, composite masked softmax, bmm: the book's ops
  kFusedSoftmax,  // bmm, fused masked softmax, bmm: dropout in training
  kFlash,         // the flash CPU kernel (Note [Flash attention]), with or without weights
  kFlashBf16,     // its bfloat16 kernel (Note [bfloat16 flash attention]), without weights
  kSdpa,          // LibTorch's scaled_dot_product_attention
};

/// "composite", "fused_softmax", "flash", "flash_bf16" or "sdpa".
const char* to_string(DotProductPath path);

/// What decides dot-product attention's path: queries (B, n, d), keys (B, m,
/// d), values (B, m, v) (their sizes, dtype and device; they may be
/// expanded placeholders), the call's resolved masks and settings.
struct DotProductParams {
  torch::Tensor queries, keys, values;
  ResolvedMask mask;
  AttentionBackend backend = AttentionBackend::kAuto;
  double dropout = 0.0;
  bool training = false;
  bool need_weights = true;
  /// The factor of Q Kᵀ; the book's division by sqrt(d) when unset.
  std::optional<double> scale = std::nullopt;
};

/// The path functional::dot_product_attention runs. kFused runs the flash
/// kernel when no training-time dropout is asked and no size is zero, and
/// the fused softmax otherwise; bfloat16 runs the flash kernel's bfloat16
/// kernel where the instruction set in use has it (CpuIsa::kAvx512Bf16) and
/// no weights are asked, else the float kernel on inputs widened to float (a "flash_bf16: <why>"
/// reason says which). A boolean mask that lengths cannot express
/// runs the composite path, or SDPA where it would run anyway or is asked.
/// Throws, naming `fn`, for kSdpa on LibTorch older than 2.1 or with
/// `need_weights`.
Selection<DotProductPath> select_dot_product(const char* fn, const DotProductParams& params,
                                             bool explain);

/// The path of nn::functional::scaled_dot_product_attention (Python's
/// semantics), for `params` of its calls flattened to (B, n, d) batches (the
/// grouped heads folded into the queries), whose dropout is drawn whenever
/// it is above 0. kAuto on CUDA and kSdpa run LibTorch's SDPA with the
/// call's own arguments (an error on LibTorch before 2.1 for kSdpa); on the
/// CPU the kernels run as select_dot_product chooses for them, and a mask
/// they cannot take (its `general_because`: a float bias, a mask that is not
/// a prefix, E = 0, a zero size) runs the composite path, which is Python's
/// math path.
Selection<DotProductPath> select_scaled_dot_product(const char* fn, const DotProductParams& params,
                                                    bool explain);

/// What additive attention runs, fastest first.
enum class AdditivePath {
  kFusedProjections,  // projections and fused kernel through the values, one autograd node
  kFusedValues,       // the fused kernel through the values (weights · values)
  kFusedScores,       // the fused kernel's masked softmax of the scores; dropout, bmm
  kChunked,           // scores by blocks of queries in ATen ops; composite softmax, bmm
  kComposite,         // the book's ops
};

/// "fused_projections", "fused_values", "fused_scores", "chunked" or
/// "composite".
const char* to_string(AdditivePath path);

/// How much of additive attention the caller asks for: the scores (or their
/// masked softmax) alone, the attention from projected queries and keys (a
/// decoder that projects its keys once), or the whole op from the inputs.
enum class AdditiveStage { kScores, kProjected, kFull };

/// What decides additive attention's path: the (projected) queries' dtype
/// and device, the stage, the resolved masks and the settings.
struct AdditiveParams {
  torch::Tensor queries;
  AdditiveStage stage = AdditiveStage::kFull;
  ResolvedMask mask;
  AttentionBackend backend = AttentionBackend::kAuto;
  double dropout = 0.0;
  bool training = false;
};

/// The path additive attention runs. A mask lengths cannot express runs the
/// chunked path (the composite one under kComposite), which apply it as a
/// boolean mask. Throws, naming `fn`, for kSdpa and for kFused off the CPU.
Selection<AdditivePath> select_additive(const char* fn, const AdditiveParams& params, bool explain);

/// Whether heads of n queries, m keys and d features run on the small-head
/// kernels: each holds its scores row by row, and its weights (n × m) are
/// kept for the backward. Larger heads run on the flash kernel, whose blocks
/// pay for themselves from about these sizes. Measured with
/// `bench_transformer`'s mha_size cases (self-attention of 4 heads, batch 16,
/// forward+backward, 1 thread, AVX-512 floats), against a build that sent
/// every head to the flash kernel: with d = 8 and 16, 0.38 to 0.68 of the
/// flash path's time at 8 × 8 to 24 × 24 and 0.84 at 64 × 64; with d = 64,
/// 0.82 to 0.88 up to 24 × 24, the same time at 32 × 32 and 40 × 40, and
/// 1.28 at 48 × 48.
inline bool small_heads(int64_t n, int64_t m, int64_t d) {
  return n * m <= (d <= 16 ? 4096 : 1024);
}

/// What functional::multi_head_attention runs.
enum class MultiHeadPath {
  kSmallHeads,  // projections, the small-head kernel and W_o as one node (Note [Small heads])
  kPerHead,     // the projections, then dot-product attention over the heads
};

/// What decides multi-head attention's path: the inputs, the heads, the
/// masks resolved per batch entry (or per head, `mask_per_head`, when the
/// attn_mask gives each head its own) and the settings.
struct MultiHeadParams {
  torch::Tensor queries, keys, values;
  int64_t heads = 1;
  /// Key/value heads: `heads`, or fewer for grouped-query attention.
  int64_t kv_heads = 1;
  /// Features per head, num_hiddens / heads.
  int64_t head_features = 1;
  ResolvedMask mask;
  bool mask_per_head = false;
  AttentionBackend backend = AttentionBackend::kAuto;
  double dropout = 0.0;
  bool training = false;
  bool need_weights = true;
  /// A call over a cache of projected keys while autograd records
  /// (MultiHeadAttention::forward_cached): the small-heads node differentiates
  /// from the raw keys and values, not from the cached projections.
  bool grad_through_cache = false;
};

/// Multi-head attention's path, and for kPerHead the per-head dot-product
/// attention's (`per_head`), with "small_heads: <why>" first among the
/// reasons.
struct MultiHeadSelection {
  MultiHeadPath path = MultiHeadPath::kPerHead;
  DotProductPath per_head = DotProductPath::kComposite;
  std::vector<std::string> reasons;
};
MultiHeadSelection select_multi_head(const char* fn, const MultiHeadParams& params, bool explain);

/// The masks of a multi-head call for its per-head paths: one row per head.
ResolvedMask per_head_mask(const MultiHeadParams& params);

/// Prints one line, as PathExplanation::to_string, to stderr: what `fn`
/// runs under `backend` and why. The ops call it when logging_paths().
void log_path(const char* fn, AttentionBackend backend, const char* path,
              const std::vector<std::string>& reasons);

/// Whether the environment variable D2L_LOG_PATH asks for every call's path
/// to be logged (set, and neither "" nor "0"); read once per process.
bool logging_paths();

}  // namespace d2l::detail
