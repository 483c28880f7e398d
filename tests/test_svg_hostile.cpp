// The writers of d2l::viz under hostile input: every SVG they return is
// well-formed XML in valid UTF-8 with no NaN or infinity written as a number
// (tests/xml_helpers.h), for any double, any byte string and any figsize; and
// what they refuse, they refuse with a c10::Error naming the function.

#include <d2l/viz.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "test_utils.h"
#include "viz/svg.h"
#include "xml_helpers.h"

namespace {

using d2l::testing::svg_problem;
using d2l::testing::utf8_problem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using Limits = std::numeric_limits<double>;
constexpr double kNaN = Limits::quiet_NaN();
constexpr double kInf = Limits::infinity();
constexpr double kEps = Limits::epsilon();

// Byte strings that are not valid UTF-8 or not allowed in XML 1.0, and
// characters XML needs escaped.
const std::vector<std::string> kHostileText = {"\xff",         "\xc3",
                                               "ab\xe2\x82",   "\xed\xa0\x80",
                                               "\xc0\xaf",     "\xf4\x90\x80\x80",
                                               "\xef\xbf\xbe", "\xef\xbf\xbf",
                                               "a\x01z",       std::string("a\0z", 3),
                                               "\x1b[2J",      "<&>\"'",
                                               "]]>",          "\x7f\xc2\x85",
                                               "\x80\x80",     "\xf0\x9f\x98\x80 ok",
                                               "caf\xc3\xa9",  "nan inf -inf",
                                               "\t\n\r",       ""};

// Runs `write`: the SVG it returns must pass svg_problem; anything it throws
// must be a c10::Error naming `fn`.
template <typename Write>
void expect_valid_or_refused(const char* fn, Write&& write, const std::string& what) {
  try {
    const std::string svg = write();
    EXPECT_EQ(svg_problem(svg), "") << what;
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), StartsWith(std::string(fn) + ": ")) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": not a c10::Error: " << e.what();
  }
}

std::string describe(std::vector<double> values) {
  std::string out;
  for (const double v : values) out += fmt::format("{} ", v);
  return out;
}

TEST(XmlEscape, ReplacesWhatXmlOrUtf8ForbidsAndEscapesTheRest) {
  const std::string r = "\xef\xbf\xbd";  // U+FFFD
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xff", r},
      {"\xc3", r},
      {"ab\xe2\x82", "ab" + r + r},
      {"\xed\xa0\x80", r + r + r},
      {"\xc0\xaf", r + r},
      {"\xf4\x90\x80\x80", r + r + r + r},
      {"\xef\xbf\xbe", r},
      {"\xef\xbf\xbf", r},
      {"a\x01z", "a" + r + "z"},
      {std::string("a\0z", 3), "a" + r + "z"},
      {"<&>\"'", "&lt;&amp;&gt;&quot;&apos;"},
      {"\t\n\r", "\t\n\r"},
      {"\x7f\xc2\x85", "\x7f\xc2\x85"},
      {"caf\xc3\xa9 \xf0\x9f\x98\x80", "caf\xc3\xa9 \xf0\x9f\x98\x80"},
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(d2l::detail::xml_escape(in), out) << in;
}

TEST(SvgHostile, PlotDrawsEveryPairOfHostileDoubles) {
  for (const double a : d2l::testing::hostile_doubles()) {
    for (const double b : d2l::testing::hostile_doubles()) {
      const std::vector<std::vector<double>> ys = {{a, b}, {a, b, a}, {a, a}, {b, 2.0, a}};
      for (const auto& y : ys) {
        std::vector<double> x(y.size());
        for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<double>(k);
        const auto what = "y = " + describe(y);
        expect_valid_or_refused(
            "d2l::plot_svg",
            [&] {
              return d2l::plot_svg({{x, y, "s", "-o"}});
            },
            what);
        expect_valid_or_refused(
            "d2l::plot_svg",
            [&] {
              return d2l::plot_svg({{y, x, "s", "--"}});
            },
            "x: " + what);
      }
    }
  }
}

// A constant series far from zero, values equal up to rounding and subnormal
// spans: drawn with ticks, not refused, not NaN (and no std::bad_alloc).
TEST(SvgHostile, PlotDegenerateRangesDrawWithTicks) {
  const std::vector<std::vector<double>> ys = {{1e300, 1e300},
                                               {-1e300, -1e300},
                                               {Limits::max(), Limits::max()},
                                               {1.0, 1 + kEps},
                                               {1e17, 1e17 + 16},
                                               {Limits::denorm_min(), 0.0},
                                               {-Limits::denorm_min(), Limits::denorm_min()},
                                               {Limits::lowest(), Limits::max()},
                                               {1e-310, 2e-310}};
  for (const auto& y : ys) {
    std::string svg;
    EXPECT_NO_THROW(svg = d2l::plot_svg({{{0.0, 1.0}, y, "", "-"}})) << describe(y);
    EXPECT_EQ(svg_problem(svg), "") << describe(y);
    EXPECT_THAT(svg, HasSubstr("class=\"ytick\"")) << describe(y);
    EXPECT_THAT(svg, HasSubstr("<polyline")) << describe(y);
  }
}

TEST(SvgHostile, PlotLogAxisOverTheWholeDoubleRange) {
  const std::vector<double> positive = {
      Limits::denorm_min(), 1e-310, Limits::min(), 1e-300, 1.0, 1 + kEps, 1e300, 1e308,
      Limits::max(),        kInf,   kNaN};
  for (const double a : positive) {
    for (const double b : positive) {
      const std::vector<double> y = {a, b};
      expect_valid_or_refused(
          "d2l::plot_svg",
          [&] {
            return d2l::plot_svg({{{0.0, 1.0}, y, "", "-o"}}, d2l::PlotOptions().yscale("log"));
          },
          "log y = " + describe(y));
    }
  }
}

// Explicit limits far from the data: lines leave the plot, clipped, with no
// coordinate of 1e308 / 1e-300 (infinite) on screen.
TEST(SvgHostile, PlotExplicitLimitsAnyDataAnyLimits) {
  const std::vector<double> finite = {
      Limits::lowest(), -1e300, -1.0,     0.0,   Limits::denorm_min(),
      1e-300,           1.0,    1 + kEps, 1e300, Limits::max()};
  const std::vector<double> data = {-1e308, 0.5, 1e308, kInf, 0.25, Limits::max()};
  for (const double lo : finite) {
    for (const double hi : finite) {
      const auto options =
          d2l::PlotOptions().xlim(std::make_pair(lo, hi)).ylim(std::make_pair(lo, hi));
      expect_valid_or_refused(
          "d2l::plot_svg",
          [&] {
            return d2l::plot_svg({{{0.0, 1e308, -1e308, 0.5, 0.25, 1.0}, data, "d", "-o"}},
                                 options);
          },
          fmt::format("limits ({}, {})", lo, hi));
    }
  }
}

TEST(SvgHostile, PlotRefusesTooNarrowLimitsWithACError) {
  const auto message = d2l::testing::error_message(
      [] { d2l::plot_svg({}, d2l::PlotOptions().xlim(std::make_pair(1.0, 1 + kEps))); });
  EXPECT_THAT(message, StartsWith("d2l::plot_svg: xlim must span at least a billionth"));
  EXPECT_THAT(message, HasSubstr("got (1, 1.0000000000000002)"));
}

// Far outside the limits, a line keeps its direction up to the plot's edge.
TEST(SvgHostile, PlotClipsALineToTheLimitsKeepingItsDirection) {
  const auto options =
      d2l::PlotOptions().xlim(std::make_pair(0.0, 1.0)).ylim(std::make_pair(0.0, 1.0));
  const auto far = d2l::plot_svg({{{0.0, 1e300}, {0.0, 1e300}, "", "-"}}, options);
  const auto near = d2l::plot_svg({{{0.0, 3.0}, {0.0, 3.0}, "", "-"}}, options);
  EXPECT_EQ(svg_problem(far), "");
  EXPECT_EQ(far, near);  // both clipped where the diagonal leaves the outer box
}

TEST(SvgHostile, PlotEmptyIshSeries) {
  const std::vector<std::vector<d2l::Series>> cases = {
      {},
      {{{}, {}, "empty", "-"}},
      {{{kNaN, kNaN}, {1.0, 2.0}, "nan", "-o"}},
      {{{1.0}, {kInf}, "inf", "o"}},
      {{{1.0}, {2.0}, "one", "-o"}},
      {{{0.0, 1.0}, {kNaN, 1.0}, "", "-"}, {{}, {}, "", "o"}}};
  for (const auto& series : cases) {
    for (const std::string scale : {"linear", "log"}) {
      std::string svg;
      EXPECT_NO_THROW(svg = d2l::plot_svg(series, d2l::PlotOptions().yscale(scale)));
      EXPECT_EQ(svg_problem(svg), "") << series.size() << " " << scale;
    }
  }
}

TEST(SvgHostile, FigsizeIsCheckedByBothWriters) {
  const std::vector<double> sizes = {kNaN,   kInf,  -kInf,  0.0,    -1.0,
                                     -0.0,   1e300, 1e308,  1000.5, Limits::denorm_min(),
                                     1e-300, 0.01,  1000.0, 3.0};
  for (const double w : sizes) {
    for (const double h : {3.0, w}) {
      const auto what = fmt::format("figsize ({}, {})", w, h);
      expect_valid_or_refused(
          "d2l::plot_svg",
          [&] {
            return d2l::plot_svg({{{0, 1}, {0, 1}, "a", "-"}}, d2l::PlotOptions().figsize({w, h}));
          },
          what);
      expect_valid_or_refused(
          "d2l::heatmaps_svg",
          [&] {
            return d2l::heatmaps_svg(torch::rand({2, 2, 3, 4}),
                                     d2l::HeatmapOptions().figsize({w, h}));
          },
          what);
    }
  }
  EXPECT_THAT(d2l::testing::error_message([] {
                d2l::plot_svg({}, d2l::PlotOptions().figsize({1e300, 2.0}));
              }),
              HasSubstr("at most 1000 inches, got (1e+300, 2)"));
}

TEST(SvgHostile, PlotTextFromAnyBytesIsValidUtf8) {
  for (const auto& text : kHostileText) {
    const auto options = d2l::PlotOptions().title(text).xlabel(text).ylabel(text);
    std::string svg;
    EXPECT_NO_THROW(svg = d2l::plot_svg({{{0, 1}, {0, 1}, text, "-"}}, options));
    EXPECT_EQ(svg_problem(svg), "") << text;
  }
}

TEST(SvgHostile, HeatmapDrawsEveryPairOfHostileDoubles) {
  for (const double a : d2l::testing::hostile_doubles()) {
    for (const double b : d2l::testing::hostile_doubles()) {
      const auto m = torch::tensor({a, b, a, 0.5}, torch::kDouble).reshape({1, 1, 2, 2});
      const auto what = describe({a, b});
      std::string svg, ansi;
      EXPECT_NO_THROW(svg = d2l::heatmaps_svg(m)) << what;
      EXPECT_EQ(svg_problem(svg), "") << what;
      const auto constant = torch::tensor({a, b}, torch::kDouble).reshape({1, 2, 1, 1});
      EXPECT_EQ(svg_problem(d2l::heatmaps_svg(constant)), "") << what;
      EXPECT_NO_THROW(ansi = d2l::heatmaps_ansi(m)) << what;
      EXPECT_EQ(utf8_problem(ansi), "") << what;
    }
  }
}

TEST(SvgHostile, HeatmapTextFromAnyBytesIsValidUtf8) {
  for (const auto& text : kHostileText) {
    const auto options = d2l::HeatmapOptions().xlabel(text).ylabel(text).titles({text, text});
    const auto m = torch::rand({1, 2, 2, 3});
    EXPECT_EQ(svg_problem(d2l::heatmaps_svg(m, options)), "") << text;
    const auto ansi = d2l::heatmaps_ansi(m, options);
    EXPECT_EQ(utf8_problem(ansi), "") << text;
    // The only escape sequences are the colours: none from the user's text.
    EXPECT_THAT(ansi, Not(HasSubstr("\x1b[2J"))) << text;
    EXPECT_THAT(ansi, Not(HasSubstr("\xc2\x85"))) << text;
  }
}

}  // namespace
