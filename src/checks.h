#pragma once

// User-facing argument checks shared by the functions and modules. Every
// message starts with the public function's name and states what was received.

#include <torch/types.h>

#include <optional>
#include <string>

namespace d2l::detail {

/// "[2, 1, 3]", or "undefined" for an undefined tensor.
std::string shape_of(const torch::Tensor& t);

/// `name` must be a defined, dense tensor of rank `dim` with a floating-point
/// dtype.
void check_floating(const char* fn, const char* name, const torch::Tensor& t, int64_t dim);

/// `name`, when defined, must be an ordinary dense tensor: strided layout (not
/// sparse, mkldnn, ...), not quantized, not nested, not on the meta device.
/// Call it before anything reads the tensor: ATen's own errors on such
/// tensors do not name our function.
void check_strided_layout(const char* fn, const char* name, const torch::Tensor& t);

/// `other` must live on `ref`'s device.
void check_same_device(const char* fn, const char* ref_name, const torch::Tensor& ref,
                       const char* name, const torch::Tensor& other);

/// `other` must have `ref`'s dtype.
void check_same_dtype(const char* fn, const char* ref_name, const torch::Tensor& ref,
                      const char* name, const torch::Tensor& other);

/// The shortest and the longest of a checked lengths tensor. Off the CPU,
/// reading them is the check's one synchronisation, so the paths that can use
/// them (narrowing keys to the longest length, leaving out a mask that masks
/// nothing) take them from the check instead of reading the device again.
struct LengthRange {
  double shortest = 0;
  double longest = 0;
  /// The lengths on the CPU where the check copied them there (lengths on
  /// another device with at most kHostCopyLimit values); otherwise undefined.
  torch::Tensor on_host;
};

/// Lengths off the CPU with at most this many values are checked on the
/// host: one copy, where the reduction on the device takes several ops.
constexpr int64_t kHostCopyLimit = int64_t{1} << 16;

/// Lengths for scores of shape (batch, queries, keys) held by `scores_name`:
/// undefined, or 1-D (batch) or 2-D (batch, queries), on the scores' device,
/// holding whole non-negative numbers (any integer dtype, or floating point
/// holding whole numbers). Their range; nullopt when undefined or empty.
std::optional<LengthRange> check_valid_lens(const char* fn, const torch::Tensor& valid_lens,
                                            const char* scores_name, const torch::Tensor& scores);

/// The values of a lengths tensor: numeric, whole and non-negative. Their
/// range; nullopt when empty.
std::optional<LengthRange> check_length_values(const char* fn, const char* name,
                                               const torch::Tensor& lens);

/// `p` must be a probability in [0, 1] (NaN is not one).
void check_dropout(const char* fn, double p);

/// Why the file `path` cannot be read as a file: "is a FIFO (named pipe)",
/// "is a directory", "is a character device", ...; empty when it is a
/// regular file, or cannot be opened at all (the caller's own open then says
/// why). It is opened without blocking: a FIFO with no writer is refused at
/// once, not waited on, and a device that never ends is never read.
std::string unreadable_file_reason(const std::string& path);

/// Why the file `path` cannot be written as a file: "is a directory", "is a
/// FIFO (named pipe) that no process reads" (opening it would block), ...;
/// empty when it is absent, a regular file, a device such as /dev/null or a
/// FIFO that a process reads (the caller's own open then says what fails).
std::string unwritable_file_reason(const std::string& path);

/// Class labels, any shape: an integer dtype (not bool), each one in [0,
/// classes). A c10::Error naming `fn`, the argument `name` and the dtype, or
/// the first label outside and its flat index, with `classes_from` (the
/// argument whose size gives `classes`). Reads the labels (on CUDA, one
/// synchronisation).
void check_class_labels(const char* fn, const char* name, const torch::Tensor& labels,
                        int64_t classes, const char* classes_from);

/// Whether this LibTorch multiplies float16 matrices on the CPU (1.13 does not).
bool cpu_float16_matmul_available();

/// Shapes common to every attention scorer: queries (B, n, *), keys (B, m, *),
/// values (B, m, v), valid_lens (B) or (B, n); one dtype and one device; and
/// no float16 on a CPU without float16 matrix products. The range of
/// valid_lens (check_valid_lens).
std::optional<LengthRange> check_qkv(const char* fn, const torch::Tensor& queries,
                                     const torch::Tensor& keys, const torch::Tensor& values,
                                     const torch::Tensor& valid_lens);

}  // namespace d2l::detail
