#pragma once

// The axes of plot_svg: limits, ticks at 1-2-5 steps (decades on a log axis)
// and their labels.

#include <d2l/viz/plot.h>

#include <cmath>
#include <string>
#include <vector>

namespace d2l::detail::plot {

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

/// Points with a NaN or infinite coordinate are left out, leaving a gap.
inline bool drawable(double x, double y) { return std::isfinite(x) && std::isfinite(y); }

/// The x axis (`of_y` false) or the y axis of the chart, without its screen
/// coordinates; `fn` is the public function named in the error messages.
Axis make_axis(const char* fn, const std::vector<Series>& series, const PlotOptions& options,
               bool of_y);

/// A tick label as SVG text: a power of ten carries a superscript.
std::string tick_label(const Axis& axis, double v);

/// Width of a tick label as drawn (a superscript counts as its digits).
double tick_label_width(const Axis& axis, double v);

}  // namespace d2l::detail::plot
