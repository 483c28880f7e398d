#pragma once

// Note [Choosing a path]
// Every op takes a d2l::AttentionBackend, and each op's path under it is
// chosen by one function here, beside the others, in the manner of
// PyTorch's sdp_utils checks: choose_dot_product_path, choose_additive_path
// (and use_fused for the masked softmax and the projections). Each returns
// the path the op runs and, when asked, why it refused the faster ones;
// explain_path returns exactly that to users, and the ops run exactly what
// it returns. kComposite and kFused are taken as asked (kFused is an error
// off the CPU); kAuto runs the fused CPU kernels for CPU tensors and the
// composite path elsewhere (for additive scores, the chunked path, which
// bounds memory), except that dot-product attention asked for no weights
// runs the flash kernel on the CPU and LibTorch's SDPA on CUDA. kSdpa is an
// error for every op but dot-product attention. docs/api.md ("Choosing a
// backend") says the same for users; keep the two in step.

#include <torch/types.h>

#include <d2l/backend.h>

#include <cstdint>
#include <string>
#include <vector>

namespace d2l::detail {

/// Whether `backend` runs the fused CPU kernels for tensors on `device`;
/// throws (naming `fn`) for kFused off the CPU and for kSdpa.
bool use_fused(const char* fn, AttentionBackend backend, const c10::Device& device);

/// What functional::dot_product_attention runs.
enum class DotProductPath {
  kComposite,     // bmm, composite masked softmax, bmm: the book's ops
  kFusedSoftmax,  // bmm, fused masked softmax, bmm: dropout in training
  kFlash,         // the flash CPU kernel (Note [Flash attention]), with or without weights
  kSdpa,          // LibTorch's scaled_dot_product_attention
};

/// "composite", "fused_softmax", "flash" or "sdpa".
const char* to_string(DotProductPath path);

/// The path functional::dot_product_attention runs for these arguments.
/// kFused runs the flash kernel when no training-time dropout is asked and
/// no size is zero, and the fused softmax otherwise. A boolean mask that
/// lengths cannot express (`general_mask`, why; empty when the masks are
/// lengths: Note [Masks as lengths]) runs the composite path, or SDPA where
/// it would run anyway or is asked. Throws, naming `fn`, for kSdpa on
/// LibTorch older than 2.1 or with `need_weights`. With `reasons`, appends
/// why each faster path was refused ("<path>: <why>").
DotProductPath choose_dot_product_path(const char* fn, AttentionBackend backend,
                                       const torch::Tensor& queries, const torch::Tensor& keys,
                                       const torch::Tensor& values, double dropout, bool training,
                                       bool need_weights, const std::string& general_mask = {},
                                       std::vector<std::string>* reasons = nullptr);

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

/// The path additive attention runs at `stage` for these arguments (the
/// dtype and device of `queries`). Throws, naming `fn`, for kSdpa and for
/// kFused off the CPU. With `reasons`, appends why each faster path was
/// refused.
AdditivePath choose_additive_path(const char* fn, AttentionBackend backend,
                                  const torch::Tensor& queries, double dropout, bool training,
                                  AdditiveStage stage, std::vector<std::string>* reasons = nullptr);

/// Prints one line, as PathExplanation::to_string, to stderr: what `fn`
/// runs under `backend` and why. The ops call it when logging_paths().
void log_path(const char* fn, AttentionBackend backend, const char* path,
              const std::vector<std::string>& reasons);

/// Whether the environment variable D2L_LOG_PATH asks for every call's path
/// to be logged (set, and neither "" nor "0"); read once per process.
bool logging_paths();

}  // namespace d2l::detail
