#include "svg.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

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

namespace {

constexpr char32_t kReplacement = 0xFFFD;

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The code point starting at text[pos] and its length in bytes; an ill-formed
// sequence reads as U+FFFD of one byte, so decoding resumes at the next byte
// (the Unicode standard's "maximal subpart" practice, simplified).
std::pair<char32_t, size_t> decode(std::string_view text, size_t pos) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[pos + k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {lead, 1};
  size_t length = 0;
  char32_t c = 0, least = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, c = lead & 0x1F, least = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, c = lead & 0x0F, least = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, c = lead & 0x07, least = 0x10000;
  } else {
    return {kReplacement, 1};
  }
  if (pos + length > text.size()) return {kReplacement, 1};
  for (size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return {kReplacement, 1};
    c = (c << 6) | (byte(k) & 0x3F);
  }
  const bool surrogate = c >= 0xD800 && c <= 0xDFFF;
  if (c < least || c > 0x10FFFF || surrogate) return {kReplacement, 1};
  return {c, length};
}

}  // namespace

std::string valid_utf8(std::string_view text, bool (*allowed)(char32_t)) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const auto [c, length] = decode(text, pos);
    if (c == kReplacement || !allowed(c)) {
      append_utf8(out, kReplacement);
    } else {
      out.append(text.substr(pos, length));
    }
    pos += length;
  }
  return out;
}

bool xml_char(char32_t c) {
  return (c >= 0x20 || c == '\t' || c == '\n' || c == '\r') && c != 0xFFFE && c != 0xFFFF;
}

bool printable_char(char32_t c) { return c >= 0x20 && !(c >= 0x7F && c <= 0x9F); }

std::string xml_escape(std::string_view text) {
  const std::string valid = valid_utf8(text, xml_char);
  std::string out;
  out.reserve(valid.size());
  for (const char c : valid) {
    const auto* entity = std::find_if(kXmlEntities.begin(), kXmlEntities.end(),
                                      [c](const auto& e) { return e.first == c; });
    if (entity != kXmlEntities.end()) {
      out += entity->second;
    } else {
      out += c;
    }
  }
  return out;
}

void check_figsize(const char* fn, double width, double height) {
  const auto sane = [](double v) { return v > 0 && v <= kMaxFigsizeInches; };
  TORCH_CHECK(
      sane(width) && sane(height),
      fmt::format("{}: figsize must be positive and finite, at most {} inches, got ({}, {})", fn,
                  kMaxFigsizeInches, width, height));
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
  // Opened without blocking: a FIFO that no process reads would wait for a
  // reader (ENXIO); then back to blocking writes. C stdio rather than
  // iostreams: errno then tells why a step failed.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
  TORCH_CHECK(fd >= 0, message(errno == ENXIO ? "it is a FIFO (named pipe) that no process reads"
                                              : errno_reason()));
  std::FILE* file = nullptr;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const std::string reason = errno_reason();
    ::close(fd);
    TORCH_CHECK(false, message(reason));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  const std::string reason = written ? "" : errno_reason();
  // fclose flushes, so a full disk may show only here.
  const bool closed = std::fclose(file) == 0;
  TORCH_CHECK(written && closed, message(written ? errno_reason() : reason));
}

}  // namespace d2l::detail
