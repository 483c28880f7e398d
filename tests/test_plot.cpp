// d2l::plot_svg: what the SVG holds (lines, ticks, legend, escaping) and the
// errors for data it cannot draw.

#include <d2l/viz/plot.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "test_utils.h"
#include "xml_checked.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::svg_problem;
using d2l::testing::valid_plot_svg;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> all_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  std::vector<std::string> found;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    found.push_back((*it)[1]);
  }
  return found;
}

// Number of points of each polyline, in document order.
std::vector<size_t> polyline_sizes(const std::string& svg) {
  std::vector<size_t> sizes;
  for (const auto& points : all_matches(svg, "<polyline[^>]* points=\"([^\"]*)\"")) {
    std::istringstream in(points);
    std::string point;
    size_t n = 0;
    while (in >> point) ++n;
    sizes.push_back(n);
  }
  return sizes;
}

std::vector<std::string> tick_labels(const std::string& svg, const std::string& axis) {
  return all_matches(svg, "<text [^>]*class=\"" + axis + "tick\">(.*?)</text>");
}

d2l::Series line(std::vector<double> x, std::vector<double> y, std::string label = "",
                 std::string style = "-") {
  return {std::move(x), std::move(y), std::move(label), std::move(style)};
}

TEST(Plot, OnePolylinePointPerDataPoint) {
  const auto svg = valid_plot_svg({line({0, 1, 2, 3, 4}, {1, 3, 2, 5, 4})});
  EXPECT_EQ(
      svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"252.00\" height=\"180.00\"", 0),
      0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_THAT(polyline_sizes(svg), ElementsAre(5));
  EXPECT_EQ(all_matches(svg, "(<circle)").size(), 0u);
}

TEST(Plot, NaNAndInfinitePointsLeaveGaps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto svg =
      valid_plot_svg({line({0, 1, 2, 3, 4, 5, 6}, {1, 2, nan, 4, 5, 6, inf}, "", "-o")});
  EXPECT_THAT(polyline_sizes(svg), ElementsAre(2, 3));
  EXPECT_EQ(all_matches(svg, "(<circle class=\"marker\")").size(), 5u);
  // A lone point between gaps is drawn as a marker only.
  const auto points = valid_plot_svg({line({0, 1, 2}, {nan, 1, nan}, "", "o")});
  EXPECT_TRUE(polyline_sizes(points).empty());
  EXPECT_EQ(all_matches(points, "(<circle class=\"marker\")").size(), 1u);
}

TEST(Plot, TicksFollowOneTwoFiveSteps) {
  const auto options =
      d2l::PlotOptions().xlim(d2l::PlotOptions::Range(0, 5)).ylim(d2l::PlotOptions::Range(-1, 5));
  const auto svg = valid_plot_svg({line({0, 5}, {0, 1})}, options);
  EXPECT_THAT(tick_labels(svg, "x"), ElementsAre("0", "1", "2", "3", "4", "5"));
  EXPECT_THAT(tick_labels(svg, "y"), ElementsAre("-1", "0", "1", "2", "3", "4", "5"));
  const auto fine =
      valid_plot_svg({line({0, 1}, {0, 1})}, d2l::PlotOptions()
                                                 .xlim(d2l::PlotOptions::Range(0, 1))
                                                 .ylim(d2l::PlotOptions::Range(0.1, 0.13)));
  EXPECT_THAT(tick_labels(fine, "x"), ElementsAre("0.0", "0.2", "0.4", "0.6", "0.8", "1.0"));
  EXPECT_THAT(tick_labels(fine, "y"),
              ElementsAre("0.100", "0.105", "0.110", "0.115", "0.120", "0.125", "0.130"));
  const auto wide = valid_plot_svg({line({1, 5}, {0, 1200})},
                                   d2l::PlotOptions().ylim(d2l::PlotOptions::Range(0, 1200)));
  EXPECT_THAT(tick_labels(wide, "y"), ElementsAre("0", "200", "400", "600", "800", "1000", "1200"));
}

TEST(Plot, DefaultLimitsAddMarginsAroundTheData) {
  // Data 1..5 plus 5% margins: ticks 1..5 all fall inside [0.8, 5.2].
  const auto svg = valid_plot_svg({line({1, 2, 3, 4, 5}, {10, 20, 30, 40, 50})});
  EXPECT_THAT(tick_labels(svg, "x"), ElementsAre("1", "2", "3", "4", "5"));
  EXPECT_THAT(tick_labels(svg, "y"), ElementsAre("10", "20", "30", "40", "50"));
  // A single point still gets an axis.
  EXPECT_THAT(tick_labels(valid_plot_svg({line({2}, {3})}), "x"),
              ElementsAre("1.0", "1.5", "2.0", "2.5", "3.0"));
}

TEST(Plot, LogScaleTicksAndErrors) {
  const auto options = d2l::PlotOptions().yscale("log");
  const auto svg = valid_plot_svg({line({1, 2, 3, 4}, {1000, 10, 0.5, 0.01}, "loss")}, options);
  EXPECT_THAT(tick_labels(svg, "y"),
              ElementsAre(HasSubstr(">-2<"), HasSubstr(">-1<"), HasSubstr(">0<"), HasSubstr(">1<"),
                          HasSubstr(">2<"), HasSubstr(">3<")));
  EXPECT_THAT(tick_labels(svg, "y")[0], HasSubstr("10<tspan"));
  const auto two_decades = valid_plot_svg({line({1, 2}, {4, 0.03})}, options);
  EXPECT_THAT(tick_labels(two_decades, "y"),
              ElementsAre("0.05", "0.1", "0.2", "0.5", "1", "2", "5"));
  const auto narrow = valid_plot_svg({line({1, 2}, {2, 7})}, options);
  EXPECT_THAT(tick_labels(narrow, "y"), ElementsAre("2", "5"));
  EXPECT_THAT(
      error_message([&] {
        valid_plot_svg({line({1, 2, 3}, {1, 0.5, 0}, "loss")}, options);
      }),
      HasSubstr("d2l::plot_svg: yscale \"log\" needs positive y values, got 0 at index 2 of "
                "series 0 (\"loss\")"));
  EXPECT_THAT(error_message([&] { valid_plot_svg({line({1}, {-3})}, options); }),
              HasSubstr("got -3 at index 0 of series 0"));
  EXPECT_THAT(error_message([&] {
                valid_plot_svg({line({1}, {3})}, d2l::PlotOptions().yscale("log").ylim(
                                                     d2l::PlotOptions::Range(0, 1)));
              }),
              HasSubstr("d2l::plot_svg: ylim must be finite with lower < upper and positive on a "
                        "log axis, got (0, 1)"));
  EXPECT_THAT(error_message([&] { valid_plot_svg({}, d2l::PlotOptions().yscale("symlog")); }),
              HasSubstr("d2l::plot_svg: yscale must be \"linear\" or \"log\", got \"symlog\""));
}

TEST(Plot, LegendListsLabelledSeriesWithDistinctColours) {
  const auto svg =
      valid_plot_svg({line({0, 1}, {0, 1}, "Truth"), line({0, 1}, {1, 0}, "Pred", "m--"),
                      line({0, 1}, {1, 1}), line({0, 1}, {0.5, 0.5}, "Data", "o")});
  const auto legend = svg.substr(svg.find("<g class=\"legend\">"));
  EXPECT_THAT(all_matches(legend, "class=\"entry\">([^<]*)</text>"),
              ElementsAre("Truth", "Pred", "Data"));
  // Explicit colours ("m") leave the cycle alone, as in matplotlib.
  EXPECT_THAT(all_matches(svg, "<polyline class=\"line\" stroke=\"([^\"]*)\""),
              ElementsAre("#1f77b4", "#bf00bf", "#ff7f0e"));
  EXPECT_THAT(svg, HasSubstr("stroke=\"#bf00bf\" stroke-dasharray=\"5.5,2.4\""));
  EXPECT_THAT(all_matches(svg, "<circle [^>]*fill=\"([^\"]*)\""), Not(::testing::IsEmpty()));
  EXPECT_EQ(all_matches(svg, "<circle [^>]*fill=\"([^\"]*)\"")[0], "#2ca02c");
  EXPECT_THAT(valid_plot_svg({line({0, 1}, {0, 1})}), Not(HasSubstr("legend")));
}

TEST(Plot, TextIsEscaped) {
  const auto options = d2l::PlotOptions().xlabel("x < 5 & y > 1").ylabel("'loss'").title("\"fit\"");
  const auto svg = valid_plot_svg({line({0, 1}, {0, 1}, "a<b>")}, options);
  EXPECT_THAT(svg, HasSubstr(">x &lt; 5 &amp; y &gt; 1</text>"));
  EXPECT_THAT(svg, HasSubstr(">&apos;loss&apos;</text>"));
  EXPECT_THAT(svg, HasSubstr(">&quot;fit&quot;</text>"));
  EXPECT_THAT(svg, HasSubstr(">a&lt;b&gt;</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("a<b>")));
  // Control characters are not allowed in XML 1.0: they become U+FFFD.
  const auto control = valid_plot_svg({line({0, 1}, {0, 1})}, d2l::PlotOptions().title("a\x01"
                                                                                       "b"));
  EXPECT_THAT(control, HasSubstr(">a\xEF\xBF\xBD"
                                 "b</text>"));
  EXPECT_THAT(control, Not(HasSubstr("\x01")));
}

TEST(Plot, GridAndFigsizeOptions) {
  const auto with_grid = valid_plot_svg({line({0, 1}, {0, 1})});
  const auto without = valid_plot_svg({line({0, 1}, {0, 1})}, d2l::PlotOptions().grid(false));
  EXPECT_GT(all_matches(with_grid, "(class=\"grid\"/>)").size(), 0u);
  EXPECT_EQ(all_matches(without, "(class=\"grid\"/>)").size(), 0u);
  const auto big = valid_plot_svg({line({0, 1}, {0, 1})},
                                  d2l::PlotOptions().figsize(d2l::PlotOptions::Size(6, 3)));
  EXPECT_THAT(big, HasSubstr("width=\"432.00\" height=\"216.00\""));
}

TEST(Plot, RejectsBadSeriesAndOptions) {
  EXPECT_THAT(error_message([] {
                valid_plot_svg({line({0, 1}, {0}), line({0, 1, 2}, {0, 1}, "b")});
              }),
              HasSubstr("d2l::plot_svg: series 0 has 2 x values but 1 y values"));
  EXPECT_THAT(error_message([] {
                valid_plot_svg({line({0}, {0}), line({0, 1, 2}, {0, 1}, "b")});
              }),
              HasSubstr("d2l::plot_svg: series 1 (\"b\") has 3 x values but 2 y values"));
  EXPECT_THAT(error_message([] { valid_plot_svg({line({0}, {0}, "fit", "x-")}); }),
              HasSubstr("d2l::plot_svg: series 0 (\"fit\") has an unknown style \"x-\""));
  EXPECT_THAT(error_message([] {
                valid_plot_svg({}, d2l::PlotOptions().xlim(d2l::PlotOptions::Range(5, 0)));
              }),
              HasSubstr("d2l::plot_svg: xlim must be finite with lower < upper, got (5, 0)"));
  EXPECT_THAT(
      error_message(
          [] { valid_plot_svg({}, d2l::PlotOptions().figsize(d2l::PlotOptions::Size(0, 2))); }),
      HasSubstr(
          "d2l::plot_svg: figsize must be positive and finite, at most 1000 inches, got (0, 2)"));
}

TEST(Plot, SavePlotWritesTheDocumentOrNamesThePath) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = (dir / "d2l_test_plot.svg").string();
  const std::vector<d2l::Series> series = {line({0, 1}, {0, 1}, "y")};
  d2l::save_plot(series, {}, path);
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  EXPECT_EQ(content.str(), valid_plot_svg(series));
  std::remove(path.c_str());
  const auto missing = (dir / "d2l_no_such_dir" / "plot.svg").string();
  EXPECT_THAT(error_message([&] { d2l::save_plot(series, {}, missing); }),
              ::testing::StartsWith("d2l::save_plot: cannot write '" + missing + "': "));
}

}  // namespace
