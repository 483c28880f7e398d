#include "checks.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>

namespace d2l::detail {

std::string shape_of(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

void check_floating(const char* fn, const char* name, const torch::Tensor& t, int64_t dim) {
  TORCH_CHECK(t.defined(), fmt::format("{}: {} must be a defined tensor", fn, name));
  check_strided_layout(fn, name, t);
  TORCH_CHECK(t.dim() == dim,
              fmt::format("{}: {} must be a {}-D tensor, got {}", fn, name, dim, shape_of(t)));
  TORCH_CHECK(at::isFloatingType(t.scalar_type()),
              fmt::format("{}: {} must have a floating-point dtype, got {}", fn, name,
                          c10::toString(t.scalar_type())));
}

void check_strided_layout(const char* fn, const char* name, const torch::Tensor& t) {
  if (!t.defined()) return;
  // First: a nested tensor has no sizes() to print.
  TORCH_CHECK(!t.is_nested(), fmt::format("{}: {} must not be a nested tensor", fn, name));
  TORCH_CHECK(t.layout() == torch::kStrided,
              fmt::format("{}: {} must be a dense tensor with the strided layout, got layout {} "
                          "(shape {})",
                          fn, name, fmt::streamed(t.layout()), shape_of(t)));
  TORCH_CHECK(!t.is_quantized(),
              fmt::format("{}: {} must not be a quantized tensor, got dtype {} (shape {})", fn,
                          name, c10::toString(t.scalar_type()), shape_of(t)));
  TORCH_CHECK(!t.is_meta(), fmt::format("{}: {} must hold data, got a tensor on the meta device "
                                        "(shape {})",
                                        fn, name, shape_of(t)));
}

void check_same_device(const char* fn, const char* ref_name, const torch::Tensor& ref,
                       const char* name, const torch::Tensor& other) {
  TORCH_CHECK(ref.device() == other.device(),
              fmt::format("{}: {} must be on the same device as {} ({}), got {}", fn, name,
                          ref_name, ref.device().str(), other.device().str()));
}

void check_same_dtype(const char* fn, const char* ref_name, const torch::Tensor& ref,
                      const char* name, const torch::Tensor& other) {
  TORCH_CHECK(ref.scalar_type() == other.scalar_type(),
              fmt::format("{}: {} must have the same dtype as {} ({}), got {}", fn, name, ref_name,
                          c10::toString(ref.scalar_type()), c10::toString(other.scalar_type())));
}

namespace {

template <typename T>
LengthRange scan_lengths(const char* fn, const char* name, const torch::Tensor& lens) {
  const auto contiguous = lens.contiguous();
  const T* data = contiguous.data_ptr<T>();
  LengthRange range{std::numeric_limits<double>::infinity(), 0, torch::Tensor()};
  for (int64_t i = 0, n = contiguous.numel(); i < n; ++i) {
    const double v = static_cast<double>(data[i]);
    TORCH_CHECK(
        std::floor(v) == v && std::isfinite(v),
        fmt::format("{}: {} must hold whole numbers, got {} at flat index {}", fn, name, v, i));
    TORCH_CHECK(v >= 0,
                fmt::format("{}: {} must hold non-negative lengths, got {} at flat index {}", fn,
                            name, v, i));
    range.shortest = std::min(range.shortest, v);
    range.longest = std::max(range.longest, v);
  }
  return range;
}

}  // namespace

std::optional<LengthRange> check_length_values(const char* fn, const char* name,
                                               const torch::Tensor& lens) {
  const auto dtype = lens.scalar_type();
  TORCH_CHECK((at::isIntegralType(dtype, /*includeBool=*/false) || at::isFloatingType(dtype)),
              fmt::format("{}: {} must have an integer dtype (or a floating-point one holding "
                          "whole numbers), got {}",
                          fn, name, c10::toString(dtype)));
  if (lens.numel() == 0) return std::nullopt;
  if (lens.device().is_cpu()) {
    LengthRange range;
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "d2l::check_length_values",
                               [&] { range = scan_lengths<scalar_t>(fn, name, lens); });
    return range;
  }
  // Off the CPU, a few lengths are copied to the host and scanned there (the
  // call's one synchronisation, and one op); many are reduced on the device
  // and one small copy brings the range and, for floating-point lengths,
  // whether any is fractional or not finite.
  if (lens.numel() <= kHostCopyLimit) {
    auto on_host = lens.to(torch::kCPU);
    auto range = *check_length_values(fn, name, on_host);
    range.on_host = std::move(on_host);
    return range;
  }
  torch::Tensor stats;
  if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    const auto [lo, hi] = torch::aminmax(lens);
    stats = torch::stack({lo, hi}).to(torch::kDouble);
  } else {
    const auto as_double = lens.to(torch::kDouble);
    const auto [lo, hi] = torch::aminmax(as_double);
    stats = torch::stack({lo, hi, (as_double.floor() != as_double).any().to(torch::kDouble)});
  }
  stats = stats.cpu();
  const double* v = stats.data_ptr<double>();
  const bool fractional = stats.numel() > 2 && v[2] != 0;
  if (fractional || v[0] < 0 || !std::isfinite(v[1])) {
    scan_lengths<double>(fn, name, lens.to(torch::kDouble).cpu());
  }
  return LengthRange{v[0], v[1], torch::Tensor()};
}

std::optional<LengthRange> check_valid_lens(const char* fn, const torch::Tensor& valid_lens,
                                            const char* scores_name, const torch::Tensor& scores) {
  if (!valid_lens.defined()) return std::nullopt;
  check_strided_layout(fn, "valid_lens", valid_lens);
  const int64_t batch = scores.size(0);
  const int64_t queries = scores.size(1);
  const bool shape_ok =
      (valid_lens.dim() == 1 && valid_lens.size(0) == batch) ||
      (valid_lens.dim() == 2 && valid_lens.size(0) == batch && valid_lens.size(1) == queries);
  TORCH_CHECK(shape_ok, fmt::format("{}: valid_lens must have shape [{}] or [{}, {}] for {} {}, "
                                    "got {}",
                                    fn, batch, batch, queries, scores_name, shape_of(scores),
                                    shape_of(valid_lens)));
  check_same_device(fn, scores_name, scores, "valid_lens", valid_lens);
  return check_length_values(fn, "valid_lens", valid_lens);
}

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

}  // namespace

std::string unreadable_file_reason(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return {};  // the caller's own open says why
  struct stat st {};
  const bool stated = ::fstat(fd, &st) == 0;
  ::close(fd);
  return !stated || S_ISREG(st.st_mode) ? std::string() : kind_of(st.st_mode);
}

std::string unwritable_file_reason(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // absent: created, or fopen says why not
  if (S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return {};
  if (S_ISFIFO(st.st_mode)) {
    // Opening a FIFO to write waits for a reader; without blocking it fails
    // with ENXIO when there is none.
    const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      ::close(fd);
      return {};
    }
    return errno == ENXIO ? "is a FIFO (named pipe) that no process reads" : std::string();
  }
  return kind_of(st.st_mode);
}

void check_class_labels(const char* fn, const char* name, const torch::Tensor& labels,
                        int64_t classes, const char* classes_from) {
  TORCH_CHECK(labels.defined() && at::isIntegralType(labels.scalar_type(), /*includeBool=*/false),
              fmt::format("{}: {} must hold class labels of an integer dtype, got {} {}", fn, name,
                          labels.defined() ? c10::toString(labels.scalar_type()) : "undefined",
                          shape_of(labels)));
  if (labels.numel() == 0) return;
  const auto flat = labels.reshape({-1});
  const auto [lo, hi] = torch::aminmax(flat);
  if (lo.item<int64_t>() >= 0 && hi.item<int64_t>() < classes) return;
  const auto outside = torch::logical_or(flat < 0, flat >= classes).nonzero();
  const int64_t at = outside[0][0].item<int64_t>();
  TORCH_CHECK(false, fmt::format("{}: {} holds {} at flat index {}, outside the {} classes 0..{} "
                                 "of {} (shape {})",
                                 fn, name, flat[at].item<int64_t>(), at, classes, classes - 1,
                                 classes_from, shape_of(labels)));
}

void check_dropout(const char* fn, double p) {
  TORCH_CHECK(p >= 0 && p <= 1,
              fmt::format("{}: dropout must be a probability in [0, 1], got {}", fn, p));
}

bool cpu_float16_matmul_available() {
  static const bool available = [] {
    try {
      const auto one = torch::ones({1, 1}, torch::kHalf);
      return torch::mm(one, one).item<double>() == 1.0;
    } catch (const c10::Error&) {
      return false;
    }
  }();
  return available;
}

std::optional<LengthRange> check_qkv(const char* fn, const torch::Tensor& queries,
                                     const torch::Tensor& keys, const torch::Tensor& values,
                                     const torch::Tensor& valid_lens) {
  check_floating(fn, "queries", queries, 3);
  check_floating(fn, "keys", keys, 3);
  check_floating(fn, "values", values, 3);
  TORCH_CHECK(queries.size(0) == keys.size(0) && keys.size(0) == values.size(0),
              fmt::format("{}: queries, keys and values must have the same batch size, got "
                          "queries {}, keys {} and values {}",
                          fn, shape_of(queries), shape_of(keys), shape_of(values)));
  TORCH_CHECK(keys.size(1) == values.size(1),
              fmt::format("{}: keys and values must have the same number of key-value pairs, got "
                          "keys {} and values {}",
                          fn, shape_of(keys), shape_of(values)));
  check_same_device(fn, "queries", queries, "keys", keys);
  check_same_device(fn, "queries", queries, "values", values);
  check_same_dtype(fn, "queries", queries, "keys", keys);
  check_same_dtype(fn, "queries", queries, "values", values);
  const auto range = check_valid_lens(fn, valid_lens, "queries", queries);
  TORCH_CHECK(queries.scalar_type() != torch::kHalf || !queries.device().is_cpu() ||
                  cpu_float16_matmul_available(),
              fmt::format("{}: float16 on the CPU needs LibTorch 2.x (this LibTorch has no float16 "
                          "matrix product on the CPU), got float16 queries {}; use bfloat16 or "
                          "float32 on the CPU, or float16 on CUDA",
                          fn, shape_of(queries)));
  return range;
}

}  // namespace d2l::detail
