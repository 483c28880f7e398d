// d2l::heatmaps_svg with the tokens of a sentence as tick labels
// (HeatmapOptions::xticklabels, yticklabels), as the book's Transformer
// section draws its attention: every label written, escaped, the x labels
// upright and clear of the axis label, and wrong counts refused.

#include <regex>
#include <string>
#include <vector>

#include "heatmap_helpers.h"
#include "xml_checked.h"

namespace {

using namespace d2l::testing::heatmap;
using d2l::testing::valid_heatmaps_svg;
using ::testing::HasSubstr;

const std::vector<std::string> kKeys = {"i'm", "home", ".", "<eos>"};
const std::vector<std::string> kQueries = {"je", "suis", "chez", "moi", ".", "<eos>"};

TEST(HeatmapLabels, TokensAreTheTickLabels) {
  const auto svg = valid_heatmaps_svg(
      arange_matrices(2, 2, 6, 4),
      d2l::HeatmapOptions().xticklabels(kKeys).yticklabels(kQueries).xlabel("Keys"));
  EXPECT_EQ(texts_in_group(svg, "xticks"),
            (std::vector<std::string>{"i&apos;m", "home", ".", "&lt;eos&gt;"}));
  EXPECT_EQ(texts_in_group(svg, "yticks"),
            (std::vector<std::string>{"je", "suis", "chez", "moi", ".", "&lt;eos&gt;"}));
  // On the outer panels only, as the indices are.
  EXPECT_EQ(count(svg, "<g class=\"xticks\""), 2u);
  EXPECT_EQ(count(svg, "<g class=\"yticks\""), 2u);
  // The column labels stand upright, ending at the ticks.
  EXPECT_THAT(svg, HasSubstr("<g class=\"xticks\" text-anchor=\"end\">"));
  EXPECT_EQ(count(svg, "rotate(-90)\" dy=\"0.35em\">"), 2u * kKeys.size());
}

// The axis label goes below the longest upright token, and the document
// grows to hold it: nothing is drawn outside the view box.
TEST(HeatmapLabels, LongTokensPushTheAxisLabelDown) {
  const auto height_and_xlabel = [](const std::vector<std::string>& keys) {
    const auto svg = valid_heatmaps_svg(
        arange_matrices(1, 1, 2, 4), d2l::HeatmapOptions().xticklabels(keys).xlabel("Keys"));
    std::smatch m;
    EXPECT_TRUE(std::regex_search(svg, m, std::regex(R"re(height="([0-9.]+)pt")re")));
    const double height = std::stod(m[1]);
    EXPECT_TRUE(std::regex_search(svg, m, std::regex(R"re(class="xlabel" x="[0-9.]+" y="([0-9.]+)")re")));
    return std::make_pair(height, std::stod(m[1]));
  };
  const auto [short_height, short_y] = height_and_xlabel({"a", "b", "c", "d"});
  const auto [long_height, long_y] =
      height_and_xlabel({"a", "anticonstitutionnellement", "c", "d"});
  EXPECT_GT(long_y, short_y + 60);
  EXPECT_GT(long_height, short_height + 60);
}

TEST(HeatmapLabels, WrongCountsNameTheOptionAndShape) {
  const auto m = arange_matrices(1, 2, 6, 4);
  EXPECT_THAT(error_message([&] {
                d2l::heatmaps_svg(m, d2l::HeatmapOptions().xticklabels({"a", "b"}));
              }),
              HasSubstr("d2l::heatmaps_svg: xticklabels has 2 entries for matrices [1, 2, 6, 4] "
                        "with 4 columns"));
  EXPECT_THAT(error_message([&] {
                d2l::heatmaps_svg(m, d2l::HeatmapOptions().yticklabels(kKeys));
              }),
              HasSubstr("yticklabels has 4 entries for matrices [1, 2, 6, 4] with 6 rows"));
}

// Without labels, the indices as before: the same document as with none given.
TEST(HeatmapLabels, EmptyLabelsAreTheIndices) {
  const auto m = arange_matrices(1, 2, 6, 4);
  EXPECT_EQ(d2l::heatmaps_svg(m, d2l::HeatmapOptions().xlabel("k")),
            d2l::heatmaps_svg(m, d2l::HeatmapOptions().xlabel("k").xticklabels({}).yticklabels({})));
}

}  // namespace
