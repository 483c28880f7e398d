#pragma once

// The viz writers as the tests call them: each SVG returned is also checked
// with svg_problem (xml_helpers.h), so that every document a test produces
// is parsed as XML, read as UTF-8 and searched for NaN and infinity.

#include <d2l/viz.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "xml_helpers.h"

namespace d2l::testing {

inline std::string valid_heatmaps_svg(const torch::Tensor& matrices,
                                      const d2l::HeatmapOptions& options = {}) {
  auto svg = d2l::heatmaps_svg(matrices, options);
  EXPECT_EQ(svg_problem(svg), "");
  return svg;
}

inline std::string valid_plot_svg(const std::vector<d2l::Series>& series,
                                  const d2l::PlotOptions& options = {}) {
  auto svg = d2l::plot_svg(series, options);
  EXPECT_EQ(svg_problem(svg), "");
  return svg;
}

}  // namespace d2l::testing
