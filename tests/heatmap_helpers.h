#pragma once

// Helpers of the heatmap test files (test_heatmap*.cpp, test_show_heatmaps.cpp):
// reading cells, labels and structure back out of the SVG.

#include <d2l/viz/heatmap.h>

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "test_utils.h"

namespace d2l::testing::heatmap {

using d2l::testing::error_message;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++n;
  }
  return n;
}

struct Cell {
  std::string fill;
  std::string title;
};

/// The cell rects in document order (panel by panel, row-major in each).
inline std::vector<Cell> cells(const std::string& svg) {
  static const std::regex cell_re(
      R"re(<rect class="cell" [^>]*fill="([^"]+)"><title>([^<]*)</title></rect>)re");
  std::vector<Cell> out;
  for (std::sregex_iterator it(svg.begin(), svg.end(), cell_re), end; it != end; ++it) {
    out.push_back({(*it)[1], (*it)[2]});
  }
  return out;
}

struct Rgb {
  int r, g, b;
};

inline Rgb parse_hex(const std::string& fill) {
  EXPECT_THAT(fill, ::testing::MatchesRegex("#[0-9a-f]{6}"));
  const auto channel = [&](int k) { return std::stoi(fill.substr(1 + 2 * k, 2), nullptr, 16); };
  return {channel(0), channel(1), channel(2)};
}

/// The text of every <text> element inside the first <g class="NAME">.
inline std::vector<std::string> texts_in_group(const std::string& svg, const std::string& name) {
  const auto begin = svg.find("<g class=\"" + name + "\"");
  if (begin == std::string::npos) return {};
  const auto end = svg.find("</g>", begin);
  const std::string group = svg.substr(begin, end - begin);
  static const std::regex text_re(R"(<text[^>]*>([^<]*)</text>)");
  std::vector<std::string> out;
  for (std::sregex_iterator it(group.begin(), group.end(), text_re), e; it != e; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

/// Empty if every element is closed in order; else what went wrong.
inline std::string nesting_error(const std::string& svg) {
  std::vector<std::string> open;
  for (size_t pos = svg.find('<'); pos != std::string::npos; pos = svg.find('<', pos + 1)) {
    const size_t close = svg.find('>', pos);
    if (close == std::string::npos) return "unterminated tag";
    const std::string tag = svg.substr(pos + 1, close - pos - 1);
    if (tag.empty() || tag[0] == '?') continue;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) {
        return "unexpected </" + tag.substr(1) + ">";
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

inline torch::Tensor arange_matrices(int64_t rows, int64_t cols, int64_t h, int64_t w) {
  return torch::arange(rows * cols * h * w, torch::kDouble).reshape({rows, cols, h, w});
}

}  // namespace d2l::testing::heatmap
