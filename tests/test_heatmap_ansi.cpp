// d2l::heatmaps_ansi: the terminal preview of the heatmaps.

#include <fmt/format.h>

#include <string>

#include "heatmap_helpers.h"

namespace {

using namespace d2l::testing::heatmap;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kBackground = "\x1b[48;2;";
constexpr const char* kReset = "\x1b[0m";

TEST(HeatmapAnsi, OneColouredCellPerEntryAndAResetPerPanelLine) {
  const auto text = d2l::heatmaps_ansi(arange_matrices(2, 3, 4, 5));
  constexpr size_t kRamp = 8;  // legend swatches
  EXPECT_EQ(count(text, kBackground), 2u * 3 * 4 * 5 + kRamp);
  EXPECT_EQ(count(text, kBackground + std::string("255;245;240m  ")), 1u);  // the minimum cell
  // One reset per panel per line (so the gaps stay uncoloured), one for the legend.
  EXPECT_EQ(count(text, kReset), 2u * 3 * 4 + 1);
  EXPECT_EQ(count(text, std::string(kReset) + "\n"), 2u * 4);
  EXPECT_EQ(count(text, std::string(kReset) + "  " + kBackground), 2u * 4 * 2);
  EXPECT_THAT(text, HasSubstr("Reds "));
  EXPECT_THAT(text, HasSubstr(" 0 … 119"));
}

TEST(HeatmapAnsi, MatchesTheSvgColours) {
  const auto m = torch::rand({1, 1, 2, 3});
  const auto c = cells(d2l::heatmaps_svg(m, d2l::HeatmapOptions().cmap("viridis")));
  const auto text = d2l::heatmaps_ansi(m, d2l::HeatmapOptions().cmap("viridis"));
  for (const auto& cell : c) {
    const Rgb rgb = parse_hex(cell.fill);
    EXPECT_THAT(text, HasSubstr(fmt::format("{}{};{};{}m  ", kBackground, rgb.r, rgb.g, rgb.b)));
  }
}

TEST(HeatmapAnsi, ShowsTitlesLabelsAndNaN) {
  const auto m = torch::tensor({0.0, kNaN, 1.0, 2.0}, torch::kDouble).reshape({1, 2, 1, 2});
  const auto text = d2l::heatmaps_ansi(
      m, d2l::HeatmapOptions().titles({"Head 1", "H2"}).xlabel("Keys").ylabel("Queries"));
  EXPECT_THAT(text, HasSubstr("rows: Queries\n"));
  EXPECT_THAT(text, HasSubstr("columns: Keys\n"));
  // Panels are two cells (four columns) wide: long titles are cut.
  EXPECT_THAT(text, HasSubstr("Hea…  H2  \n"));
  EXPECT_THAT(text, HasSubstr(" 0 … 2"));
  EXPECT_THAT(text, HasSubstr("NaN "));
  EXPECT_EQ(count(text, kBackground), 4u + 8 + 1);
}

TEST(HeatmapAnsi, TitlesOnceAboveTheTopRowAndABlankLineBetweenRows) {
  const auto text = d2l::heatmaps_ansi(arange_matrices(2, 2, 1, 3),
                                       d2l::HeatmapOptions().titles({"left", "right"}));
  EXPECT_EQ(count(text, "left    right \n"), 1u);
  EXPECT_EQ(count(text, std::string(kReset) + "\n\n" + kBackground), 1u);
}

TEST(HeatmapAnsi, ConstantMatrixHasNoNaN) {
  const auto text = d2l::heatmaps_ansi(torch::full({1, 1, 2, 2}, 3.0));
  EXPECT_THAT(text, Not(HasSubstr("nan")));
  EXPECT_THAT(text, HasSubstr(" 3 … 3"));
}

}  // namespace
