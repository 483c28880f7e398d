#include "plot_axis.h"

#include <c10/util/Exception.h>

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <utility>

#include "svg.h"

namespace d2l::detail::plot {
namespace {

using Point = std::pair<double, double>;

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

void set_limits(const char* fn, Axis& axis, const PlotOptions::OptionalRange& limits,
                const char* name, const c10::optional<Point>& data) {
  if (limits) {
    const auto [lo, hi] = *limits;
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi && (!axis.log || lo > 0),
                fmt::format("{}: {} must be finite with lower < upper{}, got ({}, {})", fn, name,
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
  if (largest >= 1e5 || step < 1e-4) return fmt::format("{:g}", v);
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
