// plot_svg and save_plot: the book's d2l.plot as an SVG line chart. The axes
// are in plot_axis.cpp.

#include <d2l/viz/plot.h>

#include <c10/util/Exception.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>

#include "plot_axis.h"
#include "svg.h"

namespace d2l {
namespace {

using namespace detail;
using namespace detail::plot;

constexpr const char* kFn = "d2l::plot_svg";

// matplotlib's default colour cycle ("tab10"), so charts look like the book's.
constexpr std::array<const char*, 10> kCycle = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                "#bcbd22", "#17becf"};

using Segments = std::vector<std::vector<Point>>;

struct Style {
  std::string colour;
  std::string dasharray;  // empty: solid
  bool line = false;
  bool marker = false;
};

// matplotlib's single-letter colours.
std::string letter_colour(char c) {
  switch (c) {
    case 'b': return "#0000ff";
    case 'g': return "#008000";
    case 'r': return "#ff0000";
    case 'c': return "#00bfbf";
    case 'm': return "#bf00bf";
    case 'y': return "#bfbf00";
    case 'k': return "#000000";
    default: return "";
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

struct Frame {
  double width, height;
  double left, right, top, bottom;  // the plot area
};

Frame layout(const PlotOptions& options, const Axis& x, const Axis& y) {
  const auto [w_in, h_in] = options.figsize();
  check_figsize(kFn, w_in, h_in);
  Frame f{w_in * kPointsPerInch, h_in * kPointsPerInch, 0, 0, 0, 0};
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

using Out = std::back_insert_iterator<fmt::memory_buffer>;

void draw_line(Out out, double x1, double y1, double x2, double y2, const char* cls) {
  fmt::format_to(out,
                 "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" class=\"{}\"/>\n",
                 x1, y1, x2, y2, cls);
}

void draw_ticks(Out out, const Frame& f, const Axis& x, const Axis& y, bool grid) {
  for (const double v : x.ticks) {
    const double sx = x.screen(v);
    if (grid) draw_line(out, sx, f.top, sx, f.bottom, "grid");
    draw_line(out, sx, f.bottom, sx, f.bottom + kTickLength, "tick");
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"xtick\">{}</text>\n", sx,
                   f.bottom + kTickLength + 2 + kTickFont, tick_label(x, v));
  }
  for (const double v : y.ticks) {
    const double sy = y.screen(v);
    if (grid) draw_line(out, f.left, sy, f.right, sy, "grid");
    draw_line(out, f.left - kTickLength, sy, f.left, sy, "tick");
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"ytick\">{}</text>\n",
                   f.left - kTickLength - 2, sy + 0.35 * kTickFont, tick_label(y, v));
  }
}

// Screen points of a series, split at the points that cannot be drawn and
// clipped to the axes' outer box.
Segments screen_segments(const Series& s, const Axis& x, const Axis& y) {
  Segments segments(1);
  const auto cut = [&] {
    if (!segments.back().empty()) segments.emplace_back();
  };
  const auto add = [&](Point p) {
    segments.back().emplace_back(x.screen_of(p.first), y.screen_of(p.second));
  };
  c10::optional<Point> previous;  // plotted coordinates
  for (size_t j = 0; j < s.x.size(); ++j) {
    if (!drawable(s.x[j], s.y[j])) {
      previous.reset();
      cut();
      continue;
    }
    const Point p(x.coordinate(s.x[j]), y.coordinate(s.y[j]));
    c10::optional<std::pair<double, double>> part;
    if (previous) part = clip(x, y, *previous, p);
    if (!previous) {
      if (inside(x, y, p)) add(p);
    } else if (!part) {
      cut();
    } else {
      const auto [u0, u1] = *part;
      if (u0 > 0 || segments.back().empty()) {
        cut();
        add(along(*previous, p, u0));
      }
      add(along(*previous, p, u1));
      if (u1 < 1) cut();
    }
    previous = p;
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
                   bx + 6 + sample + 5, cy + 0.35 * kTickFont, xml_escape(e.label));
  }
  fmt::format_to(out, "</g>\n");
}

void draw_labels(Out out, const Frame& f, const PlotOptions& options) {
  const double cx = (f.left + f.right) / 2, cy = (f.top + f.bottom) / 2;
  if (!options.title().empty()) {
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"title\">{}</text>\n", cx,
                   f.top - 6, xml_escape(options.title()));
  }
  if (!options.xlabel().empty()) {
    fmt::format_to(out, "<text x=\"{:.2f}\" y=\"{:.2f}\" class=\"label\">{}</text>\n", cx,
                   f.height - 5, xml_escape(options.xlabel()));
  }
  if (!options.ylabel().empty()) {
    fmt::format_to(
        out, "<text transform=\"translate({:.2f},{:.2f}) rotate(-90)\" class=\"label\">{}</text>\n",
        4 + kLabelFont, cy, xml_escape(options.ylabel()));
  }
}

void open_document(fmt::memory_buffer& svg, const Frame& f) {
  open_svg(svg, {f.width, f.height, /*standalone=*/false});
  fmt::format_to(std::back_inserter(svg),
                 "<style>\n"
                 ".grid {{ stroke: #b0b0b0; stroke-width: {6}; stroke-opacity: 0.6; }}\n"
                 ".tick {{ stroke: #000000; stroke-width: {6}; }}\n"
                 ".line {{ fill: none; stroke-width: 1.5; stroke-linejoin: round; "
                 "stroke-linecap: butt; }}\n"
                 ".xtick {{ font-size: {0}px; text-anchor: middle; }}\n"
                 ".ytick {{ font-size: {0}px; text-anchor: end; }}\n"
                 ".entry {{ font-size: {0}px; }}\n"
                 ".label {{ font-size: {1}px; text-anchor: middle; }}\n"
                 ".title {{ font-size: {1}px; text-anchor: middle; }}\n</style>\n"
                 "<clipPath id=\"d2l-plot-area\"><rect x=\"{2:.2f}\" y=\"{3:.2f}\" "
                 "width=\"{4:.2f}\" height=\"{5:.2f}\"/></clipPath>\n",
                 kTickFont, kLabelFont, f.left, f.top, f.right - f.left, f.bottom - f.top,
                 kLineWidth);
}

}  // namespace

std::string plot_svg(const std::vector<Series>& series, const PlotOptions& options) {
  TORCH_CHECK(
      options.yscale() == "linear" || options.yscale() == "log",
      fmt::format("{}: yscale must be \"linear\" or \"log\", got \"{}\"", kFn, options.yscale()));
  check_series(series, options.yscale() == "log");
  Axis x = make_axis(kFn, series, options, false), y = make_axis(kFn, series, options, true);
  const Frame f = layout(options, x, y);
  x.screen_lo = f.left, x.screen_hi = f.right;
  y.screen_lo = f.bottom, y.screen_hi = f.top;

  fmt::memory_buffer svg;
  open_document(svg, f);
  auto out = std::back_inserter(svg);
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
                 "fill=\"none\" stroke=\"#000000\" stroke-width=\"{}\"/>\n",
                 f.left, f.top, f.right - f.left, f.bottom - f.top, kLineWidth);
  draw_legend(out, f, legend, drawn);
  draw_labels(out, f, options);
  close_svg(svg);
  return fmt::to_string(svg);
}

void save_plot(const std::vector<Series>& series, const PlotOptions& options,
               const std::string& path) {
  write_file("d2l::save_plot", path, plot_svg(series, options));
}

}  // namespace d2l
