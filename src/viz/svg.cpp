#include "svg.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <system_error>
#include <utility>

namespace d2l::detail {
namespace {

constexpr std::array<std::pair<char, std::string_view>, 5> kXmlEntities{
    {{'&', "&amp;"}, {'<', "&lt;"}, {'>', "&gt;"}, {'"', "&quot;"}, {'\'', "&apos;"}}};

// In ems: the average glyph of a sans-serif font, and DejaVu Sans's digits.
constexpr double kGlyphWidth = 0.6;
constexpr double kDigitWidth = 0.64;

std::string errno_reason() { return std::error_code(errno, std::generic_category()).message(); }

}  // namespace

double text_width(std::string_view text, double font) {
  return static_cast<double>(text.size()) * kGlyphWidth * font;
}

double number_width(std::string_view label, double font) {
  return static_cast<double>(label.size()) * kDigitWidth * font;
}

double written_coordinate(double v) { return std::round(v * 100) / 100; }

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto* entity = std::find_if(kXmlEntities.begin(), kXmlEntities.end(),
                                      [c](const auto& e) { return e.first == c; });
    if (entity != kXmlEntities.end()) {
      out += entity->second;
    } else if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      out += "\xEF\xBF\xBD";  // other control characters are not allowed in XML 1.0
    } else {
      out += c;
    }
  }
  return out;
}

void open_svg(fmt::memory_buffer& out, const SvgCanvas& canvas) {
  auto it = std::back_inserter(out);
  if (canvas.standalone) {
    fmt::format_to(it, "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n");
  }
  fmt::format_to(it,
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.2f}{2}\" "
                 "height=\"{1:.2f}{2}\" viewBox=\"0 0 {0:.2f} {1:.2f}\" font-family=\"{3}\" "
                 "font-size=\"{4}\">\n"
                 "<rect class=\"background\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
                 canvas.width, canvas.height, canvas.standalone ? "pt" : "", kFontFamily,
                 kTickFont);
}

void close_svg(fmt::memory_buffer& out) { fmt::format_to(std::back_inserter(out), "</svg>\n"); }

void write_file(const char* fn, const std::string& path, std::string_view text) {
  const auto message = [&](const std::string& reason) {
    return fmt::format("{}: cannot write '{}': {}", fn, path, reason);
  };
  // C stdio rather than iostreams: errno then tells why a step failed.
  std::FILE* file = std::fopen(path.c_str(), "wb");
  TORCH_CHECK(file != nullptr, message(errno_reason()));
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const std::string reason = written ? "" : errno_reason();
  // fclose flushes, so a full disk may show only here.
  const bool closed = std::fclose(file) == 0;
  TORCH_CHECK(written && closed, message(written ? errno_reason() : reason));
}

}  // namespace d2l::detail
