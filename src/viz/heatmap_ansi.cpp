// heatmaps_ansi: a preview of the heatmaps for a terminal in 24-bit colour,
// with the SVG's colours (heatmap_data.h).

#include <d2l/viz/heatmap.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "heatmap_data.h"
#include "svg.h"

namespace d2l {
namespace {

using namespace detail::heatmap;
using Buffer = fmt::memory_buffer;

constexpr std::string_view kReset = "\x1b[0m";

void append_background(Buffer& out, Rgb c, std::string_view text) {
  fmt::format_to(std::back_inserter(out), "\x1b[48;2;{};{};{}m{}", c.r, c.g, c.b, text);
}

/// `text` cut or padded to `width` terminal columns, one per code point.
std::string fit(std::string_view text, size_t width) {
  const auto starts = [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; };
  const auto columns = static_cast<size_t>(std::count_if(text.begin(), text.end(), starts));
  if (columns <= width) return std::string(text) + std::string(width - columns, ' ');
  size_t kept = 0, end = 0;
  for (; end < text.size(); ++end) {
    if (starts(text[end]) && kept++ == width - 1) break;
  }
  return std::string(text.substr(0, end)) + "…";
}

void append_ansi_rows(Buffer& out, const Matrices& m, int64_t r, const Colormap& map,
                      const Scale& scale) {
  for (int64_t i = 0; i < m.height; ++i) {
    for (int64_t c = 0; c < m.cols; ++c) {
      if (c > 0) out.append(std::string_view("  "));
      for (int64_t j = 0; j < m.width; ++j) {
        const double v = m.at(r, c, i, j);
        append_background(out, std::isnan(v) ? kNanBase : sample(map, scale.fraction(v)), "  ");
      }
      // Reset before the gap so that it keeps the terminal's background.
      out.append(kReset);
    }
    out.push_back('\n');
  }
}

void append_ansi_legend(Buffer& out, const Colormap& map, const Scale& scale) {
  constexpr int kRampSteps = 8;
  fmt::format_to(std::back_inserter(out), "{} ", map.name);
  for (int k = 0; k < kRampSteps; ++k) {
    append_background(out, sample(map, static_cast<double>(k) / (kRampSteps - 1)), " ");
  }
  out.append(kReset);
  if (scale.any_finite) {
    fmt::format_to(std::back_inserter(out), " {:.4g} … {:.4g}", scale.data_lo, scale.data_hi);
  } else {
    fmt::format_to(std::back_inserter(out), " no finite values");
  }
  if (scale.any_nan) {
    out.append(std::string_view("  NaN "));
    append_background(out, kNanBase, "  ");
    out.append(kReset);
  }
  out.push_back('\n');
}

std::string render_ansi(const char* fn, const torch::Tensor& matrices,
                        const HeatmapOptions& options) {
  const Colormap& map = check_arguments(fn, matrices, options);
  const Matrices m = read(matrices);
  const Scale scale = make_scale(m);

  Buffer out;
  auto it = std::back_inserter(out);
  // User text as valid UTF-8 without control characters, which could move
  // the cursor or start an escape sequence.
  const auto text = [](const std::string& s) {
    return detail::valid_utf8(s, detail::printable_char);
  };
  if (!options.ylabel().empty()) fmt::format_to(it, "rows: {}\n", text(options.ylabel()));
  if (!options.xlabel().empty()) fmt::format_to(it, "columns: {}\n", text(options.xlabel()));
  if (!options.titles().empty()) {
    for (int64_t c = 0; c < m.cols; ++c) {
      fmt::format_to(it, "{}{}", c > 0 ? "  " : "",
                     fit(text(options.titles()[c]), static_cast<size_t>(2 * m.width)));
    }
    out.push_back('\n');
  }
  for (int64_t r = 0; r < m.rows; ++r) {
    if (r > 0) out.push_back('\n');
    append_ansi_rows(out, m, r, map, scale);
  }
  append_ansi_legend(out, map, scale);
  return fmt::to_string(out);
}

}  // namespace

std::string heatmaps_ansi(const torch::Tensor& matrices, const HeatmapOptions& options) {
  return render_ansi("d2l::heatmaps_ansi", matrices, options);
}

}  // namespace d2l
