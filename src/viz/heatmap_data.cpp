#include "heatmap_data.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>

#include "svg.h"

namespace d2l::detail::heatmap {
namespace {

// matplotlib's sequential maps are the nine-class ColorBrewer schemes;
// viridis is sampled at nine points. Linear interpolation between them is
// indistinguishable from matplotlib's 256-entry tables at heatmap sizes.
constexpr std::array<Colormap, 5> kColormaps{{
    {"Reds",
     {hex_rgb(0xfff5f0), hex_rgb(0xfee0d2), hex_rgb(0xfcbba1), hex_rgb(0xfc9272), hex_rgb(0xfb6a4a),
      hex_rgb(0xef3b2c), hex_rgb(0xcb181d), hex_rgb(0xa50f15), hex_rgb(0x67000d)}},
    {"Blues",
     {hex_rgb(0xf7fbff), hex_rgb(0xdeebf7), hex_rgb(0xc6dbef), hex_rgb(0x9ecae1), hex_rgb(0x6baed6),
      hex_rgb(0x4292c6), hex_rgb(0x2171b5), hex_rgb(0x08519c), hex_rgb(0x08306b)}},
    {"Greens",
     {hex_rgb(0xf7fcf5), hex_rgb(0xe5f5e0), hex_rgb(0xc7e9c0), hex_rgb(0xa1d99b), hex_rgb(0x74c476),
      hex_rgb(0x41ab5d), hex_rgb(0x238b45), hex_rgb(0x006d2c), hex_rgb(0x00441b)}},
    {"Greys",
     {hex_rgb(0xffffff), hex_rgb(0xf0f0f0), hex_rgb(0xd9d9d9), hex_rgb(0xbdbdbd), hex_rgb(0x969696),
      hex_rgb(0x737373), hex_rgb(0x525252), hex_rgb(0x252525), hex_rgb(0x000000)}},
    {"viridis",
     {hex_rgb(0x440154), hex_rgb(0x472d7b), hex_rgb(0x3b528b), hex_rgb(0x2c728e), hex_rgb(0x21908c),
      hex_rgb(0x27ad81), hex_rgb(0x5dc863), hex_rgb(0xaadc32), hex_rgb(0xfde725)}},
}};

const Colormap& find_colormap(const char* fn, const std::string& name) {
  const auto* map = std::find_if(kColormaps.begin(), kColormaps.end(),
                                 [&](const Colormap& c) { return c.name == name; });
  TORCH_CHECK(map != kColormaps.end(),
              fmt::format("{}: cmap must be one of Reds, Blues, Greens, Greys, viridis, got '{}'",
                          fn, name));
  return *map;
}

std::string shape_of(const torch::Tensor& t) {
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

}  // namespace

std::string hex(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

Rgb sample(const Colormap& map, double t) {
  const double pos = std::clamp(t, 0.0, 1.0) * (map.anchors.size() - 1);
  const auto i = std::min(static_cast<size_t>(pos), map.anchors.size() - 2);
  const double f = pos - i;
  const Rgb a = map.anchors[i];
  const Rgb b = map.anchors[i + 1];
  const auto mix = [f](int x, int y) { return static_cast<int>(std::lround(x + (y - x) * f)); };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

const Colormap& check_arguments(const char* fn, const torch::Tensor& matrices,
                                const HeatmapOptions& options) {
  TORCH_CHECK(matrices.defined(), fmt::format("{}: matrices must be a defined tensor", fn));
  TORCH_CHECK(matrices.dim() == 4,
              fmt::format("{}: matrices must be a 4-D tensor (num_rows, num_cols, height, width), "
                          "got {}",
                          fn, shape_of(matrices)));
  const auto dtype = matrices.scalar_type();
  TORCH_CHECK(at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/false),
              fmt::format("{}: matrices must have a real (floating-point or integer) dtype, got {}",
                          fn, c10::toString(dtype)));
  TORCH_CHECK(matrices.numel() > 0,
              fmt::format("{}: matrices must not be empty, got {}", fn, shape_of(matrices)));
  const auto& titles = options.titles();
  TORCH_CHECK(
      titles.empty() || static_cast<int64_t>(titles.size()) == matrices.size(1),
      fmt::format("{}: titles has {} entries for {} columns", fn, titles.size(), matrices.size(1)));
  const auto check_labels = [&](const char* name, const std::vector<std::string>& labels,
                                int64_t expected, const char* what) {
    TORCH_CHECK(labels.empty() || static_cast<int64_t>(labels.size()) == expected,
                fmt::format("{}: {} has {} entries for matrices {} with {} {}", fn, name,
                            labels.size(), shape_of(matrices), expected, what));
  };
  check_labels("xticklabels", options.xticklabels(), matrices.size(3), "columns");
  check_labels("yticklabels", options.yticklabels(), matrices.size(2), "rows");
  check_figsize(fn, options.figsize().first, options.figsize().second);
  return find_colormap(fn, options.cmap());
}

Matrices read(const torch::Tensor& matrices) {
  auto storage = matrices.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const double* data = storage.data_ptr<double>();
  return {std::move(storage), data, matrices.size(0), matrices.size(1), matrices.size(2),
          matrices.size(3)};
}

Scale make_scale(const Matrices& m) {
  Scale s;
  s.data_lo = std::numeric_limits<double>::infinity();
  s.data_hi = -s.data_lo;
  for (int64_t k = 0, n = m.numel(); k < n; ++k) {
    const double v = m.data[k];
    s.any_nan = s.any_nan || std::isnan(v);
    if (!std::isfinite(v)) continue;
    s.any_finite = true;
    s.data_lo = std::min(s.data_lo, v);
    s.data_hi = std::max(s.data_hi, v);
  }
  if (!s.any_finite) s.data_lo = s.data_hi = 0;
  s.lo = s.data_lo;
  s.hi = s.data_hi;
  if (s.hi == s.lo) {
    s.lo -= 0.5;
    s.hi += 0.5;
  }
  // Far from zero ±0.5 vanishes in rounding (a constant 1e30 left a zero span:
  // NaN fractions), and a narrow range such as 1e17 .. 1e17 + 16 would count
  // colour-bar ticks beyond double's integers: keep the span at least a
  // billionth of the values' magnitude, within the finite doubles. A span of
  // subnormals (-5e-324 .. 5e-324) halves to zero: keep at least 1e-300, so
  // the colour bar's tick exponent is finite.
  const double least = std::max(std::max(std::abs(s.lo), std::abs(s.hi)) * 1e-9, 1e-300);
  const double widen = least - s.half_span();
  if (widen > 0) {
    s.lo = std::max(s.lo - widen, std::numeric_limits<double>::lowest());
    s.hi = std::min(s.hi + widen, std::numeric_limits<double>::max());
  }
  return s;
}

}  // namespace d2l::detail::heatmap
