#include "plot_axis.h"

#include <c10/util/Exception.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "svg.h"

namespace d2l::detail::plot {
namespace {

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

// The least half span of an axis around `lo` .. `hi` (plotted coordinates):
// a billionth of their magnitude, so that ticks are counted in exact
// integers; and at least 1e-300, so that a span of subnormals neither halves
// to zero nor gives an infinite tick exponent.
double least_half_span(double lo, double hi) {
  return std::max(std::max(std::abs(lo), std::abs(hi)) * 1e-9, 1e-300);
}

// `v` moved by `by`, within the finite doubles.
double shifted(double v, double by) {
  return std::clamp(v + by, std::numeric_limits<double>::lowest(),
                    std::numeric_limits<double>::max());
}

void set_limits(const char* fn, Axis& axis, const PlotOptions::OptionalRange& limits,
                const char* name, const c10::optional<Point>& data) {
  if (limits) {
    const auto [lo, hi] = *limits;
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi && (!axis.log || lo > 0),
                fmt::format("{}: {} must be finite with lower < upper{}, got ({}, {})", fn, name,
                            axis.log ? " and positive on a log axis" : "", lo, hi));
    axis.lo = axis.coordinate(lo);
    axis.hi = axis.coordinate(hi);
    TORCH_CHECK(axis.half_span() >= least_half_span(axis.lo, axis.hi),
                fmt::format("{}: {} must span at least a billionth of its magnitude and 2e-300{} "
                            "to be drawn with ticks, got ({}, {})",
                            fn, name, axis.log ? " in log10" : "", lo, hi));
    return;
  }
  auto [lo, hi] = data.value_or(Point(0, 1));
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  // Far from zero the ±1 vanishes in rounding, as does the span of values
  // equal up to rounding: widen both to the least span ticks can count.
  const double widen = least_half_span(lo, hi) - (hi / 2 - lo / 2);
  if (widen > 0) {
    lo = shifted(lo, -widen);
    hi = shifted(hi, widen);
  }
  const double margin = 0.1 * (hi / 2 - lo / 2);  // matplotlib's default 5% margins
  axis.lo = shifted(lo, -margin);
  axis.hi = shifted(hi, margin);
}

// The smallest step of the form {1, 2, 5} x 10^k giving at most `intervals`
// intervals of lo .. hi, computed from halves: hi - lo overflows for a range
// like -1e308 .. 1e308.
double nice_step(double lo, double hi, int intervals) {
  const double raw = (hi / 2 - lo / 2) / intervals * 2;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * magnitude >= raw * (1 - 1e-9)) return m * magnitude;
  }
  return 10 * magnitude;
}

std::vector<double> linear_ticks(double lo, double hi) {
  const double step = nice_step(lo, hi, 6);
  std::vector<double> ticks;
  // Bounds as quotients: hi + a fraction of the step overflows near DBL_MAX.
  const double last = std::floor(hi / step + 1e-9);
  for (double k = std::ceil(lo / step - 1e-9); k <= last; ++k) {
    ticks.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
  }
  return ticks;
}

// A tick of a log axis must have a finite, non-zero log10: powers of ten
// beyond the doubles (10^309, 10^-330) are left out.
bool drawable_log_tick(double v) { return v > 0 && std::isfinite(v); }

// Decades when the axis shows at least three (thinned to at most 7), otherwise
// 1-2-5 (or, on a very short axis, every integer) mantissas; `lo`, `hi` are
// log10 of the limits.
std::vector<double> log_ticks(double lo, double hi) {
  const auto first = static_cast<int>(std::ceil(lo - 1e-9));
  const auto last = static_cast<int>(std::floor(hi + 1e-9));
  std::vector<double> ticks;
  if (last - first >= 2) {
    const int every = (last - first) / 7 + 1;
    for (int k = first; k <= last; k += every) {
      if (drawable_log_tick(std::pow(10.0, k))) ticks.push_back(std::pow(10.0, k));
    }
    return ticks;
  }
  for (const std::vector<double>& mantissas :
       {std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
    ticks.clear();
    for (int k = first - 1; k <= last; ++k) {
      for (const double m : mantissas) {
        const double v = m * std::pow(10.0, k);
        if (drawable_log_tick(v) && std::log10(v) >= lo - 1e-9 && std::log10(v) <= hi + 1e-9) {
          ticks.push_back(v);
        }
      }
    }
    if (ticks.size() >= 2) break;
  }
  return ticks;
}

bool is_decade(double v) {
  return std::abs(std::pow(10.0, std::round(std::log10(v))) - v) <= 1e-9 * v;
}

}  // namespace

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
  if (largest >= 1e5 || step < 1e-4) {
    // Enough significant digits to tell neighbours apart: a narrow range far
    // from zero must not read 1e+300 at every tick.
    const double digits = std::floor(std::log10(largest)) - std::floor(std::log10(step)) + 1;
    return fmt::format("{:.{}g}", v, static_cast<int>(std::clamp(digits, 1.0, 17.0)));
  }
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

double tick_label_width(const Axis& axis, double v) {
  const auto text = tick_label(axis, v);
  const auto tag = text.find("<tspan");
  if (tag == std::string::npos) return text_width(text, kTickFont);
  const auto digits = text.substr(text.find('>') + 1);
  return text_width("10", kTickFont) +
         text_width(digits.substr(0, digits.find('<')), kTickFont * 0.7);
}

double Axis::outer_lo() const { return shifted(lo, -2 * half_span()); }
double Axis::outer_hi() const { return shifted(hi, 2 * half_span()); }

bool inside(const Axis& x, const Axis& y, Point p) {
  return p.first >= x.outer_lo() && p.first <= x.outer_hi() && p.second >= y.outer_lo() &&
         p.second <= y.outer_hi();
}

// Liang-Barsky, from halves so that no difference overflows.
c10::optional<std::pair<double, double>> clip(const Axis& x, const Axis& y, Point a, Point b) {
  double u0 = 0, u1 = 1;
  const auto keep = [&](double from, double to, double lo, double hi) {
    const double d = to / 2 - from / 2;
    if (d == 0) return from >= lo && from <= hi;
    double enter = (lo / 2 - from / 2) / d, leave = (hi / 2 - from / 2) / d;
    if (enter > leave) std::swap(enter, leave);
    u0 = std::max(u0, enter);
    u1 = std::min(u1, leave);
    return u0 <= u1;
  };
  if (!keep(a.first, b.first, x.outer_lo(), x.outer_hi()) ||
      !keep(a.second, b.second, y.outer_lo(), y.outer_hi())) {
    return c10::nullopt;
  }
  return std::make_pair(u0, u1);
}

Point along(Point a, Point b, double u) {
  if (u <= 0) return a;
  if (u >= 1) return b;
  const auto at = [u](double from, double to) {
    return std::clamp(2 * (from / 2 + u * (to / 2 - from / 2)),
                      std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max());
  };
  return {at(a.first, b.first), at(a.second, b.second)};
}

Axis make_axis(const char* fn, const std::vector<Series>& series, const PlotOptions& options,
               bool of_y) {
  Axis axis;
  axis.log = of_y && options.yscale() == "log";
  set_limits(fn, axis, of_y ? options.ylim() : options.xlim(), of_y ? "ylim" : "xlim",
             data_range(series, of_y, axis.log));
  axis.ticks = axis.log ? log_ticks(axis.lo, axis.hi) : linear_ticks(axis.lo, axis.hi);
  return axis;
}

}  // namespace d2l::detail::plot
