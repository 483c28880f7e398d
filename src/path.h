#pragma once

// Note [Choosing a path]
// Every op takes a d2l::Path. kComposite and kFused are taken as asked (kFused
// is an error off the CPU); kAuto runs the fused CPU kernels for CPU tensors
// and the composite path elsewhere (for additive scores, the chunked path,
// which bounds memory), except that dot-product attention asked for no
// weights runs the flash kernel on the CPU and LibTorch's SDPA on CUDA
// (choose_dot_product_path). kSdpa is an
// error for every op but dot-product attention. The README's "Choosing a
// path" table says the same for users; keep the two in step.

#include <torch/types.h>

#include <d2l/backend.h>

#include <cstdint>

namespace d2l::detail {

/// Whether `path` runs the fused CPU kernels for tensors on `device`; throws
/// (naming `fn`) for kFused off the CPU and for kSdpa.
bool use_fused(const char* fn, Path path, const c10::Device& device);

/// What functional::dot_product_attention runs.
enum class DotProductPath {
  kComposite,     // bmm, composite masked softmax, bmm: the book's ops
  kFusedSoftmax,  // bmm, fused masked softmax, bmm: dropout in training
  kFlash,         // the flash CPU kernel (Note [Flash attention]), with or without weights
  kSdpa,          // LibTorch's scaled_dot_product_attention
};

/// The path functional::dot_product_attention runs for these arguments.
/// Path::kFused runs the flash kernel when no training-time dropout is asked
/// and no size is zero, and the fused softmax otherwise.
/// Throws, naming `fn`, for kSdpa on LibTorch older than 2.1 or with
/// `need_weights`.
DotProductPath choose_dot_product_path(const char* fn, Path path, const torch::Tensor& queries,
                                       const torch::Tensor& keys, const torch::Tensor& values,
                                       double dropout, bool training, bool need_weights);

}  // namespace d2l::detail
