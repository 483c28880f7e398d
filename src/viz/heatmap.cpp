// heatmaps_svg and show_heatmaps: the book's show_heatmaps as an SVG
// document. heatmap_ansi.cpp draws the same grid for a terminal.

#include <d2l/viz/heatmap.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "heatmap_data.h"
#include "svg.h"

namespace d2l {
namespace {

using namespace detail;
using namespace detail::heatmap;
using Buffer = fmt::memory_buffer;

// A darker hatch over kNanBase marks NaN cells.
constexpr Rgb kNanHatch = hex_rgb(0x808080);
constexpr std::string_view kNanPatternId = "d2l-heatmap-nan";

// Sizes in SVG user units (points), beyond those of svg.h.
constexpr double kMargin = 6;
constexpr double kTickPad = 2.5;
constexpr double kColGap = 14;
constexpr double kRowGap = 10;
constexpr double kColorbarGap = 16;
constexpr double kColorbarMinHeight = 72;
constexpr int kMaxTicks = 10;
constexpr double kMinPanelFraction = 0.2;

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
  // The tick labels' text: the options' labels, or the indices.
  std::vector<std::string> x_text, y_text;
  bool x_upright = false;  // labels given for the columns: written bottom to top
  double xtick_h = 0;      // height of the x tick labels below the ticks
  double ytick_w = 0;      // width of the widest y tick label

  double panel_x(int64_t c) const { return left + c * (panel_w + kColGap); }
  double panel_y(int64_t r) const { return top + r * (panel_h + kRowGap); }
  // Baselines below a panel's bottom edge.
  double xtick_baseline() const { return kTickLength + kTickPad + 0.76 * kTickFont; }
  double xlabel_baseline() const {
    return kTickLength + kTickPad + xtick_h + 3 + 0.76 * kLabelFont;
  }
  // Right edge of the y tick labels, left of a panel.
  static double ytick_right() { return -(kTickLength + kTickPad); }
};

// The labels of `n` cells: `given`, or the indices 0 .. n-1.
std::vector<std::string> tick_text(const std::vector<std::string>& given, int64_t n) {
  if (!given.empty()) return given;
  std::vector<std::string> text;
  for (int64_t k = 0; k < n; ++k) text.push_back(std::to_string(k));
  return text;
}

// The width of the widest of every `step`-th label.
double widest(const std::vector<std::string>& labels, int64_t step) {
  double w = 0;
  for (size_t k = 0; k < labels.size(); k += step) w = std::max(w, text_width(labels[k], kTickFont));
  return w;
}

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
  l.x_text = tick_text(options.xticklabels(), m.width);
  l.y_text = tick_text(options.yticklabels(), m.height);
  l.x_upright = !options.xticklabels().empty();
  // Upright labels stand one font height apart; indices need their width.
  l.x_step = tick_step(m.width, l.cell_w,
                       l.x_upright ? kTickFont + 1
                                   : number_width(std::to_string(m.width - 1), kTickFont) + 4);
  l.y_step = tick_step(m.height, l.cell_h, kTickFont + 1);
  l.ytick_w = options.yticklabels().empty()
                  ? number_width(std::to_string(m.height - 1), kTickFont)
                  : widest(l.y_text, l.y_step);
  l.xtick_h = l.x_upright ? widest(l.x_text, l.x_step) : kTickFont;

  l.left =
      kMargin + (options.ylabel().empty() ? 0 : kLabelFont + 4) + l.ytick_w + kTickLength + kTickPad;
  l.top = kMargin + (options.titles().empty() ? 0 : kTitleFont + 6);
  const double grid_w = m.cols * l.panel_w + (m.cols - 1) * kColGap;
  const double grid_h = m.rows * l.panel_h + (m.rows - 1) * kRowGap;
  const double below = !options.xlabel().empty() ? l.xlabel_baseline()
                       : l.x_upright             ? kTickLength + kTickPad + l.xtick_h
                                                 : l.xtick_baseline();

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

/// A cell's value for its tooltip: words for the non-finite values, so that
/// no "nan" or "inf" token is written where numbers are.
std::string value_text(double v) {
  if (std::isnan(v)) return "not a number";
  if (std::isinf(v)) return v > 0 ? "infinity" : "-infinity";
  return fmt::format("{:.6g}", v);
}

/// Cell edges rounded once, so that neighbouring cells share them exactly.
double edge(int64_t k, double cell) { return written_coordinate(k * cell); }

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
                     "height=\"{:.2f}\" fill=\"{}\"><title>row {}, col {}: {}</title></rect>\n",
                     x0, y0, x1 - x0, y1 - y0, fill, i, j, value_text(v));
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
                     Layout::ytick_right(), (i + 0.5) * l.cell_h, xml_escape(l.y_text[i]));
    }
    fmt::format_to(it, "</g>\n");
  }
  if (x_labels && l.x_upright) {
    // Written bottom to top, ending at the tick, centred on the column.
    fmt::format_to(it, "<g class=\"xticks\" text-anchor=\"end\">\n");
    for (int64_t j = 0; j < m.width; j += l.x_step) {
      fmt::format_to(it,
                     "<text transform=\"translate({:.2f} {:.2f}) rotate(-90)\" "
                     "dy=\"0.35em\">{}</text>\n",
                     (j + 0.5) * l.cell_w, l.panel_h + kTickLength + kTickPad,
                     xml_escape(l.x_text[j]));
    }
    fmt::format_to(it, "</g>\n");
  } else if (x_labels) {
    fmt::format_to(it, "<g class=\"xticks\" text-anchor=\"middle\">\n");
    for (int64_t j = 0; j < m.width; j += l.x_step) {
      fmt::format_to(it, "<text x=\"{:.2f}\" y=\"{:.2f}\">{}</text>\n", (j + 0.5) * l.cell_w,
                     l.panel_h + l.xtick_baseline(), j);
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
                   l.panel_w / 2, kTitleFont, xml_escape(options.titles()[c]));
  }
  if (r == m.rows - 1 && !options.xlabel().empty()) {
    fmt::format_to(it,
                   "<text class=\"xlabel\" x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" "
                   "font-size=\"{}\">{}</text>\n",
                   l.panel_w / 2, l.panel_h + l.xlabel_baseline(), kLabelFont,
                   xml_escape(options.xlabel()));
  }
  if (c == 0 && !options.ylabel().empty()) {
    // Rotated, the baseline is the right edge of the text: keep it clear of
    // the widest y tick label.
    const double x = Layout::ytick_right() - l.ytick_w - 4;
    fmt::format_to(it,
                   "<text class=\"ylabel\" transform=\"translate({:.2f} {:.2f}) rotate(-90)\" "
                   "text-anchor=\"middle\" font-size=\"{}\">{}</text>\n",
                   x, l.panel_h / 2, kLabelFont, xml_escape(options.ylabel()));
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
  open_svg(out, {l.width, l.height, /*standalone=*/true});
  append_defs(out, map, scale);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) append_panel(out, m, r, c, l, map, scale, options);
  }
  append_colorbar(out, l, map, scale);
  close_svg(out);
  return fmt::to_string(out);
}

}  // namespace

std::string heatmaps_svg(const torch::Tensor& matrices, const HeatmapOptions& options) {
  return render_svg("d2l::heatmaps_svg", matrices, options);
}

void save_heatmaps(const torch::Tensor& matrices, const HeatmapOptions& options,
                   const std::string& path) {
  constexpr const char* fn = "d2l::save_heatmaps";
  // Render first: bad input must not leave an empty file behind.
  write_file(fn, path, render_svg(fn, matrices, options));
}

void show_heatmaps(const torch::Tensor& matrices, const std::string& xlabel,
                   const std::string& ylabel, const std::string& path,
                   const std::vector<std::string>& titles, std::pair<double, double> figsize,
                   const std::string& cmap) {
  constexpr const char* fn = "d2l::show_heatmaps";
  const auto options =
      HeatmapOptions().xlabel(xlabel).ylabel(ylabel).titles(titles).figsize(figsize).cmap(cmap);
  // Render first: bad input must not leave an empty file behind.
  write_file(fn, path, render_svg(fn, matrices, options));
}

}  // namespace d2l
