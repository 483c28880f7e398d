// d2l::show_heatmaps: the file it writes, and what it does when it cannot.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "heatmap_helpers.h"
#include "xml_checked.h"

namespace {

using namespace d2l::testing::heatmap;
using d2l::testing::valid_heatmaps_svg;
using ::testing::StartsWith;

class ShowHeatmaps : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        std::filesystem::path(::testing::TempDir()) / (std::string("d2l_heatmap_") + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string read(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::filesystem::path dir_;
};

TEST_F(ShowHeatmaps, WritesTheSvgOfTheSameOptions) {
  const auto m = torch::rand({2, 2, 3, 5});
  const auto path = dir_ / "weights.svg";
  d2l::show_heatmaps(m, "Keys", "Queries", path.string(), {"a", "b"}, {3.0, 2.0}, "viridis");
  const auto expected = valid_heatmaps_svg(m, d2l::HeatmapOptions()
                                                  .xlabel("Keys")
                                                  .ylabel("Queries")
                                                  .titles({"a", "b"})
                                                  .figsize({3.0, 2.0})
                                                  .cmap("viridis"));
  EXPECT_EQ(read(path), expected);
}

TEST_F(ShowHeatmaps, OverwritesAnExistingFile) {
  const auto path = dir_ / "weights.svg";
  std::ofstream(path) << std::string(100000, 'x');
  const auto m = arange_matrices(1, 1, 2, 2);
  d2l::show_heatmaps(m, "", "", path.string());
  EXPECT_EQ(read(path), valid_heatmaps_svg(m));
}

TEST_F(ShowHeatmaps, ThrowsNamingAnUnwritablePath) {
  const auto path = (dir_ / "missing" / "weights.svg").string();
  EXPECT_THAT(
      error_message([&] { d2l::show_heatmaps(arange_matrices(1, 1, 2, 2), "x", "y", path); }),
      StartsWith("d2l::show_heatmaps: cannot write '" + path + "': "));
}

TEST_F(ShowHeatmaps, BadInputCreatesNoFile) {
  const auto path = dir_ / "weights.svg";
  EXPECT_THAT(error_message([&] {
                d2l::show_heatmaps(torch::rand({2, 2}), "x", "y", path.string());
              }),
              StartsWith("d2l::show_heatmaps"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
