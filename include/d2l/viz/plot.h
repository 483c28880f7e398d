#pragma once

// Part of d2l::viz (link d2l::viz): the book's d2l.plot.

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <string>
#include <utility>
#include <vector>

namespace d2l {

/// One curve of a line chart: y against x, NaN or infinite points leave a gap.
struct Series {
  std::vector<double> x, y;
  /// Legend entry; series with an empty label are left out of the legend.
  std::string label;
  /// matplotlib-like format: an optional colour letter (b g r c m y k), a line
  /// style ("-", "--", "-.", ":") and/or the marker "o". E.g. "-", "--",
  /// "m--", "o" (points only), "-o". Without a colour letter the series takes
  /// the next colour of matplotlib's default cycle.
  std::string style = "-";
};

/// How `plot_svg` draws the chart; defaults follow the book's `d2l.plot`.
struct PlotOptions {
  using Range = std::pair<double, double>;
  using OptionalRange = c10::optional<Range>;
  using Size = std::pair<double, double>;

  /// Label under the x axis.
  TORCH_ARG(std::string, xlabel) = "";
  /// Label left of the y axis.
  TORCH_ARG(std::string, ylabel) = "";
  /// Title above the axes.
  TORCH_ARG(std::string, title) = "";
  /// Size of the figure in inches (width, height), each in (0, 1000]; 1 inch =
  /// 72 SVG user units.
  TORCH_ARG(Size, figsize) = Size(3.5, 2.5);
  /// x axis limits (lower, upper); default: the data range plus 5% margins.
  TORCH_ARG(OptionalRange, xlim) = c10::nullopt;
  /// y axis limits (lower, upper); default: the data range plus 5% margins.
  TORCH_ARG(OptionalRange, ylim) = c10::nullopt;
  /// "linear" or "log" (which needs positive y values).
  TORCH_ARG(std::string, yscale) = "linear";
  /// Light grid lines at the ticks.
  TORCH_ARG(bool, grid) = true;
};

/// The book's d2l.plot as a self-contained SVG document: axes with ticks at
/// 1-2-5 steps (decades on a log axis), labels, title, grid and a legend.
/// Throws c10::Error for mismatched x/y lengths, an unknown style, bad limits
/// or non-positive values on a log axis.
std::string plot_svg(const std::vector<Series>& series, const PlotOptions& options = {});

/// Writes plot_svg(series, options) to `path`; throws c10::Error
/// "d2l::save_plot: cannot write '<path>': <reason>" if it cannot be written.
void save_plot(const std::vector<Series>& series, const PlotOptions& options,
               const std::string& path);

}  // namespace d2l
