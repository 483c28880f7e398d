#include <d2l/heatmap.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string_view>

#include "checks.h"
#include "xml.h"

namespace d2l {
namespace {

using Buffer = fmt::memory_buffer;

struct Rgb {
  int r, g, b;
};

constexpr Rgb hex_rgb(std::uint32_t v) {
  return {static_cast<int>(v >> 16 & 0xff), static_cast<int>(v >> 8 & 0xff),
          static_cast<int>(v & 0xff)};
}

std::string hex(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

struct Colormap {
  std::string_view name;
  std::array<Rgb, 9> anchors;  // evenly spaced, lowest value first
};

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

// NaN cells get a grey base under a darker hatch in SVG, so they stand out
// even on "Greys"; a terminal has no hatching and shows the base alone.
constexpr Rgb kNanBase = hex_rgb(0xd9d9d9);
constexpr Rgb kNanHatch = hex_rgb(0x808080);
constexpr std::string_view kNanPatternId = "d2l-heatmap-nan";

const Colormap& find_colormap(const char* fn, const std::string& name) {
  const auto* map = std::find_if(kColormaps.begin(), kColormaps.end(),
                                 [&](const Colormap& c) { return c.name == name; });
  TORCH_CHECK(map != kColormaps.end(),
              fmt::format("{}: cmap must be one of Reds, Blues, Greens, Greys, viridis, got '{}'",
                          fn, name));
  return *map;
}

/// `t` in [0, 1] (clamped) mapped through the anchors.
Rgb sample(const Colormap& map, double t) {
  const double pos = std::clamp(t, 0.0, 1.0) * (map.anchors.size() - 1);
  const auto i = std::min(static_cast<size_t>(pos), map.anchors.size() - 2);
  const double f = pos - i;
  const Rgb a = map.anchors[i];
  const Rgb b = map.anchors[i + 1];
  const auto mix = [f](int x, int y) { return static_cast<int>(std::lround(x + (y - x) * f)); };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

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

/// The colour map, once the arguments have passed every check.
const Colormap& check_arguments(const char* fn, const torch::Tensor& matrices,
                                const HeatmapOptions& options) {
  TORCH_CHECK(matrices.defined(), fmt::format("{}: matrices must be a defined tensor", fn));
  TORCH_CHECK(matrices.dim() == 4,
              fmt::format("{}: matrices must be a 4-D tensor (num_rows, num_cols, height, width), "
                          "got {}",
                          fn, detail::shape_of(matrices)));
  const auto dtype = matrices.scalar_type();
  TORCH_CHECK(at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/false),
              fmt::format("{}: matrices must have a real (floating-point or integer) dtype, got {}",
                          fn, c10::toString(dtype)));
  TORCH_CHECK(matrices.numel() > 0, fmt::format("{}: matrices must not be empty, got {}", fn,
                                                detail::shape_of(matrices)));
  const auto& titles = options.titles();
  TORCH_CHECK(
      titles.empty() || static_cast<int64_t>(titles.size()) == matrices.size(1),
      fmt::format("{}: titles has {} entries for {} columns", fn, titles.size(), matrices.size(1)));
  const auto [fig_w, fig_h] = options.figsize();
  TORCH_CHECK(
      fig_w > 0 && fig_h > 0 && std::isfinite(fig_w) && std::isfinite(fig_h),
      fmt::format("{}: figsize must be positive and finite, got ({}, {})", fn, fig_w, fig_h));
  return find_colormap(fn, options.cmap());
}

Matrices read(const torch::Tensor& matrices) {
  auto storage = matrices.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const double* data = storage.data_ptr<double>();
  return {std::move(storage), data, matrices.size(0), matrices.size(1), matrices.size(2),
          matrices.size(3)};
}

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
  // billionth of the values' magnitude, within the finite doubles.
  const double widen = std::max(std::abs(s.lo), std::abs(s.hi)) * 1e-9 - s.half_span();
  if (widen > 0) {
    s.lo = std::max(s.lo - widen, std::numeric_limits<double>::lowest());
    s.hi = std::min(s.hi + widen, std::numeric_limits<double>::max());
  }
  return s;
}


// Sizes in SVG user units (points).
constexpr double kPointsPerInch = 72;
constexpr double kMargin = 6;
constexpr double kTickFont = 9;
constexpr double kLabelFont = 10;
constexpr double kTitleFont = 11;
constexpr double kDigitWidth = 0.64;  // DejaVu Sans digits, in ems
constexpr double kTickLength = 3.5;
constexpr double kTickPad = 2.5;
constexpr double kLineWidth = 0.8;
constexpr double kColGap = 14;
constexpr double kRowGap = 10;
constexpr double kColorbarGap = 16;
constexpr double kColorbarMinHeight = 72;
constexpr int kMaxTicks = 10;
constexpr double kMinPanelFraction = 0.2;

/// Width of a numeric label, wide enough for any digits.
double number_width(std::string_view label, double font) {
  return static_cast<double>(label.size()) * kDigitWidth * font;
}

/// Step between integer tick labels of an axis of `n` cells of `cell` units:
/// the smallest of 1, 2, 5, 10, 20, ... giving at most kMaxTicks labels that
/// are at least `spacing` units apart.
int64_t tick_step(int64_t n, double cell, double spacing) {
  for (int64_t base = 1;; base *= 10) {
    for (const int64_t m : {1, 2, 5}) {
      const int64_t step = base * m;
      if ((n + step - 1) / step <= kMaxTicks && step * cell >= spacing) return step;
      if (step >= n) return step;
    }
  }
}

struct Tick {
  double value;
  std::string label;
};

std::string format_tick(double v, int exponent, double largest, bool two_and_a_half) {
  // Decimals as matplotlib prints them (0.10 beside 0.12); scientific
  // notation with enough digits to tell neighbours apart when fixed-point
  // would be long, so a narrow range far from zero does not read 1e+06 five
  // times.
  const int decimals = std::max(0, -exponent + (two_and_a_half ? 1 : 0));
  if (largest < 1e7 && decimals <= 6) return fmt::format("{:.{}f}", v, decimals);
  const int digits = std::max(1, static_cast<int>(std::floor(std::log10(largest))) - exponent + 1 +
                                     (two_and_a_half ? 1 : 0));
  return fmt::format("{:.{}g}", v, digits);
}

/// Round colour-bar values: the multiples of the smallest "nice" step
/// (1, 2, 2.5 or 5 times a power of ten) that leaves at most five of them in
/// [lo, hi]. Each step is at most twice the one before, so at least three
/// remain.
std::vector<Tick> colorbar_ticks(const Scale& scale) {
  const double lo = scale.lo, hi = scale.hi;
  const double slack = scale.half_span() * 2e-9;
  const double magnitude = std::floor(std::log10(scale.half_span()) + std::log10(2.0));
  for (int e = static_cast<int>(magnitude) - 1;; ++e) {
    for (const double m : {1.0, 2.0, 2.5, 5.0}) {
      const double step = m * std::pow(10.0, e);
      const double first = std::ceil((lo - slack) / step);
      const double last = std::floor((hi + slack) / step);
      if (last - first + 1 > 5) continue;
      const double largest = std::max(std::abs(first), std::abs(last)) * step;
      std::vector<Tick> ticks;
      for (double k = first; k <= last; ++k) {
        const double v = k * step + 0.0;  // + 0.0 turns -0 into 0
        ticks.push_back({v, format_tick(v, e, largest, m == 2.5)});
      }
      return ticks;
    }
  }
}

/// Where everything goes, in user units.
struct Layout {
  double cell_w = 0, cell_h = 0;
  double panel_w = 0, panel_h = 0;
  double left = 0, top = 0;  // first panel's top-left corner
  double bar_x = 0, bar_y = 0, bar_w = 0, bar_h = 0;
  double width = 0, height = 0;
  int64_t x_step = 1, y_step = 1;
  std::vector<Tick> bar_ticks;

  double panel_x(int64_t c) const { return left + c * (panel_w + kColGap); }
  double panel_y(int64_t r) const { return top + r * (panel_h + kRowGap); }
  // Baselines below a panel's bottom edge.
  static double xtick_baseline() { return kTickLength + kTickPad + 0.76 * kTickFont; }
  static double xlabel_baseline() {
    return xtick_baseline() + 0.24 * kTickFont + 3 + 0.76 * kLabelFont;
  }
  // Right edge of the y tick labels, left of a panel.
  static double ytick_right() { return -(kTickLength + kTickPad); }
};

Layout make_layout(const Matrices& m, const Scale& scale, const HeatmapOptions& options) {
  Layout l;
  const auto [fig_w, fig_h] = options.figsize();
  // Square cells, as matplotlib's imshow draws them, in a figsize box; but a
  // 1 x 200 matrix would be a hairline, so no side shrinks below a fifth.
  const double box_w = fig_w * kPointsPerInch, box_h = fig_h * kPointsPerInch;
  const double square = std::min(box_w / m.width, box_h / m.height);
  l.panel_w = std::max(square * m.width, kMinPanelFraction * box_w);
  l.panel_h = std::max(square * m.height, kMinPanelFraction * box_h);
  l.cell_w = l.panel_w / m.width;
  l.cell_h = l.panel_h / m.height;
  const double ytick_w = number_width(std::to_string(m.height - 1), kTickFont);
  l.x_step = tick_step(m.width, l.cell_w, number_width(std::to_string(m.width - 1), kTickFont) + 4);
  l.y_step = tick_step(m.height, l.cell_h, kTickFont + 1);

  l.left =
      kMargin + (options.ylabel().empty() ? 0 : kLabelFont + 4) + ytick_w + kTickLength + kTickPad;
  l.top = kMargin + (options.titles().empty() ? 0 : kTitleFont + 6);
  const double grid_w = m.cols * l.panel_w + (m.cols - 1) * kColGap;
  const double grid_h = m.rows * l.panel_h + (m.rows - 1) * kRowGap;
  const double below =
      options.xlabel().empty() ? Layout::xtick_baseline() : Layout::xlabel_baseline();

  // matplotlib's colorbar(shrink=0.6), but tall enough for its labels.
  l.bar_h = std::max(0.6 * grid_h, kColorbarMinHeight);
  l.bar_w = std::clamp(l.bar_h / 16, 7.0, 14.0);
  l.bar_x = l.left + grid_w + kColorbarGap;
  l.bar_y = l.top + (grid_h - l.bar_h) / 2;
  const double bar_min_y = kMargin + kTickFont / 2;
  if (l.bar_y < bar_min_y) {
    l.top += bar_min_y - l.bar_y;
    l.bar_y = bar_min_y;
  }
  l.bar_ticks = colorbar_ticks(scale);
  double label_w = 0;
  for (const auto& tick : l.bar_ticks) {
    label_w = std::max(label_w, number_width(tick.label, kTickFont));
  }

  l.width = l.bar_x + l.bar_w + kTickLength + kTickPad + label_w + kMargin;
  l.height = std::max(l.top + grid_h + below + 0.24 * kLabelFont + kMargin,
                      l.bar_y + l.bar_h + kTickFont / 2 + kMargin);
  return l;
}

void append_defs(Buffer& out, const Colormap& map, const Scale& scale) {
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "<defs>\n<linearGradient id=\"d2l-heatmap-{}\" x1=\"0\" y1=\"1\" x2=\"0\" "
                 "y2=\"0\">\n",
                 map.name);
  for (size_t k = 0; k < map.anchors.size(); ++k) {
    fmt::format_to(it, "<stop offset=\"{:g}\" stop-color=\"{}\"/>\n",
                   static_cast<double>(k) / (map.anchors.size() - 1), hex(map.anchors[k]));
  }
  fmt::format_to(it, "</linearGradient>\n");
  if (scale.any_nan) {
    fmt::format_to(it,
                   "<pattern id=\"{}\" width=\"4\" height=\"4\" patternUnits=\"userSpaceOnUse\" "
                   "patternTransform=\"rotate(45)\">\n<rect width=\"4\" height=\"4\" "
                   "fill=\"{}\"/>\n<path d=\"M1 0V4\" stroke=\"{}\" stroke-width=\"1.2\"/>\n"
                   "</pattern>\n",
                   kNanPatternId, hex(kNanBase), hex(kNanHatch));
  }
  fmt::format_to(it, "</defs>\n");
}

/// Cell edges rounded once, so that neighbouring cells share them exactly.
double edge(int64_t k, double cell) { return std::round(k * cell * 100) / 100; }

void append_cells(Buffer& out, const Matrices& m, int64_t r, int64_t c, const Layout& l,
                  const Colormap& map, const Scale& scale) {
  auto it = std::back_inserter(out);
  // crispEdges keeps anti-aliasing from drawing seams between cells.
  fmt::format_to(it, "<g class=\"cells\" shape-rendering=\"crispEdges\">\n");
  const std::string nan_fill = fmt::format("url(#{})", kNanPatternId);
  for (int64_t i = 0; i < m.height; ++i) {
    const double y0 = edge(i, l.cell_h), y1 = edge(i + 1, l.cell_h);
    for (int64_t j = 0; j < m.width; ++j) {
      const double x0 = edge(j, l.cell_w), x1 = edge(j + 1, l.cell_w);
      const double v = m.at(r, c, i, j);
      const std::string fill = std::isnan(v) ? nan_fill : hex(sample(map, scale.fraction(v)));
      fmt::format_to(it,
                     "<rect class=\"cell\" x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" "
                     "height=\"{:.2f}\" fill=\"{}\"><title>row {}, col {}: {:.6g}</title></rect>\n",
                     x0, y0, x1 - x0, y1 - y0, fill, i, j, v);
    }
  }
  fmt::format_to(it, "</g>\n");
}

/// Tick marks on the left and bottom edges of every panel; labels only where
/// matplotlib's sharex/sharey keeps them (first column, bottom row).
void append_axes(Buffer& out, const Matrices& m, const Layout& l, bool y_labels, bool x_labels) {
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "<rect class=\"frame\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"none\" "
                 "stroke=\"#000\" stroke-width=\"{}\"/>\n<path class=\"ticks\" d=\"",
                 edge(m.width, l.cell_w), edge(m.height, l.cell_h), kLineWidth);
  for (int64_t i = 0; i < m.height; i += l.y_step) {
    fmt::format_to(it, "M0 {:.2f}h{} ", (i + 0.5) * l.cell_h, -kTickLength);
  }
  for (int64_t j = 0; j < m.width; j += l.x_step) {
    fmt::format_to(it, "M{:.2f} {:.2f}v{} ", (j + 0.5) * l.cell_w, l.panel_h, kTickLength);
  }
  fmt::format_to(it, "\" stroke=\"#000\" stroke-width=\"{}\"/>\n", kLineWidth);
  if (y_labels) {
    fmt::format_to(it, "<g class=\"yticks\" text-anchor=\"end\">\n");
    for (int64_t i = 0; i < m.height; i += l.y_step) {
      fmt::format_to(it, "<text x=\"{:.2f}\" y=\"{:.2f}\" dy=\"0.35em\">{}</text>\n",
                     Layout::ytick_right(), (i + 0.5) * l.cell_h, i);
    }
    fmt::format_to(it, "</g>\n");
  }
  if (x_labels) {
    fmt::format_to(it, "<g class=\"xticks\" text-anchor=\"middle\">\n");
    for (int64_t j = 0; j < m.width; j += l.x_step) {
      fmt::format_to(it, "<text x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n", (j + 0.5) * l.cell_w,
                     l.panel_h + Layout::xtick_baseline(), j);
    }
    fmt::format_to(it, "</g>\n");
  }
}

void append_labels(Buffer& out, const Matrices& m, int64_t r, int64_t c, const Layout& l,
                   const HeatmapOptions& options) {
  auto it = std::back_inserter(out);
  if (r == 0 && !options.titles().empty()) {
    fmt::format_to(it,
                   "<text class=\"title\" x=\"{:.2f}\" y=\"-6\" text-anchor=\"middle\" "
                   "font-size=\"{}\">{}</text>\n",
                   l.panel_w / 2, kTitleFont, detail::xml_escape(options.titles()[c]));
  }
  if (r == m.rows - 1 && !options.xlabel().empty()) {
    fmt::format_to(it,
                   "<text class=\"xlabel\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" "
                   "font-size=\"{}\">{}</text>\n",
                   l.panel_w / 2, l.panel_h + Layout::xlabel_baseline(), kLabelFont,
                   detail::xml_escape(options.xlabel()));
  }
  if (c == 0 && !options.ylabel().empty()) {
    // Rotated, the baseline is the right edge of the text: keep it clear of
    // the widest y tick label.
    const double x =
        Layout::ytick_right() - number_width(std::to_string(m.height - 1), kTickFont) - 4;
    fmt::format_to(it,
                   "<text class=\"ylabel\" transform=\"translate({:.2f} {:.2f}) rotate(-90)\" "
                   "text-anchor=\"middle\" font-size=\"{}\">{}</text>\n",
                   x, l.panel_h / 2, kLabelFont, detail::xml_escape(options.ylabel()));
  }
}

void append_panel(Buffer& out, const Matrices& m, int64_t r, int64_t c, const Layout& l,
                  const Colormap& map, const Scale& scale, const HeatmapOptions& options) {
  fmt::format_to(std::back_inserter(out),
                 "<g class=\"panel\" transform=\"translate({:.2f} {:.2f})\">\n", l.panel_x(c),
                 l.panel_y(r));
  append_cells(out, m, r, c, l, map, scale);
  append_axes(out, m, l, c == 0, r == m.rows - 1);
  append_labels(out, m, r, c, l, options);
  fmt::format_to(std::back_inserter(out), "</g>\n");
}

void append_colorbar(Buffer& out, const Layout& l, const Colormap& map, const Scale& scale) {
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "<g class=\"colorbar\" transform=\"translate({:.2f} {:.2f})\">\n"
                 "<rect class=\"colorbar\" width=\"{:.2f}\" height=\"{:.2f}\" "
                 "fill=\"url(#d2l-heatmap-{})\" stroke=\"#000\" stroke-width=\"{}\"/>\n",
                 l.bar_x, l.bar_y, l.bar_w, l.bar_h, map.name, kLineWidth);
  const auto y = [&](double v) { return l.bar_h * (1 - scale.fraction(v)); };
  fmt::format_to(it, "<path class=\"ticks\" d=\"");
  for (const auto& tick : l.bar_ticks) {
    fmt::format_to(it, "M{:.2f} {:.2f}h{} ", l.bar_w, y(tick.value), kTickLength);
  }
  fmt::format_to(it, "\" stroke=\"#000\" stroke-width=\"{}\"/>\n<g class=\"cbticks\">\n",
                 kLineWidth);
  for (const auto& tick : l.bar_ticks) {
    fmt::format_to(it, "<text x=\"{:.2f}\" y=\"{:.2f}\" dy=\"0.35em\">{}</text>\n",
                   l.bar_w + kTickLength + kTickPad, y(tick.value), tick.label);
  }
  fmt::format_to(it, "</g>\n</g>\n");
}

std::string render_svg(const char* fn, const torch::Tensor& matrices,
                       const HeatmapOptions& options) {
  const Colormap& map = check_arguments(fn, matrices, options);
  const Matrices m = read(matrices);
  const Scale scale = make_scale(m);
  const Layout l = make_layout(m, scale, options);

  Buffer out;
  fmt::format_to(std::back_inserter(out),
                 "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0:.2f}pt\" "
                 "height=\"{1:.2f}pt\" viewBox=\"0 0 {0:.2f} {1:.2f}\" "
                 "font-family=\"DejaVu Sans, Bitstream Vera Sans, Arial, Helvetica, sans-serif\" "
                 "font-size=\"{2}\">\n"
                 "<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n",
                 l.width, l.height, kTickFont);
  append_defs(out, map, scale);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) append_panel(out, m, r, c, l, map, scale, options);
  }
  append_colorbar(out, l, map, scale);
  fmt::format_to(std::back_inserter(out), "</svg>\n");
  return fmt::to_string(out);
}

constexpr std::string_view kReset = "\x1b[0m";

void append_background(Buffer& out, Rgb c, std::string_view text) {
  fmt::format_to(std::back_inserter(out), "\x1b[48;2;{};{};{}m{}", c.r, c.g, c.b, text);
}

/// `text` cut or padded to `width` terminal columns, one per code point.
std::string fit(std::string_view text, size_t width) {
  const auto starts = [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; };
  const auto columns = static_cast<size_t>(std::count_if(text.begin(), text.end(), starts));
  if (columns <= width) return std::string(text) + std::string(width - columns, ' ');
  size_t kept = 0, end = 0;
  for (; end < text.size(); ++end) {
    if (starts(text[end]) && kept++ == width - 1) break;
  }
  return std::string(text.substr(0, end)) + "…";
}

void append_ansi_rows(Buffer& out, const Matrices& m, int64_t r, const Colormap& map,
                      const Scale& scale) {
  for (int64_t i = 0; i < m.height; ++i) {
    for (int64_t c = 0; c < m.cols; ++c) {
      if (c > 0) out.append(std::string_view("  "));
      for (int64_t j = 0; j < m.width; ++j) {
        const double v = m.at(r, c, i, j);
        append_background(out, std::isnan(v) ? kNanBase : sample(map, scale.fraction(v)), "  ");
      }
      // Reset before the gap so that it keeps the terminal's background.
      out.append(kReset);
    }
    out.push_back('\n');
  }
}

void append_ansi_legend(Buffer& out, const Colormap& map, const Scale& scale) {
  constexpr int kRampSteps = 8;
  fmt::format_to(std::back_inserter(out), "{} ", map.name);
  for (int k = 0; k < kRampSteps; ++k) {
    append_background(out, sample(map, static_cast<double>(k) / (kRampSteps - 1)), " ");
  }
  out.append(kReset);
  if (scale.any_finite) {
    fmt::format_to(std::back_inserter(out), " {:.4g} … {:.4g}", scale.data_lo, scale.data_hi);
  } else {
    fmt::format_to(std::back_inserter(out), " no finite values");
  }
  if (scale.any_nan) {
    out.append(std::string_view("  NaN "));
    append_background(out, kNanBase, "  ");
    out.append(kReset);
  }
  out.push_back('\n');
}

std::string render_ansi(const char* fn, const torch::Tensor& matrices,
                        const HeatmapOptions& options) {
  const Colormap& map = check_arguments(fn, matrices, options);
  const Matrices m = read(matrices);
  const Scale scale = make_scale(m);

  Buffer out;
  auto it = std::back_inserter(out);
  if (!options.ylabel().empty()) fmt::format_to(it, "rows: {}\n", options.ylabel());
  if (!options.xlabel().empty()) fmt::format_to(it, "columns: {}\n", options.xlabel());
  if (!options.titles().empty()) {
    for (int64_t c = 0; c < m.cols; ++c) {
      fmt::format_to(it, "{}{}", c > 0 ? "  " : "",
                     fit(options.titles()[c], static_cast<size_t>(2 * m.width)));
    }
    out.push_back('\n');
  }
  for (int64_t r = 0; r < m.rows; ++r) {
    if (r > 0) out.push_back('\n');
    append_ansi_rows(out, m, r, map, scale);
  }
  append_ansi_legend(out, map, scale);
  return fmt::to_string(out);
}

}  // namespace

std::string heatmaps_svg(const torch::Tensor& matrices, const HeatmapOptions& options) {
  return render_svg("d2l::heatmaps_svg", matrices, options);
}

std::string heatmaps_ansi(const torch::Tensor& matrices, const HeatmapOptions& options) {
  return render_ansi("d2l::heatmaps_ansi", matrices, options);
}

void show_heatmaps(const torch::Tensor& matrices, const std::string& xlabel,
                   const std::string& ylabel, const std::string& path,
                   const std::vector<std::string>& titles, std::pair<double, double> figsize,
                   const std::string& cmap) {
  constexpr const char* fn = "d2l::show_heatmaps";
  const auto options =
      HeatmapOptions().xlabel(xlabel).ylabel(ylabel).titles(titles).figsize(figsize).cmap(cmap);
  // Render first: bad input must not leave an empty file behind.
  const std::string svg = render_svg(fn, matrices, options);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(file.is_open(),
              fmt::format("{}: cannot open '{}' for writing: {}", fn, path, std::strerror(errno)));
  file.write(svg.data(), static_cast<std::streamsize>(svg.size()));
  file.close();
  TORCH_CHECK(!file.fail(), fmt::format("{}: failed to write '{}'", fn, path));
}

}  // namespace d2l
