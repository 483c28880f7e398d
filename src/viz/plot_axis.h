#pragma once

// The axes of plot_svg: limits, ticks at 1-2-5 steps (decades on a log axis),
// their labels, and the clipping of lines to what the screen can hold.

#include <d2l/viz/plot.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace d2l::detail::plot {

using Point = std::pair<double, double>;

// One axis: limits in plotted coordinates (log10 of the values on a log axis)
// and the screen coordinates they map to.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double screen_lo = 0, screen_hi = 1;
  std::vector<double> ticks;  // values, not plotted coordinates

  double coordinate(double v) const { return log ? std::log10(v) : v; }
  // Halved, because hi - lo overflows for a range like -1e308 .. 1e308.
  double half_span() const { return hi / 2 - lo / 2; }
  /// Where plotted coordinate `c` falls on screen; finite for `c` within
  /// `outer_lo()` .. `outer_hi()`.
  double screen_of(double c) const {
    return screen_lo + (c / 2 - lo / 2) / half_span() * (screen_hi - screen_lo);
  }
  double screen(double v) const { return screen_of(coordinate(v)); }
  /// The limits widened by a span on each side (within the finite doubles):
  /// lines are clipped to them, so that a point far outside explicit limits
  /// does not put an infinite coordinate on screen.
  double outer_lo() const;
  double outer_hi() const;
};

/// Points with a NaN or infinite coordinate are left out, leaving a gap.
inline bool drawable(double x, double y) { return std::isfinite(x) && std::isfinite(y); }

/// Whether `p` (plotted coordinates) lies in the outer box of the axes.
bool inside(const Axis& x, const Axis& y, Point p);

/// The part of the segment from `a` to `b` (plotted coordinates) inside the
/// outer box of the axes, as the fractions (u0, u1) of the way from `a` to
/// `b` where it enters and leaves it; nullopt if it misses the box.
c10::optional<std::pair<double, double>> clip(const Axis& x, const Axis& y, Point a, Point b);

/// The point a fraction `u` of the way from `a` to `b`: `a` itself at 0, `b`
/// at 1, and finite in between when both are.
Point along(Point a, Point b, double u);

/// The x axis (`of_y` false) or the y axis of the chart, without its screen
/// coordinates; `fn` is the public function named in the error messages.
Axis make_axis(const char* fn, const std::vector<Series>& series, const PlotOptions& options,
               bool of_y);

/// A tick label as SVG text: a power of ten carries a superscript.
std::string tick_label(const Axis& axis, double v);

/// Width of a tick label as drawn (a superscript counts as its digits).
double tick_label_width(const Axis& axis, double v);

}  // namespace d2l::detail::plot
