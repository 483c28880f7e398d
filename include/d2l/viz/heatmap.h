#pragma once

// Part of d2l::viz (link d2l::viz): the book's show_heatmaps.

#include <torch/arg.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace d2l {

/// (width, height) in inches. A name of its own because TORCH_ARG is a macro
/// and would split `std::pair<double, double>` at its comma.
using Figsize = std::pair<double, double>;

/// How `show_heatmaps` draws a grid of matrices; defaults follow the book's
/// `d2l.show_heatmaps(matrices, xlabel, ylabel, titles=None, figsize=(2.5, 2.5), cmap='Reds')`.
struct HeatmapOptions {
  /// Label under the bottom row of panels.
  TORCH_ARG(std::string, xlabel) = "";
  /// Label left of the first column of panels.
  TORCH_ARG(std::string, ylabel) = "";
  /// One title per column of panels (empty: no titles).
  TORCH_ARG(std::vector<std::string>, titles) = {};
  /// Box of one panel's cells in inches (width, height); 1 inch = 72 SVG user
  /// units, each side in (0, 1000]. Cells are square, as matplotlib's imshow draws them, so the
  /// panel fills the box along one side only; matrices more than five times wider than tall (or
  /// taller than wide) get stretched cells instead of a panel thinner than a fifth of the box.
  TORCH_ARG(Figsize, figsize) = std::make_pair(2.5, 2.5);
  /// Colour map: "Reds", "Blues", "Greens", "Greys" or "viridis".
  TORCH_ARG(std::string, cmap) = "Reds";
  /// Labels of the columns (keys: the tokens of a sentence, say), one per
  /// column of a matrix, written upright under the bottom row of panels;
  /// empty: the column indices. As matplotlib's set_xticklabels.
  TORCH_ARG(std::vector<std::string>, xticklabels) = {};
  /// Labels of the rows (queries), one per row of a matrix, left of the first
  /// column of panels; empty: the row indices.
  TORCH_ARG(std::vector<std::string>, yticklabels) = {};
};

/// A self-contained SVG document drawing `matrices` of shape
/// (num_rows, num_cols, height, width): one panel per matrix, cells coloured
/// by value on one shared scale, tick labels, axis labels, column titles and a
/// colour bar. Any floating dtype and device; values are read as float64.
std::string heatmaps_svg(const torch::Tensor& matrices, const HeatmapOptions& options = {});

/// A preview of the same grid for a terminal (tick labels are the SVG's only): two characters per cell in
/// 24-bit ANSI colour, panels side by side, with a legend of the value range.
std::string heatmaps_ansi(const torch::Tensor& matrices, const HeatmapOptions& options = {});

/// Writes heatmaps_svg(matrices, options) to `path` (the whole document or
/// nothing); throws c10::Error "d2l::save_heatmaps: cannot write '<path>':
/// <reason>" if the file cannot be written.
void save_heatmaps(const torch::Tensor& matrices, const HeatmapOptions& options,
                   const std::string& path);

/// The book's show_heatmaps: writes heatmaps_svg(matrices, ...) to `path`;
/// throws c10::Error "d2l::show_heatmaps: cannot write '<path>': <reason>" if
/// the file cannot be written.
void show_heatmaps(const torch::Tensor& matrices, const std::string& xlabel,
                   const std::string& ylabel, const std::string& path,
                   const std::vector<std::string>& titles = {},
                   std::pair<double, double> figsize = {2.5, 2.5},
                   const std::string& cmap = "Reds");

}  // namespace d2l
