#pragma once

// What the SVG and the terminal renderings of a heatmap share: the checked
// input read once as float64, the colour maps, and the one colour scale of all
// panels.

#include <d2l/viz/heatmap.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace d2l::detail::heatmap {

struct Rgb {
  int r, g, b;
};

constexpr Rgb hex_rgb(std::uint32_t v) {
  return {static_cast<int>(v >> 16 & 0xff), static_cast<int>(v >> 8 & 0xff),
          static_cast<int>(v & 0xff)};
}

/// As "#rrggbb".
std::string hex(Rgb c);

struct Colormap {
  std::string_view name;
  std::array<Rgb, 9> anchors;  // evenly spaced, lowest value first
};

// NaN cells get a grey base under a darker hatch in SVG, so they stand out
// even on "Greys"; a terminal has no hatching and shows the base alone.
constexpr Rgb kNanBase = hex_rgb(0xd9d9d9);

/// `t` in [0, 1] (clamped) mapped through the anchors.
Rgb sample(const Colormap& map, double t);

/// The input read once as contiguous float64 on the CPU.
struct Matrices {
  torch::Tensor storage;
  const double* data;
  int64_t rows, cols, height, width;

  double at(int64_t r, int64_t c, int64_t i, int64_t j) const {
    return data[((r * cols + c) * height + i) * width + j];
  }
  int64_t numel() const { return rows * cols * height * width; }
};

/// The colour map, once the arguments have passed every check; `fn` is the
/// public function named in the error messages.
const Colormap& check_arguments(const char* fn, const torch::Tensor& matrices,
                                const HeatmapOptions& options);

Matrices read(const torch::Tensor& matrices);

/// The shared colour scale: the finite values' range, widened to a span of 1
/// around a constant so that every value maps to a fraction without dividing
/// by zero.
struct Scale {
  double lo = 0, hi = 0;            // the colour map's ends
  double data_lo = 0, data_hi = 0;  // the finite values' range
  bool any_finite = false;
  bool any_nan = false;

  // Halved, because hi - lo overflows for a range like -1e308 .. 1e308.
  double half_span() const { return hi / 2 - lo / 2; }
  double fraction(double v) const { return std::clamp((v / 2 - lo / 2) / half_span(), 0.0, 1.0); }
};

Scale make_scale(const Matrices& m);

}  // namespace d2l::detail::heatmap
