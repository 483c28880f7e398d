// d2l::heatmaps_svg: what the document draws, and the errors for input it
// cannot draw. The terminal preview is in test_heatmap_ansi.cpp, the file
// that show_heatmaps writes in test_show_heatmaps.cpp.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "heatmap_helpers.h"
#include "xml_checked.h"

namespace {

using namespace d2l::testing::heatmap;
using d2l::testing::svg_problem;
using d2l::testing::valid_heatmaps_svg;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

TEST(HeatmapSvg, IsAWellFormedStandaloneDocument) {
  const auto svg =
      valid_heatmaps_svg(arange_matrices(2, 3, 4, 5),
                         d2l::HeatmapOptions().xlabel("x").ylabel("y").titles({"a", "b", "c"}));
  EXPECT_THAT(svg, StartsWith("<?xml"));
  EXPECT_THAT(svg, EndsWith("</svg>\n"));
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("viewBox=\"0 0 "));
  EXPECT_EQ(count(svg, "<g"), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(nesting_error(svg), "");
}

TEST(HeatmapSvg, WidthAndHeightAreTheViewBoxInPoints) {
  const auto svg = valid_heatmaps_svg(arange_matrices(1, 2, 3, 4));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      svg, m,
      std::regex(
          R"re(width="([0-9.]+)pt" height="([0-9.]+)pt" viewBox="0 0 ([0-9.]+) ([0-9.]+)")re")));
  EXPECT_EQ(m[1], m[3]);
  EXPECT_EQ(m[2], m[4]);
  EXPECT_GT(std::stod(m[1]), 2 * 72.0);  // two panels of up to 2.5 inches plus colour bar
}

TEST(HeatmapSvg, DrawsOneCellPerEntryAndOneColourBar) {
  const auto svg = valid_heatmaps_svg(arange_matrices(2, 3, 4, 5));
  EXPECT_EQ(count(svg, "<rect class=\"cell\""), 2u * 3 * 4 * 5);
  EXPECT_EQ(cells(svg).size(), 2u * 3 * 4 * 5);
  EXPECT_EQ(count(svg, "<rect class=\"colorbar\""), 1u);
  EXPECT_EQ(count(svg, "<g class=\"panel\""), 6u);
}

TEST(HeatmapSvg, CellTitlesGiveRowColumnAndValue) {
  auto m = torch::zeros({1, 1, 2, 3}, torch::kDouble);
  m[0][0][1][2] = 0.25;
  const auto c = cells(valid_heatmaps_svg(m));
  ASSERT_EQ(c.size(), 6u);
  EXPECT_EQ(c[0].title, "row 0, col 0: 0");
  EXPECT_EQ(c[5].title, "row 1, col 2: 0.25");
}

TEST(HeatmapSvg, CellsAreSquareAndScaleWithFigsize) {
  const auto m = arange_matrices(1, 1, 2, 10);
  const std::regex size_re(
      R"re(<rect class="cell" x="0.00" y="0.00" width="([0-9.]+)" height="([0-9.]+)")re");
  std::smatch small, large;
  const auto svg_small = valid_heatmaps_svg(m);
  const auto svg_large = valid_heatmaps_svg(m, d2l::HeatmapOptions().figsize({5.0, 5.0}));
  ASSERT_TRUE(std::regex_search(svg_small, small, size_re));
  ASSERT_TRUE(std::regex_search(svg_large, large, size_re));
  // 10 columns across 2.5 inches of 72 units.
  EXPECT_DOUBLE_EQ(std::stod(small[1]), 18.0);
  EXPECT_DOUBLE_EQ(std::stod(small[2]), 18.0);
  EXPECT_DOUBLE_EQ(std::stod(large[1]), 36.0);
}

TEST(HeatmapSvg, VeryWideMatricesGetStretchedCellsNotAHairline) {
  const std::regex size_re(
      R"re(<rect class="cell" x="0.00" y="0.00" width="([0-9.]+)" height="([0-9.]+)")re");
  std::smatch wide, tall;
  const auto svg_wide = valid_heatmaps_svg(arange_matrices(1, 1, 1, 200));
  const auto svg_tall = valid_heatmaps_svg(arange_matrices(1, 1, 100, 1));
  ASSERT_TRUE(std::regex_search(svg_wide, wide, size_re));
  ASSERT_TRUE(std::regex_search(svg_tall, tall, size_re));
  EXPECT_DOUBLE_EQ(std::stod(wide[1]), 0.9);   // 180 units over 200 columns
  EXPECT_DOUBLE_EQ(std::stod(wide[2]), 36.0);  // a fifth of 180
  EXPECT_DOUBLE_EQ(std::stod(tall[1]), 36.0);
  EXPECT_DOUBLE_EQ(std::stod(tall[2]), 1.8);
}

TEST(HeatmapSvg, RedsGoesFromNearWhiteToDarkRed) {
  const auto c = cells(valid_heatmaps_svg(arange_matrices(1, 1, 3, 4)));
  ASSERT_EQ(c.size(), 12u);
  EXPECT_EQ(c.front().fill, "#fff5f0");
  EXPECT_EQ(c.back().fill, "#67000d");
  for (size_t k = 1; k < c.size(); ++k) {
    const Rgb before = parse_hex(c[k - 1].fill), after = parse_hex(c[k].fill);
    EXPECT_LT(after.g, before.g) << "cell " << k << " is not darker than cell " << k - 1;
  }
}

TEST(HeatmapSvg, MaxCellIsDarkestWhereverItIs) {
  auto m = torch::rand({1, 1, 4, 4}, torch::kDouble);
  m[0][0][2][1] = 2.0;
  m[0][0][3][3] = -1.0;
  const auto c = cells(valid_heatmaps_svg(m));
  const Rgb max_cell = parse_hex(c[2 * 4 + 1].fill);
  const Rgb min_cell = parse_hex(c[3 * 4 + 3].fill);
  EXPECT_LT(max_cell.g, min_cell.g);
  for (const auto& cell : c) EXPECT_LE(max_cell.g, parse_hex(cell.fill).g);
}

TEST(HeatmapSvg, EachColourMapHasItsOwnEnds) {
  const auto m = torch::tensor({0.0, 1.0}, torch::kDouble).reshape({1, 1, 1, 2});
  const std::vector<std::tuple<std::string, std::string, std::string>> expected = {
      {"Reds", "#fff5f0", "#67000d"},
      {"Blues", "#f7fbff", "#08306b"},
      {"Greens", "#f7fcf5", "#00441b"},
      {"Greys", "#ffffff", "#000000"},
      {"viridis", "#440154", "#fde725"}};
  for (const auto& [cmap, low, high] : expected) {
    const auto svg = valid_heatmaps_svg(m, d2l::HeatmapOptions().cmap(cmap));
    const auto c = cells(svg);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].fill, low) << cmap;
    EXPECT_EQ(c[1].fill, high) << cmap;
    EXPECT_THAT(svg, HasSubstr("fill=\"url(#d2l-heatmap-" + cmap + ")\"")) << cmap;
  }
}

TEST(HeatmapSvg, PanelsShareOneScale) {
  // Panel 0 holds [0, 1], panel 1 holds [1, 2].
  const auto m = torch::tensor({0.0, 1.0, 1.0, 2.0}, torch::kDouble).reshape({1, 2, 1, 2});
  const auto c = cells(valid_heatmaps_svg(m));
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[1].fill, c[2].fill);
  EXPECT_EQ(c[0].fill, "#fff5f0");
  EXPECT_EQ(c[3].fill, "#67000d");
  EXPECT_NE(c[1].fill, c[0].fill);
  EXPECT_NE(c[1].fill, c[3].fill);
}

TEST(HeatmapSvg, ConstantMatrixUsesTheMiddleColourAndNoNaN) {
  for (const double v : {0.0, 0.5, -3.0, 1e6}) {
    const auto svg = valid_heatmaps_svg(torch::full({2, 2, 3, 3}, v, torch::kDouble));
    EXPECT_THAT(svg, Not(HasSubstr("nan")));
    EXPECT_THAT(svg, Not(HasSubstr("inf")));
    const auto c = cells(svg);
    ASSERT_EQ(c.size(), 36u);
    EXPECT_EQ(c[0].fill, "#fb6a4a") << v;  // Reds at one half
    for (const auto& cell : c) EXPECT_EQ(cell.fill, c[0].fill);
    EXPECT_GE(texts_in_group(svg, "cbticks").size(), 3u);
  }
}

TEST(HeatmapSvg, NaNIsHatchedAndLeftOutOfTheScale) {
  const auto m = torch::tensor({0.0, kNaN, 1.0, 0.5}, torch::kDouble).reshape({1, 1, 2, 2});
  const auto svg = valid_heatmaps_svg(m);
  const auto c = cells(svg);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].fill, "#fff5f0");
  EXPECT_EQ(c[2].fill, "#67000d");
  EXPECT_EQ(c[1].fill, "url(#d2l-heatmap-nan)");
  EXPECT_EQ(c[1].title, "row 0, col 1: not a number");
  EXPECT_THAT(svg, HasSubstr("<pattern id=\"d2l-heatmap-nan\""));
  for (const auto& label : texts_in_group(svg, "cbticks"))
    EXPECT_THAT(label, Not(HasSubstr("nan")));
}

TEST(HeatmapSvg, NoPatternWithoutNaN) {
  EXPECT_THAT(valid_heatmaps_svg(arange_matrices(1, 1, 2, 2)), Not(HasSubstr("<pattern")));
}

TEST(HeatmapSvg, InfinitiesClampToTheEndColours) {
  const auto m = torch::tensor({0.0, kInf, -kInf, 1.0}, torch::kDouble).reshape({1, 1, 2, 2});
  const auto c = cells(valid_heatmaps_svg(m));
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].fill, "#fff5f0");
  EXPECT_EQ(c[1].fill, "#67000d");
  EXPECT_EQ(c[2].fill, "#fff5f0");
  EXPECT_EQ(c[3].fill, "#67000d");
}

TEST(HeatmapSvg, HandlesTheWidestDoubleRange) {
  const auto m = torch::tensor({-1e308, 1e308}, torch::kDouble).reshape({1, 1, 1, 2});
  const auto svg = valid_heatmaps_svg(m);
  const auto c = cells(svg);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].fill, "#fff5f0");
  EXPECT_EQ(c[1].fill, "#67000d");
  const auto labels = texts_in_group(svg, "cbticks");
  EXPECT_GE(labels.size(), 3u);
  EXPECT_LE(labels.size(), 5u);
  EXPECT_THAT(labels, Each(AllOf(Not(HasSubstr("inf")), Not(HasSubstr("nan")))));
}

// Found by the fuzzer: a constant 1e30 gave the scale a zero span (NaN colour
// fractions); a narrow range far from zero must not count ticks forever; a
// span of subnormals halved to zero (an infinite tick exponent).
TEST(HeatmapSvg, ConstantOrNarrowRangesFarFromZeroDraw) {
  constexpr double kDenormMin = std::numeric_limits<double>::denorm_min();
  const std::vector<std::pair<double, double>> ranges = {
      {1e30, 1e30},         {-1e300, -1e300},
      {1.7e308, 1.7e308},   {1e17, 1e17 + 16},
      {-1e20, -1e20 + 1e5}, {-kDenormMin, kDenormMin},
      {0.0, kDenormMin},    {kDenormMin, 3 * kDenormMin}};
  for (const auto& [lo, hi] : ranges) {
    const auto m = torch::tensor({lo, hi, kInf}, torch::kDouble).reshape({1, 1, 1, 3});
    const auto svg = valid_heatmaps_svg(m);
    const auto c = cells(svg);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[2].fill, "#67000d") << lo;
    EXPECT_THAT(texts_in_group(svg, "cbticks"),
                Each(AllOf(Not(HasSubstr("inf")), Not(HasSubstr("nan")))))
        << lo;
    EXPECT_GE(texts_in_group(svg, "cbticks").size(), 3u) << lo;
    EXPECT_THAT(d2l::heatmaps_ansi(m), Not(HasSubstr("nan"))) << lo;
  }
}

TEST(HeatmapSvg, AllNaNStillDraws) {
  const auto svg = valid_heatmaps_svg(torch::full({1, 1, 2, 2}, kNaN, torch::kDouble));
  EXPECT_THAT(cells(svg), Each(::testing::Field(&Cell::fill, "url(#d2l-heatmap-nan)")));
  EXPECT_GE(texts_in_group(svg, "cbticks").size(), 3u);
}

TEST(HeatmapSvg, TickLabelsAreIntegersThinnedToAtMostTen) {
  const auto svg = valid_heatmaps_svg(arange_matrices(1, 1, 3, 10));
  EXPECT_EQ(texts_in_group(svg, "xticks"),
            (std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}));
  EXPECT_EQ(texts_in_group(svg, "yticks"), (std::vector<std::string>{"0", "1", "2"}));

  const auto wide = valid_heatmaps_svg(arange_matrices(1, 1, 40, 100));
  EXPECT_EQ(texts_in_group(wide, "xticks"),
            (std::vector<std::string>{"0", "10", "20", "30", "40", "50", "60", "70", "80", "90"}));
  EXPECT_EQ(texts_in_group(wide, "yticks"), (std::vector<std::string>{"0", "10", "20", "30"}));

  const auto eleven = valid_heatmaps_svg(arange_matrices(1, 1, 1, 11));
  EXPECT_EQ(texts_in_group(eleven, "xticks"),
            (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
}

TEST(HeatmapSvg, ColourBarHasThreeToFiveRoundTicksInRange) {
  const std::vector<std::pair<double, double>> ranges = {
      {0, 1}, {0, 0.37}, {-3, 1234}, {0.12, 0.13}, {-1e-5, 2e-5},
      {7, 7}, {1, 6},    {0, 5.5},   {1e6, 1e6},   {-2.5, -2.4}};
  for (const auto& [lo, hi] : ranges) {
    const auto m = torch::tensor({lo, hi}, torch::kDouble).reshape({1, 1, 1, 2});
    const auto labels = texts_in_group(valid_heatmaps_svg(m), "cbticks");
    EXPECT_GE(labels.size(), 3u) << lo << ".." << hi;
    EXPECT_LE(labels.size(), 5u) << lo << ".." << hi;
    double previous = -kInf;
    for (const auto& label : labels) {
      const double v = std::stod(label);
      EXPECT_GT(v, previous);
      const double span = hi == lo ? 1.0 : hi - lo;
      const double low = hi == lo ? lo - 0.5 : lo;
      EXPECT_GE(v, low - 1e-9 * span) << label;
      EXPECT_LE(v, low + span + 1e-9 * span) << label;
      EXPECT_LE(label.size(), 10u) << label;  // round numbers, not 0.30000000000000004
      previous = v;
    }
  }
}

TEST(HeatmapSvg, LabelsGoOnTheOuterPanelsAndTitlesOnTheTopRow) {
  const auto svg = valid_heatmaps_svg(
      arange_matrices(2, 3, 4, 5),
      d2l::HeatmapOptions().xlabel("Keys").ylabel("Queries").titles({"h1", "h2", "h3"}));
  EXPECT_EQ(count(svg, "class=\"xlabel\""), 3u);
  EXPECT_EQ(count(svg, "class=\"ylabel\""), 2u);
  EXPECT_EQ(count(svg, "class=\"title\""), 3u);
  EXPECT_EQ(count(svg, "<g class=\"xticks\""), 3u);
  EXPECT_EQ(count(svg, "<g class=\"yticks\""), 2u);
  EXPECT_EQ(count(svg, ">Keys</text>"), 3u);
  EXPECT_EQ(count(svg, ">Queries</text>"), 2u);
  EXPECT_THAT(svg,
              AllOf(HasSubstr(">h1</text>"), HasSubstr(">h2</text>"), HasSubstr(">h3</text>")));
  EXPECT_THAT(svg, HasSubstr("rotate(-90)"));
}

TEST(HeatmapSvg, NoLabelElementsWhenNoneAreGiven) {
  const auto svg = valid_heatmaps_svg(arange_matrices(1, 2, 2, 2));
  EXPECT_THAT(svg, AllOf(Not(HasSubstr("class=\"xlabel\"")), Not(HasSubstr("class=\"ylabel\"")),
                         Not(HasSubstr("class=\"title\""))));
}

TEST(HeatmapSvg, EscapesUserText) {
  const auto svg = valid_heatmaps_svg(
      arange_matrices(1, 2, 2, 2),
      d2l::HeatmapOptions().titles({"a<b", "x&y>z"}).xlabel("\"q\"").ylabel("it's\x01"));
  EXPECT_THAT(svg, HasSubstr(">a&lt;b</text>"));
  EXPECT_THAT(svg, HasSubstr(">x&amp;y&gt;z</text>"));
  EXPECT_THAT(svg, HasSubstr(">&quot;q&quot;</text>"));
  EXPECT_THAT(svg, HasSubstr(">it&apos;s\xEF\xBF\xBD</text>"));
  EXPECT_THAT(svg, AllOf(Not(HasSubstr("a<b")), Not(HasSubstr("x&y")), Not(HasSubstr("\x01"))));
  EXPECT_EQ(nesting_error(svg), "");
}

TEST(HeatmapSvg, AcceptsReducedPrecisionAndIntegerDtypes) {
  // Small whole numbers are exact in every dtype, so the drawing is the same.
  const auto reference = arange_matrices(1, 2, 3, 4);
  const auto expected = valid_heatmaps_svg(reference);
  for (const auto dtype : {torch::kFloat, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kInt,
                           torch::kUInt8, torch::kInt8}) {
    EXPECT_EQ(valid_heatmaps_svg(reference.to(dtype)), expected) << c10::toString(dtype);
  }
}

TEST(HeatmapSvg, ReadsNonContiguousInput) {
  const auto m = torch::rand({2, 1, 3, 4}, torch::kDouble);
  const auto transposed = m.transpose(2, 3).contiguous().transpose(2, 3);
  ASSERT_FALSE(transposed.is_contiguous());
  EXPECT_EQ(valid_heatmaps_svg(transposed), valid_heatmaps_svg(m));
}

TEST(HeatmapSvg, LeavesTheInputUnchanged) {
  auto m = torch::rand({1, 2, 3, 4}).requires_grad_();
  const auto before = m.detach().clone();
  valid_heatmaps_svg(m);
  d2l::heatmaps_ansi(m);
  EXPECT_TRUE(torch::equal(m.detach(), before));
  EXPECT_TRUE(m.requires_grad());
  EXPECT_EQ(m.scalar_type(), torch::kFloat);
}

TEST(HeatmapErrors, RejectBadMatrices) {
  const auto svg = [](const torch::Tensor& m) {
    return error_message([&] { valid_heatmaps_svg(m); });
  };
  EXPECT_THAT(svg(torch::Tensor()),
              HasSubstr("d2l::heatmaps_svg: matrices must be a defined tensor"));
  EXPECT_THAT(svg(torch::rand({2, 10})),
              AllOf(StartsWith("d2l::heatmaps_svg: matrices must be a 4-D tensor"),
                    HasSubstr("got [2, 10]")));
  EXPECT_THAT(svg(torch::rand({1, 1, 2, 2, 2})), HasSubstr("got [1, 1, 2, 2, 2]"));
  EXPECT_THAT(svg(torch::ones({1, 1, 2, 2}, torch::kBool)),
              AllOf(StartsWith("d2l::heatmaps_svg: matrices must have a real"), HasSubstr("Bool")));
  EXPECT_THAT(
      svg(torch::ones({1, 1, 2, 2}, torch::kComplexFloat)),
      AllOf(StartsWith("d2l::heatmaps_svg: matrices must have a real"), HasSubstr("ComplexFloat")));
  for (const auto& shape : {std::vector<int64_t>{0, 1, 2, 2}, std::vector<int64_t>{1, 0, 2, 2},
                            std::vector<int64_t>{1, 1, 0, 2}, std::vector<int64_t>{1, 1, 2, 0}}) {
    EXPECT_THAT(svg(torch::rand(shape)),
                AllOf(StartsWith("d2l::heatmaps_svg: matrices must not be empty"),
                      HasSubstr(fmt::format("got [{}]", fmt::join(shape, ", ")))));
  }
}

TEST(HeatmapErrors, RejectBadOptions) {
  const auto m = arange_matrices(1, 2, 2, 2);
  const auto svg = [&](const d2l::HeatmapOptions& o) {
    return error_message([&] { valid_heatmaps_svg(m, o); });
  };
  EXPECT_THAT(svg(d2l::HeatmapOptions().titles({"a", "b", "c"})),
              HasSubstr("d2l::heatmaps_svg: titles has 3 entries for 2 columns"));
  EXPECT_THAT(svg(d2l::HeatmapOptions().titles({"a"})),
              HasSubstr("d2l::heatmaps_svg: titles has 1 entries for 2 columns"));
  EXPECT_THAT(svg(d2l::HeatmapOptions().cmap("jet")),
              AllOf(StartsWith("d2l::heatmaps_svg: cmap must be one of"),
                    HasSubstr("Reds, Blues, Greens, Greys, viridis"), HasSubstr("'jet'")));
  EXPECT_THAT(svg(d2l::HeatmapOptions().cmap("reds")), HasSubstr("got 'reds'"));
  for (const auto& figsize : {std::make_pair(0.0, 2.5), std::make_pair(2.5, -1.0),
                              std::make_pair(kNaN, 1.0), std::make_pair(1.0, kInf)}) {
    EXPECT_THAT(svg(d2l::HeatmapOptions().figsize(figsize)),
                AllOf(StartsWith("d2l::heatmaps_svg: figsize must be positive"),
                      HasSubstr(fmt::format("got ({}, {})", figsize.first, figsize.second))));
  }
}

TEST(HeatmapErrors, NameTheFunctionThatWasCalled) {
  const auto bad = torch::rand({2, 10});
  EXPECT_THAT(error_message([&] { d2l::heatmaps_ansi(bad); }),
              StartsWith("d2l::heatmaps_ansi: matrices must be a 4-D tensor"));
  EXPECT_THAT(error_message([&] {
                d2l::heatmaps_ansi(arange_matrices(1, 1, 2, 2), d2l::HeatmapOptions().cmap("jet"));
              }),
              StartsWith("d2l::heatmaps_ansi: cmap"));
  EXPECT_THAT(error_message([&] { d2l::show_heatmaps(bad, "x", "y", "unused.svg"); }),
              StartsWith("d2l::show_heatmaps: matrices must be a 4-D tensor"));
  EXPECT_THAT(error_message([&] {
                d2l::show_heatmaps(arange_matrices(1, 2, 2, 2), "x", "y", "unused.svg", {"t"});
              }),
              StartsWith("d2l::show_heatmaps: titles has 1 entries for 2 columns"));
}

}  // namespace
