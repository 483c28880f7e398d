// Where the data lands: every polyline point, marker and tick of plot_svg at
// the screen position its value gives on axes of known limits (x to the
// right, y up), and every heatmap cell of heatmaps_svg in the panel, row and
// column of its matrix entry. A flipped or transposed axis fails here.

#include <d2l/viz/heatmap.h>
#include <d2l/viz/plot.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

using PlacedXY = std::pair<double, double>;

// Every match of `pattern`'s capture groups, as doubles.
std::vector<std::vector<double>> numbers_matching(const std::string& text,
                                                  const std::string& pattern) {
  const std::regex re(pattern);
  std::vector<std::vector<double>> found;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    std::vector<double> groups;
    for (size_t g = 1; g < it->size(); ++g) groups.push_back(std::stod((*it)[g]));
    found.push_back(groups);
  }
  return found;
}

std::vector<PlacedXY> placed_polyline_points(const std::string& svg) {
  std::vector<PlacedXY> points;
  const std::regex re("<polyline[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator();
       ++it) {
    std::istringstream in((*it)[1]);
    for (std::string point; in >> point;) {
      const auto comma = point.find(',');
      points.emplace_back(std::stod(point.substr(0, comma)), std::stod(point.substr(comma + 1)));
    }
  }
  return points;
}

TEST(PlotPlacement, PointsMarkersAndTicksSitWhereTheirValuesSay) {
  const d2l::Series s{{1, 4, 9, 2.5}, {-1.5, 0.5, 1.8, -0.25}, "", "-o"};
  const auto svg = d2l::plot_svg({s}, d2l::PlotOptions().xlim({{0.0, 10.0}}).ylim({{-2.0, 2.0}}));
  const auto area = numbers_matching(
      svg, R"re(<clipPath id="d2l-plot-area"><rect x="([-0-9.]+)" y="([-0-9.]+)" )re"
           R"re(width="([0-9.]+)" height="([0-9.]+)")re");
  ASSERT_EQ(area.size(), 1u);
  const double left = area[0][0], top = area[0][1], width = area[0][2], height = area[0][3];
  // x grows to the right over [0, 10], y grows upwards over [-2, 2].
  const auto screen_x = [&](double x) { return left + x / 10 * width; };
  const auto screen_y = [&](double y) { return top + (2 - y) / 4 * height; };

  const auto points = placed_polyline_points(svg);
  const auto markers =
      numbers_matching(svg, R"re(<circle class="marker" cx="([-0-9.]+)" cy="([-0-9.]+)")re");
  ASSERT_EQ(points.size(), s.x.size());
  ASSERT_EQ(markers.size(), s.x.size());
  for (size_t k = 0; k < s.x.size(); ++k) {
    EXPECT_NEAR(points[k].first, screen_x(s.x[k]), 0.006) << "point " << k;
    EXPECT_NEAR(points[k].second, screen_y(s.y[k]), 0.006) << "point " << k;
    EXPECT_NEAR(markers[k][0], screen_x(s.x[k]), 0.006) << "marker " << k;
    EXPECT_NEAR(markers[k][1], screen_y(s.y[k]), 0.006) << "marker " << k;
  }

  // x tick labels are centred on their value; y tick marks are horizontal
  // lines at theirs, drawn in the order of their labels.
  const auto xticks = numbers_matching(svg, R"re(<text x="([-0-9.]+)" y="[-0-9.]+" )re"
                                            R"re(class="xtick">([-0-9.]+)</text>)re");
  ASSERT_GE(xticks.size(), 3u);
  for (const auto& t : xticks) EXPECT_NEAR(t[0], screen_x(t[1]), 0.006) << "x tick " << t[1];
  const auto ylabels = numbers_matching(svg, R"re(class="ytick">([-0-9.]+)</text>)re");
  std::vector<double> ymarks;
  for (const auto& line :
       numbers_matching(svg, R"re(<line x1="([-0-9.]+)" y1="([-0-9.]+)" )re"
                             R"re(x2="([-0-9.]+)" y2="([-0-9.]+)" class="tick")re")) {
    if (line[1] == line[3]) ymarks.push_back(line[1]);
  }
  ASSERT_GE(ylabels.size(), 3u);
  ASSERT_EQ(ymarks.size(), ylabels.size());
  for (size_t k = 0; k < ylabels.size(); ++k) {
    EXPECT_NEAR(ymarks[k], screen_y(ylabels[k][0]), 0.006) << "y tick " << ylabels[k][0];
  }
}

struct PlacedCell {
  double x, y, width, height;
  std::string fill, title;
};

struct PlacedPanel {
  double x, y;
  std::vector<PlacedCell> cells;
};

std::vector<PlacedPanel> heatmap_panels(const std::string& svg) {
  const std::regex panel_re(
      R"re(<g class="panel" transform="translate\(([-0-9.]+) ([-0-9.]+)\)">)re");
  const std::regex cell_re(
      R"re(<rect class="cell" x="([-0-9.]+)" y="([-0-9.]+)" width="([0-9.]+)" )re"
      R"re(height="([0-9.]+)" fill="([^"]+)"><title>([^<]*)</title>)re");
  std::vector<PlacedPanel> panels;
  std::vector<size_t> starts;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), panel_re);
       it != std::sregex_iterator(); ++it) {
    panels.push_back({std::stod((*it)[1]), std::stod((*it)[2]), {}});
    starts.push_back(static_cast<size_t>(it->position()));
  }
  starts.push_back(svg.size());
  for (size_t p = 0; p < panels.size(); ++p) {
    const auto part = svg.substr(starts[p], starts[p + 1] - starts[p]);
    for (auto it = std::sregex_iterator(part.begin(), part.end(), cell_re);
         it != std::sregex_iterator(); ++it) {
      panels[p].cells.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]),
                                 std::stod((*it)[4]), (*it)[5], (*it)[6]});
    }
  }
  return panels;
}

// A grid of 2 x 3 panels of 3 x 5 matrices, all 0 but one entry 1 at
// panel (1, 2), row 2, column 3: exactly one cell is coloured differently,
// and it is in the bottom-right panel, third row from the top, fourth column.
TEST(HeatmapPlacement, AUniqueMaximumColoursItsOwnPanelRowAndColumn) {
  const int64_t rows = 2, cols = 3, h = 3, w = 5;
  auto matrices = torch::zeros({rows, cols, h, w}, torch::kDouble);
  matrices[1][2][2][3] = 1.0;
  const auto panels = heatmap_panels(d2l::heatmaps_svg(matrices));
  ASSERT_EQ(panels.size(), static_cast<size_t>(rows * cols));
  const std::string background = panels[0].cells.at(0).fill;
  int found = 0;
  for (size_t p = 0; p < panels.size(); ++p) {
    ASSERT_EQ(panels[p].cells.size(), static_cast<size_t>(h * w)) << "panel " << p;
    // Panels row-major: those of a grid row share y, and x grows along it.
    const auto r = static_cast<int64_t>(p) / cols, c = static_cast<int64_t>(p) % cols;
    EXPECT_NEAR(panels[p].y, panels[r * cols].y, 1e-9) << "panel " << p;
    EXPECT_NEAR(panels[p].x, panels[c].x, 1e-9) << "panel " << p;
    if (c > 0) EXPECT_GT(panels[p].x, panels[p - 1].x) << "panel " << p;
    if (r > 0) EXPECT_GT(panels[p].y, panels[p - cols].y) << "panel " << p;
    for (const auto& cell : panels[p].cells) {
      // The cell's own position gives its row and column (cells are equal).
      const auto i = std::lround(cell.y / cell.height), j = std::lround(cell.x / cell.width);
      EXPECT_EQ(cell.title.substr(0, cell.title.find(':')),
                "row " + std::to_string(i) + ", col " + std::to_string(j));
      if (cell.fill == background) continue;
      ++found;
      EXPECT_EQ(r, 1);
      EXPECT_EQ(c, 2);
      EXPECT_EQ(i, 2) << "row from the top";
      EXPECT_EQ(j, 3) << "column from the left";
      EXPECT_EQ(cell.title, "row 2, col 3: 1");
    }
  }
  EXPECT_EQ(found, 1);
}

}  // namespace
