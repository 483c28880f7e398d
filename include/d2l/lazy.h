#pragma once

// Layers whose input width is read from their first input, as PyTorch's
// nn.LazyLinear and nn.LazyConv2d, which d2l 1.0 builds its layers from
// (docs/editions.md, "Lazy widths").
//
// A lazy layer's parameters exist from construction, as empty (0-element)
// tensors, so named_parameters() has the book's keys at once. They are
// filled in place:
// - by the first forward call, which fixes the width and initialises them as
//   LibTorch's Linear / Conv2d do (PyTorch's reset_parameters);
// - or by d2l::load_state_dict / torch::load, which take the width from the
//   file's tensors (not initialised: the file's values are copied in).
// "In place" means the tensor objects stay the same: an optimizer built
// before the first batch holds the parameters that are then trained. `to`
// before materialising moves the empty tensors, and they are materialised in
// that dtype and on that device. Once fixed, an input of another width is a
// c10::Error. Give `in_features` / `in_channels` in the options for
// parameters at construction.

#include <torch/arg.h>
#include <torch/expanding_array.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace d2l {

/// What d2l::load_state_dict and the checked `load` of every module ask of a
/// lazy layer whose width is not fixed yet. Implemented by LazyLinearImpl and
/// LazyConv2dImpl.
class LazyModule {
 public:
  virtual ~LazyModule() = default;
  /// Whether the parameters still wait for the input width (PyTorch's
  /// has_uninitialized_params()).
  virtual bool has_uninitialized_params() const = 0;
  /// The input width that gives the `weight` the shape `weight_shape`, or
  /// nullopt (with `why` set) when no width does.
  virtual std::optional<int64_t> width_for(torch::IntArrayRef weight_shape,
                                           std::string& why) const = 0;
  /// Allocates the parameters for inputs of `width` in place, uninitialised
  /// (a load fills them next).
  virtual void materialize_uninitialized(int64_t width) = 0;
  /// Undoes materialize_uninitialized after a load that failed its checks.
  virtual void dematerialize() = 0;
  /// Draws the parameters as the first forward would; a no-op while the
  /// width is unknown. A non-strict load that leaves some of a layer's
  /// parameters out of the file draws them so, never leaving them
  /// uninitialised.
  virtual void reset_parameters() = 0;
};

struct LazyLinearOptions {
  /* implicit */ LazyLinearOptions(int64_t out_features) : out_features_(out_features) {}
  /// Width of the output.
  TORCH_ARG(int64_t, out_features);
  /// Whether the layer has a bias.
  TORCH_ARG(bool, bias) = true;
  /// The input width when known: the parameters are made at construction.
  TORCH_ARG(std::optional<int64_t>, in_features) = std::nullopt;
};

/// PyTorch's nn.LazyLinear(out_features, bias=True): y = x Wᵀ + b over the last
/// dimension, W (out_features, in_features) with in_features read from the
/// first input.
class LazyLinearImpl : public torch::nn::Cloneable<LazyLinearImpl>, public LazyModule {
 public:
  explicit LazyLinearImpl(int64_t out_features, bool bias = true);
  explicit LazyLinearImpl(const LazyLinearOptions& options_);

  void reset() override;
  /// Draws the parameters again (kaiming-uniform as nn.Linear); a no-op
  /// while the width is unknown.
  void reset_parameters() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first (the width is taken from the archive).
  void load(torch::serialize::InputArchive& archive) override;
  /// Module::save; c10::Error while the width is unknown (the archive could
  /// not be loaded back).
  void save(torch::serialize::OutputArchive& archive) const override;

  /// input (..., in_features) -> (..., out_features). The first call fixes
  /// in_features to the input's last dimension.
  torch::Tensor forward(const torch::Tensor& input);

  /// Fixes the width and draws the parameters, as the first forward would.
  void materialize(int64_t in_features);
  /// What forward does before multiplying: fixes in_features from `input`'s
  /// last dimension at the first call, and afterwards checks it (a
  /// c10::Error naming `fn`, the argument `name` and its shape). For modules
  /// that pass the weights on to a functional form.
  void ensure_width(const char* fn, const char* name, const torch::Tensor& input);
  /// The input width, once fixed.
  std::optional<int64_t> in_features() const { return width_; }

  bool has_uninitialized_params() const override;
  std::optional<int64_t> width_for(torch::IntArrayRef weight_shape,
                                   std::string& why) const override;
  void materialize_uninitialized(int64_t width) override;
  void dematerialize() override;

  LazyLinearOptions options;
  torch::Tensor weight;
  torch::Tensor bias;

 private:
  std::optional<int64_t> width_;
};
TORCH_MODULE(LazyLinear);

struct LazyConv2dOptions {
  LazyConv2dOptions(int64_t out_channels, torch::ExpandingArray<2> kernel_size)
      : out_channels_(out_channels), kernel_size_(kernel_size) {}
  TORCH_ARG(int64_t, out_channels);
  TORCH_ARG(torch::ExpandingArray<2>, kernel_size);
  TORCH_ARG(torch::ExpandingArray<2>, stride) = 1;
  TORCH_ARG(torch::ExpandingArray<2>, padding) = 0;
  TORCH_ARG(bool, bias) = true;
  /// The input channels when known: the parameters are made at construction.
  TORCH_ARG(std::optional<int64_t>, in_channels) = std::nullopt;
};

/// PyTorch's nn.LazyConv2d(out_channels, kernel_size, stride=1, padding=0,
/// bias=True) (groups and dilation 1, zero padding): weight (out_channels,
/// in_channels, kh, kw) with in_channels read from the first input.
class LazyConv2dImpl : public torch::nn::Cloneable<LazyConv2dImpl>, public LazyModule {
 public:
  LazyConv2dImpl(int64_t out_channels, torch::ExpandingArray<2> kernel_size,
                 torch::ExpandingArray<2> stride = 1);
  explicit LazyConv2dImpl(const LazyConv2dOptions& options_);

  void reset() override;
  void reset_parameters() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;
  /// Module::save; c10::Error while the width is unknown.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// input (B, C, H, W) or (C, H, W) -> (B, out_channels, H', W'). The first
  /// call fixes in_channels to C.
  torch::Tensor forward(const torch::Tensor& input);

  void materialize(int64_t in_channels);
  std::optional<int64_t> in_channels() const { return width_; }

  bool has_uninitialized_params() const override;
  std::optional<int64_t> width_for(torch::IntArrayRef weight_shape,
                                   std::string& why) const override;
  void materialize_uninitialized(int64_t width) override;
  void dematerialize() override;

  LazyConv2dOptions options;
  torch::Tensor weight;
  torch::Tensor bias;

 private:
  std::optional<int64_t> width_;
};
TORCH_MODULE(LazyConv2d);

/// Whether any lazy layer in `module`'s tree still waits for its width.
bool has_uninitialized_params(const torch::nn::Module& module);

}  // namespace d2l
