// The SVG writer core of d2l::viz (src/viz/svg.cpp), seen through both of its
// users: show_heatmaps and save_plot report file errors in one style, and the
// heatmaps and the plots open their documents alike.

#include <d2l/viz.h>

#include <filesystem>
#include <regex>
#include <string>

#include "fifo_watchdog.h"
#include "test_utils.h"
#include "xml_checked.h"

namespace {

using d2l::testing::error_message;
using d2l::testing::valid_heatmaps_svg;
using d2l::testing::valid_plot_svg;

class SvgWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) / (std::string("d2l_svg_") + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// The messages of show_heatmaps and save_plot writing to `path`.
  static std::pair<std::string, std::string> errors_writing(const std::string& path) {
    return {error_message([&] {
              d2l::show_heatmaps(torch::ones({1, 1, 2, 2}), "x", "y", path);
            }),
            error_message([&] {
              d2l::save_plot({{{0, 1}, {0, 1}, "y", "-"}}, {}, path);
            })};
  }

  std::filesystem::path dir_;
};

TEST_F(SvgWriter, BothWritersNameThePathAndTheReason) {
  const auto path = (dir_ / "missing" / "figure.svg").string();
  const auto [heatmap, plot] = errors_writing(path);
  EXPECT_EQ(heatmap, "d2l::show_heatmaps: cannot write '" + path + "': No such file or directory");
  EXPECT_EQ(plot, "d2l::save_plot: cannot write '" + path + "': No such file or directory");
}

TEST_F(SvgWriter, ADirectoryIsNotWritten) {
  const auto [heatmap, plot] = errors_writing(dir_.string());
  EXPECT_EQ(heatmap, "d2l::show_heatmaps: cannot write '" + dir_.string() + "': Is a directory");
  EXPECT_EQ(plot, "d2l::save_plot: cannot write '" + dir_.string() + "': Is a directory");
}

// /dev/full accepts the open and fails when the buffered text is flushed: the
// error must not be lost on close.
TEST_F(SvgWriter, AFifoThatNoProcessReadsIsRefusedWithoutBlocking) {
  using d2l::testing::FifoWatchdog;
  const auto path = (dir_ / "figure.svg").string();
  d2l::testing::make_fifo(path);
  FifoWatchdog watchdog(path, FifoWatchdog::Side::kWriter);
  const auto [heatmap, plot] = errors_writing(path);
  EXPECT_FALSE(watchdog.finish()) << "the FIFO's writer blocked";
  const std::string reason = "': it is a FIFO (named pipe) that no process reads";
  EXPECT_EQ(heatmap, "d2l::show_heatmaps: cannot write '" + path + reason);
  EXPECT_EQ(plot, "d2l::save_plot: cannot write '" + path + reason);
}

TEST_F(SvgWriter, AFailedFlushIsReported) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  const auto [heatmap, plot] = errors_writing("/dev/full");
  EXPECT_EQ(heatmap, "d2l::show_heatmaps: cannot write '/dev/full': No space left on device");
  EXPECT_EQ(plot, "d2l::save_plot: cannot write '/dev/full': No space left on device");
}

TEST(SvgDocuments, HeatmapsAndPlotsShareFontsAndBackground) {
  const auto heatmap = valid_heatmaps_svg(torch::ones({1, 1, 2, 2}));
  const auto plot = valid_plot_svg({{{0, 1}, {0, 1}, "", "-"}});
  const std::regex root(R"re(<svg [^>]*( font-family="[^"]+" font-size="9")>\n)re");
  std::smatch heatmap_root, plot_root;
  ASSERT_TRUE(std::regex_search(heatmap, heatmap_root, root));
  ASSERT_TRUE(std::regex_search(plot, plot_root, root));
  EXPECT_EQ(heatmap_root[1], plot_root[1]);
  const std::string background =
      ">\n<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  EXPECT_THAT(heatmap, ::testing::HasSubstr(background));
  EXPECT_THAT(plot, ::testing::HasSubstr(background));
}

}  // namespace
