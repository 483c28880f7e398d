#include <d2l/plot.h>

#include <c10/util/Exception.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>

#include "xml.h"

namespace d2l {
namespace {

constexpr const char* kFn = "d2l::plot_svg";
constexpr double kUnitsPerInch = 72;
constexpr double kTickFont = 9;
constexpr double kLabelFont = 10;
constexpr double kTickLength = 3.5;
// Average glyph width of a sans-serif font in ems, to size margins and the
// legend without measuring text.
constexpr double kGlyphWidth = 0.6;
// matplotlib's default colour cycle ("tab10"), so charts look like the book's.
constexpr std::array<const char*, 10> kCycle = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                "#bcbd22", "#17becf"};

using Point = std::pair<double, double>;
using Segments = std::vector<std::vector<Point>>;

double text_width(const std::string& text, double font) {
  return static_cast<double>(text.size()) * kGlyphWidth * font;
}

struct Style {
  std::string colour;
  std::string dasharray;  // empty: solid
  bool line = false;
  bool marker = false;
};

// matplotlib's single-letter colours.
std::string letter_colour(char c) {
  switch (c) {
    case 'b':
      return "#0000ff";
    case 'g':
      return "#008000";
    case 'r':
      return "#ff0000";
    case 'c':
      return "#00bfbf";
    case 'm':
      return "#bf00bf";
    case 'y':
      return "#bfbf00";
    case 'k':
      return "#000000";
    default:
      return "";
  }
}

std::string series_name(size_t index, const Series& s) {
  return s.label.empty() ? fmt::format("series {}", index)
                         : fmt::format("series {} (\"{}\")", index, s.label);
}

Style parse_style(size_t index, const Series& s, size_t& cycle_position) {
  Style style;
  std::string rest = s.style;
  if (!rest.empty() && !letter_colour(rest.front()).empty()) {
    style.colour = letter_colour(rest.front());
    rest.erase(0, 1);
  } else {
    // As in matplotlib, only series without a colour of their own advance the cycle.
    style.colour = kCycle[cycle_position++ % kCycle.size()];
  }
  if (!rest.empty() && (rest.back() == 'o' || rest.front() == 'o')) {
    style.marker = true;
    rest.erase(rest.back() == 'o' ? rest.size() - 1 : 0, 1);
  }
  style.line = !rest.empty() || !style.marker;
  if (rest == "--") {
    style.dasharray = "5.5,2.4";
  } else if (rest == "-.") {
    style.dasharray = "9.6,2.4,1.5,2.4";
  } else if (rest == ":") {
    style.dasharray = "1.5,2.5";
  } else {
    TORCH_CHECK(rest.empty() || rest == "-",
                fmt::format("{}: {} has an unknown style \"{}\"; expected an optional colour "
                            "letter (b g r c m y k), a line style (-, --, -., :) and/or the "
                            "marker o, e.g. \"-\", \"m--\", \"o\", \"-o\"",
                            kFn, series_name(index, s), s.style));
  }
  return style;
}

// One axis: limits in plotted coordinates (log10 of the values on a log axis)
// and the screen coordinates they map to.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double screen_lo = 0, screen_hi = 1;
  std::vector<double> ticks;  // values, not plotted coordinates

  double coordinate(double v) const { return log ? std::log10(v) : v; }
  double screen(double v) const {
    return screen_lo + (coordinate(v) - lo) / (hi - lo) * (screen_hi - screen_lo);
  }
};

void check_series(const std::vector<Series>& series, bool log_y) {
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    TORCH_CHECK(s.x.size() == s.y.size(), fmt::format("{}: {} has {} x values but {} y values", kFn,
                                                      series_name(i, s), s.x.size(), s.y.size()));
    if (!log_y) continue;
    for (size_t j = 0; j < s.y.size(); ++j) {
      TORCH_CHECK(!(s.y[j] <= 0),
                  fmt::format("{}: yscale \"log\" needs positive y values, got {} at index {} "
                              "of {}",
                              kFn, s.y[j], j, series_name(i, s)));
    }
  }
}

bool drawable(double x, double y) { return std::isfinite(x) && std::isfinite(y); }

// (min, max) of the plotted coordinates of the drawable points, if any.
c10::optional<Point> data_range(const std::vector<Series>& series, bool of_y, bool log) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : series) {
    for (size_t j = 0; j < s.x.size(); ++j) {
      if (!drawable(s.x[j], s.y[j])) continue;
      const double v = of_y ? s.y[j] : s.x[j];
      lo = std::min(lo, log ? std::log10(v) : v);
      hi = std::max(hi, log ? std::log10(v) : v);
    }
  }
  if (lo > hi) return c10::nullopt;
  return Point(lo, hi);
}

void set_limits(Axis& axis, const PlotOptions::OptionalRange& limits, const char* name,
                const c10::optional<Point>& data) {
  if (limits) {
    const auto [lo, hi] = *limits;
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi && (!axis.log || lo > 0),
                fmt::format("{}: {} must be finite with lower < upper{}, got ({}, {})", kFn, name,
                            axis.log ? " and positive on a log axis" : "", lo, hi));
    axis.lo = axis.coordinate(lo);
    axis.hi = axis.coordinate(hi);
    return;
  }
  auto [lo, hi] = data.value_or(Point(0, 1));
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  const double margin = 0.05 * (hi - lo);  // matplotlib's default margins
  axis.lo = lo - margin;
  axis.hi = hi + margin;
}

// The smallest step of the form {1, 2, 5} x 10^k giving at most `intervals` intervals.
double nice_step(double span, int intervals) {
  const double raw = span / intervals;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw * (1 - 1e-9)) return m * magnitude;
  }
  return 10 * magnitude;
}

std::vector<double> linear_ticks(double lo, double hi) {
  const double step = nice_step(hi - lo, 6);
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; ++k) {
    ticks.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
  }
  return ticks;
}

// Decades when the axis shows at least three (thinned to at most 7), otherwise
// 1-2-5 (or, on a very short axis, every integer) mantissas; `lo`, `hi` are
// log10 of the limits.
std::vector<double> log_ticks(double lo, double hi) {
  const auto first = static_cast<int>(std::ceil(lo - 1e-9));
  const auto last = static_cast<int>(std::floor(hi + 1e-9));
  std::vector<double> ticks;
  if (last - first >= 2) {
    const int every = (last - first) / 7 + 1;
    for (int k = first; k <= last; k += every) ticks.push_back(std::pow(10.0, k));
    return ticks;
  }
  for (const std::vector<double>& mantissas :
       {std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    ticks.clear();
    for (int k = first - 1; k <= last; ++k) {
      for (const double m : mantissas) {
        const double v = m * std::pow(10.0, k);
        if (std::log10(v) >= lo - 1e-9 && std::log10(v) <= hi + 1e-9) ticks.push_back(v);
      }
    }
    if (ticks.size() >= 2) break;
  }
  return ticks;
}

bool is_decade(double v) {
  return std::abs(std::pow(10.0, std::round(std::log10(v))) - v) <= 1e-9 * v;
}

std::string tick_label(const Axis& axis, double v) {
  if (axis.log) {
    // Powers of ten as such only when every tick is one; 1-2-5 ticks read better as numbers.
    if (!std::all_of(axis.ticks.begin(), axis.ticks.end(), is_decade))
      return fmt::format("{:g}", v);
    return fmt::format("10<tspan dy=\"-0.5em\" font-size=\"0.7em\">{}</tspan>",
                       static_cast<int>(std::round(std::log10(v))));
  }
  const double step = axis.ticks.size() > 1 ? axis.ticks[1] - axis.ticks[0] : 1;
  const double largest = std::max(std::abs(axis.lo), std::abs(axis.hi));
  if (largest >= 1e5 || step < 1e-4) return fmt::format("{:g}", v);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

// Width of a tick label as drawn (a superscript counts as its digits).
double tick_label_width(const Axis& axis, double v) {
  const auto text = tick_label(axis, v);
  const auto tag = text.find("<tspan");
  if (tag == std::string::npos) return text_width(text, kTickFont);
  const auto digits = text.substr(text.find('>') + 1);
  return text_width("10", kTickFont) +
         text_width(digits.substr(0, digits.find('<')), kTickFont * 0.7);
}

struct Frame {
  double width, height;
  double left, right, top, bottom;  // the plot area
};

Frame layout(const PlotOptions& options, const Axis& x, const Axis& y) {
  const auto [w_in, h_in] = options.figsize();
  TORCH_CHECK(w_in > 0 && h_in > 0 && std::isfinite(w_in) && std::isfinite(h_in),
              fmt::format("{}: figsize must be positive, got ({}, {})", kFn, w_in, h_in));
  Frame f{w_in * kUnitsPerInch, h_in * kUnitsPerInch, 0, 0, 0, 0};
  double widest = 0;
  for (const double v : y.ticks) widest = std::max(widest, tick_label_width(y, v));
  f.left = 6 + (options.ylabel().empty() ? 0 : 1.4 * kLabelFont) + widest + kTickLength + 3;
  const double last_x = x.ticks.empty() ? 0 : tick_label_width(x, x.ticks.back()) / 2;
  f.right = f.width - std::max(8.0, last_x + 3);
  f.top = options.title().empty() ? 8 : 8 + 1.6 * kLabelFont;
  f.bottom = f.height -
             (kTickLength + 4 + kTickFont + (options.xlabel().empty() ? 4 : 6 + 1.2 * kLabelFont));
  TORCH_CHECK(f.right - f.left > 10 && f.bottom - f.top > 10,
              fmt::format("{}: figsize ({}, {}) leaves no room for the axes", kFn, w_in, h_in));
  return f;
}

using Out = std::back_insert_iterator<std::string>;

void draw_ticks(Out out, const Frame& f, const Axis& x, const Axis& y, bool grid) {
  for (const double v : x.ticks) {
    const double sx = x.screen(v);
    if (grid)
      fmt::format_to(
          out,
          "<line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\" class=\"grid\"/>\n",
          sx, f.top, f.bottom);
    fmt::format_to(
        out, "<line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\" class=\"tick\"/>\n",
        sx, f.bottom, f.bottom + kTickLength);
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"xtick\">{}</text>\n", sx,
                   f.bottom + kTickLength + 2 + kTickFont, tick_label(x, v));
  }
  for (const double v : y.ticks) {
    const double sy = y.screen(v);
    if (grid)
      fmt::format_to(
          out,
          "<line x1=\"{1:.2f}\" y1=\"{0:.2f}\" x2=\"{2:.2f}\" y2=\"{0:.2f}\" class=\"grid\"/>\n",
          sy, f.left, f.right);
    fmt::format_to(
        out, "<line x1=\"{1:.2f}\" y1=\"{0:.2f}\" x2=\"{2:.2f}\" y2=\"{0:.2f}\" class=\"tick\"/>\n",
        sy, f.left - kTickLength, f.left);
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"ytick\">{}</text>\n",
                   f.left - kTickLength - 2, sy + 0.35 * kTickFont, tick_label(y, v));
  }
}

// Screen points of a series, split at the points that cannot be drawn.
Segments screen_segments(const Series& s, const Axis& x, const Axis& y) {
  Segments segments(1);
  for (size_t j = 0; j < s.x.size(); ++j) {
    if (drawable(s.x[j], s.y[j])) {
      segments.back().emplace_back(x.screen(s.x[j]), y.screen(s.y[j]));
    } else if (!segments.back().empty()) {
      segments.emplace_back();
    }
  }
  if (segments.back().empty()) segments.pop_back();
  return segments;
}

std::string stroke(const Style& style) {
  return fmt::format(
      "stroke=\"{}\"{}", style.colour,
      style.dasharray.empty() ? "" : fmt::format(" stroke-dasharray=\"{}\"", style.dasharray));
}

void draw_series(Out out, const Segments& segments, const Style& style) {
  for (const auto& segment : segments) {
    if (style.line && segment.size() > 1) {
      fmt::format_to(out, "<polyline class=\"line\" {} points=\"", stroke(style));
      for (size_t k = 0; k < segment.size(); ++k) {
        fmt::format_to(out, "{}{:.2f},{:.2f}", k ? " " : "", segment[k].first, segment[k].second);
      }
      fmt::format_to(out, "\"/>\n");
    }
    if (!style.marker) continue;
    for (const auto& [px, py] : segment) {
      fmt::format_to(out,
                     "<circle class=\"marker\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\"/>\n",
                     px, py, style.colour);
    }
  }
}

struct LegendEntry {
  std::string label;
  Style style;
};

// How many of the points, and of 8 samples along each line segment, fall in the box.
size_t covered(const std::vector<Segments>& drawn, const Point& corner, double w, double h) {
  const auto inside = [&](double x, double y) {
    return x >= corner.first && x <= corner.first + w && y >= corner.second &&
           y <= corner.second + h;
  };
  size_t count = 0;
  for (const auto& segments : drawn) {
    for (const auto& segment : segments) {
      for (size_t k = 0; k < segment.size(); ++k) {
        count += inside(segment[k].first, segment[k].second);
        if (k == 0) continue;
        const auto& [x0, y0] = segment[k - 1];
        const auto& [x1, y1] = segment[k];
        for (int t = 1; t < 8; ++t) count += inside(x0 + (x1 - x0) * t / 8, y0 + (y1 - y0) * t / 8);
      }
    }
  }
  return count;
}

// The corner (upper right, upper left, lower left, lower right, as
// matplotlib's "best" tries them) whose box covers the least data.
Point legend_corner(const Frame& f, double w, double h, const std::vector<Segments>& drawn) {
  const std::array<Point, 4> corners = {
      Point(f.right - 5 - w, f.top + 5), Point(f.left + 5, f.top + 5),
      Point(f.left + 5, f.bottom - 5 - h), Point(f.right - 5 - w, f.bottom - 5 - h)};
  Point best = corners[0];
  size_t fewest = std::numeric_limits<size_t>::max();
  for (const auto& corner : corners) {
    const size_t count = covered(drawn, corner, w, h);
    if (count < fewest) {
      fewest = count;
      best = corner;
    }
  }
  return best;
}

void draw_legend(Out out, const Frame& f, const std::vector<LegendEntry>& entries,
                 const std::vector<Segments>& drawn) {
  if (entries.empty()) return;
  constexpr double row = 1.4 * kTickFont, sample = 18;
  double widest = 0;
  for (const auto& e : entries) widest = std::max(widest, text_width(e.label, kTickFont));
  const double w = 6 + sample + 5 + widest + 6, h = 4 + row * static_cast<double>(entries.size());
  const auto [bx, by] = legend_corner(f, w, h, drawn);
  fmt::format_to(
      out,
      "<g class=\"legend\">\n<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
      "rx=\"2\" fill=\"#ffffff\" fill-opacity=\"0.8\" stroke=\"#cccccc\" stroke-width=\"0.8\"/>\n",
      bx, by, w, h);
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const double cy = by + 2 + row * (static_cast<double>(i) + 0.5);
    if (e.style.line) {
      fmt::format_to(
          out,
          "<line class=\"line\" {} x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\"/>\n",
          stroke(e.style), bx + 6, cy, bx + 6 + sample, cy);
    }
    if (e.style.marker) {
      fmt::format_to(out,
                     "<circle class=\"marker\" cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"3\" fill=\"{}\"/>\n",
                     bx + 6 + sample / 2, cy, e.style.colour);
    }
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"entry\">{}</text>\n",
                   bx + 6 + sample + 5, cy + 0.35 * kTickFont, detail::xml_escape(e.label));
  }
  fmt::format_to(out, "</g>\n");
}

void draw_labels(Out out, const Frame& f, const PlotOptions& options) {
  const double cx = (f.left + f.right) / 2, cy = (f.top + f.bottom) / 2;
  if (!options.title().empty()) {
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"title\">{}</text>\n", cx,
                   f.top - 6, detail::xml_escape(options.title()));
  }
  if (!options.xlabel().empty()) {
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"label\">{}</text>\n", cx,
                   f.height - 5, detail::xml_escape(options.xlabel()));
  }
  if (!options.ylabel().empty()) {
    fmt::format_to(
        out, "<text transform=\"translate({:.2f},{:.2f}) rotate(-90)\" class=\"label\">{}</text>\n",
        4 + kLabelFont, cy, detail::xml_escape(options.ylabel()));
  }
}

void open_document(Out out, const Frame& f) {
  fmt::format_to(out,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.2f}\" height=\"{1:.2f}\" "
                 "viewBox=\"0 0 {0:.2f} {1:.2f}\" font-family=\"DejaVu Sans, Helvetica, Arial, "
                 "sans-serif\">\n<style>\n"
                 ".grid {{ stroke: #b0b0b0; stroke-width: 0.8; stroke-opacity: 0.6; }}\n"
                 ".tick {{ stroke: #000000; stroke-width: 0.8; }}\n"
                 ".line {{ fill: none; stroke-width: 1.5; stroke-linejoin: round; "
                 "stroke-linecap: butt; }}\n"
                 ".xtick {{ font-size: {2}px; text-anchor: middle; }}\n"
                 ".ytick {{ font-size: {2}px; text-anchor: end; }}\n"
                 ".entry {{ font-size: {2}px; }}\n"
                 ".label {{ font-size: {3}px; text-anchor: middle; }}\n"
                 ".title {{ font-size: {3}px; text-anchor: middle; }}\n</style>\n"
                 "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
                 "<clipPath id=\"d2l-plot-area\"><rect x=\"{4:.2f}\" y=\"{5:.2f}\" "
                 "width=\"{6:.2f}\" height=\"{7:.2f}\"/></clipPath>\n",
                 f.width, f.height, kTickFont, kLabelFont, f.left, f.top, f.right - f.left,
                 f.bottom - f.top);
}

Axis make_axis(const std::vector<Series>& series, const PlotOptions& options, bool of_y) {
  Axis axis;
  axis.log = of_y && options.yscale() == "log";
  set_limits(axis, of_y ? options.ylim() : options.xlim(), of_y ? "ylim" : "xlim",
             data_range(series, of_y, axis.log));
  axis.ticks = axis.log ? log_ticks(axis.lo, axis.hi) : linear_ticks(axis.lo, axis.hi);
  return axis;
}

}  // namespace

std::string plot_svg(const std::vector<Series>& series, const PlotOptions& options) {
  TORCH_CHECK(
      options.yscale() == "linear" || options.yscale() == "log",
      fmt::format("{}: yscale must be \"linear\" or \"log\", got \"{}\"", kFn, options.yscale()));
  check_series(series, options.yscale() == "log");
  Axis x = make_axis(series, options, false), y = make_axis(series, options, true);
  const Frame f = layout(options, x, y);
  x.screen_lo = f.left, x.screen_hi = f.right;
  y.screen_lo = f.bottom, y.screen_hi = f.top;

  std::string svg;
  auto out = std::back_inserter(svg);
  open_document(out, f);
  draw_ticks(out, f, x, y, options.grid());
  std::vector<Segments> drawn;
  std::vector<LegendEntry> legend;
  size_t cycle_position = 0;
  fmt::format_to(out, "<g clip-path=\"url(#d2l-plot-area)\">\n");
  for (size_t i = 0; i < series.size(); ++i) {
    const Style style = parse_style(i, series[i], cycle_position);
    drawn.push_back(screen_segments(series[i], x, y));
    draw_series(out, drawn.back(), style);
    if (!series[i].label.empty()) legend.push_back({series[i].label, style});
  }
  fmt::format_to(out,
                 "</g>\n<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
                 "fill=\"none\" stroke=\"#000000\" stroke-width=\"0.8\"/>\n",
                 f.left, f.top, f.right - f.left, f.bottom - f.top);
  draw_legend(out, f, legend, drawn);
  draw_labels(out, f, options);
  svg += "</svg>\n";
  return svg;
}

void save_plot(const std::vector<Series>& series, const PlotOptions& options,
               const std::string& path) {
  const auto svg = plot_svg(series, options);
  std::ofstream file(path, std::ios::binary);
  TORCH_CHECK(file.good(), fmt::format("d2l::save_plot: cannot open \"{}\" for writing", path));
  file << svg;
  file.close();
  TORCH_CHECK(file.good(), fmt::format("d2l::save_plot: writing \"{}\" failed", path));
}

}  // namespace d2l
