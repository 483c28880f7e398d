// Lazy layers (include/d2l/lazy.h): parameters that are empty until the
// first input, or a loaded file, gives their width.
//
// Materialising replaces each parameter's data in place (Tensor::set_data,
// as Module::to does), so that the tensor objects an optimizer already holds
// become the trained ones, and keeps their dtype and device, which `to` may
// have changed while they were empty. The first forward calls of a shared
// module may race: one lock serialises materialising.

#include <d2l/lazy.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/conv.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <ostream>
#include <sstream>

#include "checked_load.h"
#include "checks.h"
#include "lazy_internal.h"

namespace d2l {
namespace {

std::mutex& materialize_mutex() {
  static std::mutex m;
  return m;
}

// An empty parameter: the placeholder until the width is known.
torch::Tensor placeholder() { return torch::empty({0}); }

// `t` becomes an uninitialised tensor of `shape`, in place, keeping its dtype
// and device.
void allocate_in_place(torch::Tensor& t, torch::IntArrayRef shape) {
  if (!t.defined()) return;
  torch::NoGradGuard no_grad;
  t.set_data(torch::empty(shape, t.options()));
}

void empty_in_place(torch::Tensor& t) {
  if (!t.defined()) return;
  torch::NoGradGuard no_grad;
  t.set_data(torch::empty({0}, t.options()));
}

// nn.Linear's and nn.Conv2d's reset_parameters: kaiming-uniform weights with
// a = sqrt(5), biases uniform in ±1/sqrt(fan_in).
void kaiming_reset(torch::Tensor& weight, torch::Tensor& bias) {
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void check_width(const char* fn, const char* what, int64_t width) {
  TORCH_CHECK(width > 0, fn, ": ", what, " must be positive, got ", width);
}

// The input's features against the fixed width; the first call fixes it.
template <typename Layer>
void fix_width(Layer& layer, const char* fn, const char* name, const char* what,
               const torch::Tensor& input, int64_t width, std::optional<int64_t> fixed_width) {
  if (fixed_width) {
    const int64_t fixed = *fixed_width;
    TORCH_CHECK(width == fixed,
                fmt::format("{}: {} has {} {} (shape {}), but the layer's input {} were fixed "
                            "at {} by its first input or a loaded state dict",
                            fn, name, width, what, detail::shape_of(input), what, fixed));
    return;
  }
  std::lock_guard<std::mutex> lock(materialize_mutex());
  if (layer.has_uninitialized_params()) layer.materialize(width);
}

// Module::save of a layer still waiting for its width would write empty
// parameters, which no load takes back (the checked load expects the
// width): refused, as save_state_dict refuses, before anything is written.
template <typename Layer>
void check_saveable(const Layer& layer, const char* fn, const char* width) {
  if (!layer.has_uninitialized_params()) return;
  std::ostringstream shown;
  layer.pretty_print(shown);
  TORCH_CHECK(false, fmt::format("{}: {} does not know its {} yet, and an archive saved now could "
                                 "not be loaded back: call forward once (or materialize, or load "
                                 "a state dict) before torch::save",
                                 fn, shown.str(), width));
}

}  // namespace

// ---------------------------------------------------------------------------
// LazyLinear

LazyLinearImpl::LazyLinearImpl(int64_t out_features, bool bias)
    : LazyLinearImpl(LazyLinearOptions(out_features).bias(bias)) {}

LazyLinearImpl::LazyLinearImpl(const LazyLinearOptions& options_) : options(options_) {
  reset();
}

void LazyLinearImpl::reset() {
  const char* fn = "d2l::LazyLinear";
  check_width(fn, "out_features", options.out_features());
  if (options.in_features()) check_width(fn, "in_features", *options.in_features());
  // A clone (Cloneable::clone resets the copy) keeps the width it was copied with.
  const auto width = width_ ? width_ : options.in_features();
  width_.reset();
  weight = register_parameter("weight", placeholder());
  bias = options.bias() ? register_parameter("bias", placeholder())
                        : register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  if (width) materialize(*width);
}

void LazyLinearImpl::reset_parameters() {
  if (has_uninitialized_params()) return;
  kaiming_reset(weight, bias);
}

void LazyLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::LazyLinear(in_features="
         << (width_ ? std::to_string(*width_) : std::string("<lazy>"))
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ")";
}

void LazyLinearImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::LazyLinear::load");
}

void LazyLinearImpl::save(torch::serialize::OutputArchive& archive) const {
  check_saveable(*this, "d2l::LazyLinear::save", "in_features");
  torch::nn::Module::save(archive);
}

torch::Tensor LazyLinearImpl::forward(const torch::Tensor& input) {
  const char* fn = "d2l::LazyLinear::forward";
  // Checked before the width is fixed: a refused call fixes nothing (the
  // empty parameters already have the module's dtype and device).
  TORCH_CHECK(input.defined(), fmt::format("{}: input must be a defined tensor", fn));
  detail::check_same_dtype(fn, "weight", weight, "input", input);
  detail::check_same_device(fn, "weight", weight, "input", input);
  ensure_width(fn, "input", input);
  return torch::nn::functional::linear(input, weight, bias);
}

void LazyLinearImpl::ensure_width(const char* fn, const char* name, const torch::Tensor& input) {
  TORCH_CHECK(input.defined() && input.dim() >= 1,
              fmt::format("{}: {} must have at least one dimension, got {}", fn, name,
                          detail::shape_of(input)));
  detail::check_strided_layout(fn, name, input);
  fix_width(*this, fn, name, "features", input, input.size(-1), width_);
}

void LazyLinearImpl::materialize(int64_t in_features) {
  check_width("d2l::LazyLinear::materialize", "in_features", in_features);
  materialize_uninitialized(in_features);
  reset_parameters();
}

bool LazyLinearImpl::has_uninitialized_params() const { return !width_.has_value(); }

std::optional<int64_t> LazyLinearImpl::width_for(torch::IntArrayRef weight_shape,
                                                 std::string& why) const {
  if (weight_shape.size() != 2 || weight_shape[0] != options.out_features() ||
      weight_shape[1] <= 0) {
    why = fmt::format("a LazyLinear with out_features={} takes a weight of shape [{}, in_features], "
                      "got [{}]",
                      options.out_features(), options.out_features(),
                      fmt::join(weight_shape, ", "));
    return std::nullopt;
  }
  return weight_shape[1];
}

void LazyLinearImpl::materialize_uninitialized(int64_t width) {
  allocate_in_place(weight, {options.out_features(), width});
  allocate_in_place(bias, {options.out_features()});
  width_ = width;
}

void LazyLinearImpl::dematerialize() {
  empty_in_place(weight);
  empty_in_place(bias);
  width_.reset();
}

// ---------------------------------------------------------------------------
// LazyConv2d

LazyConv2dImpl::LazyConv2dImpl(int64_t out_channels, torch::ExpandingArray<2> kernel_size,
                               torch::ExpandingArray<2> stride)
    : LazyConv2dImpl(LazyConv2dOptions(out_channels, kernel_size).stride(stride)) {}

LazyConv2dImpl::LazyConv2dImpl(const LazyConv2dOptions& options_) : options(options_) { reset(); }

void LazyConv2dImpl::reset() {
  const char* fn = "d2l::LazyConv2d";
  check_width(fn, "out_channels", options.out_channels());
  for (int i = 0; i < 2; ++i) {
    check_width(fn, "kernel_size", (*options.kernel_size())[i]);
    check_width(fn, "stride", (*options.stride())[i]);
    TORCH_CHECK((*options.padding())[i] >= 0, fn, ": padding must be non-negative, got ",
                (*options.padding())[i]);
  }
  if (options.in_channels()) check_width(fn, "in_channels", *options.in_channels());
  // A clone (Cloneable::clone resets the copy) keeps the width it was copied with.
  const auto width = width_ ? width_ : options.in_channels();
  width_.reset();
  weight = register_parameter("weight", placeholder());
  bias = options.bias() ? register_parameter("bias", placeholder())
                        : register_parameter("bias", torch::Tensor(), /*requires_grad=*/false);
  if (width) materialize(*width);
}

void LazyConv2dImpl::reset_parameters() {
  if (has_uninitialized_params()) return;
  kaiming_reset(weight, bias);
}

void LazyConv2dImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::LazyConv2d(in_channels="
         << (width_ ? std::to_string(*width_) : std::string("<lazy>"))
         << ", out_channels=" << options.out_channels()
         << ", kernel_size=" << options.kernel_size() << ", stride=" << options.stride();
  if ((*options.padding())[0] != 0 || (*options.padding())[1] != 0) {
    stream << ", padding=" << options.padding();
  }
  stream << ", bias=" << std::boolalpha << options.bias() << ")";
}

void LazyConv2dImpl::load(torch::serialize::InputArchive& archive) {
  detail::checked_load(*this, archive, "d2l::LazyConv2d::load");
}

void LazyConv2dImpl::save(torch::serialize::OutputArchive& archive) const {
  check_saveable(*this, "d2l::LazyConv2d::save", "in_channels");
  torch::nn::Module::save(archive);
}

torch::Tensor LazyConv2dImpl::forward(const torch::Tensor& input) {
  const char* fn = "d2l::LazyConv2d::forward";
  TORCH_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 4),
              fmt::format("{}: input must be (batch, channels, height, width) or (channels, "
                          "height, width), got {}",
                          fn, detail::shape_of(input)));
  detail::check_strided_layout(fn, "input", input);
  const auto& k = *options.kernel_size();
  const auto& p = *options.padding();
  const int64_t h = input.size(-2) + 2 * p[0], w = input.size(-1) + 2 * p[1];
  TORCH_CHECK(h >= k[0] && w >= k[1],
              fmt::format("{}: input {} (padded to {}x{}) is smaller than the kernel {}x{}", fn,
                          detail::shape_of(input), h, w, k[0], k[1]));
  detail::check_same_dtype(fn, "weight", weight, "input", input);
  detail::check_same_device(fn, "weight", weight, "input", input);
  fix_width(*this, fn, "input", "channels", input, input.size(-3), width_);
  return torch::conv2d(input, weight, bias, options.stride(), options.padding());
}

void LazyConv2dImpl::materialize(int64_t in_channels) {
  check_width("d2l::LazyConv2d::materialize", "in_channels", in_channels);
  materialize_uninitialized(in_channels);
  reset_parameters();
}

bool LazyConv2dImpl::has_uninitialized_params() const { return !width_.has_value(); }

std::optional<int64_t> LazyConv2dImpl::width_for(torch::IntArrayRef weight_shape,
                                                 std::string& why) const {
  const auto& k = *options.kernel_size();
  if (weight_shape.size() != 4 || weight_shape[0] != options.out_channels() ||
      weight_shape[1] <= 0 || weight_shape[2] != k[0] || weight_shape[3] != k[1]) {
    why = fmt::format("a LazyConv2d with out_channels={} and kernel {}x{} takes a weight of shape "
                      "[{}, in_channels, {}, {}], got [{}]",
                      options.out_channels(), k[0], k[1], options.out_channels(), k[0], k[1],
                      fmt::join(weight_shape, ", "));
    return std::nullopt;
  }
  return weight_shape[1];
}

void LazyConv2dImpl::materialize_uninitialized(int64_t width) {
  const auto& k = *options.kernel_size();
  allocate_in_place(weight, {options.out_channels(), width, k[0], k[1]});
  allocate_in_place(bias, {options.out_channels()});
  width_ = width;
}

void LazyConv2dImpl::dematerialize() {
  empty_in_place(weight);
  empty_in_place(bias);
  width_.reset();
}

// ---------------------------------------------------------------------------

namespace detail {

LazyCallGuard::LazyCallGuard(torch::nn::Module& module) : uncaught_(std::uncaught_exceptions()) {
  module.apply([this](torch::nn::Module& m) {
    auto* lazy = dynamic_cast<LazyModule*>(&m);
    if (lazy != nullptr && lazy->has_uninitialized_params()) waiting_.push_back(lazy);
  });
  if (!waiting_.empty()) {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    rng_state_ = generator.get_state();
  }
}

LazyCallGuard::~LazyCallGuard() {
  if (waiting_.empty() || std::uncaught_exceptions() <= uncaught_) return;
  bool undone = false;
  {
    std::lock_guard<std::mutex> lock(materialize_mutex());
    for (auto* lazy : waiting_) {
      if (lazy->has_uninitialized_params()) continue;
      lazy->dematerialize();
      undone = true;
    }
  }
  if (undone) {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rng_state_);
  }
}

}  // namespace detail

bool has_uninitialized_params(const torch::nn::Module& module) {
  if (const auto* lazy = dynamic_cast<const LazyModule*>(&module)) {
    if (lazy->has_uninitialized_params()) return true;
  }
  for (const auto& child : module.children()) {
    if (has_uninitialized_params(*child)) return true;
  }
  return false;
}

}  // namespace d2l
