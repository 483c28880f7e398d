#pragma once

// The SVG writer core of d2l::viz: what the heatmaps and the line plots share,
// so that both documents look alike and report file errors alike.

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace d2l::detail {

/// SVG user units per inch: 1 unit = 1 point, as in matplotlib's SVG backend,
/// so that the book's figsize in inches maps onto the same drawing.
constexpr double kPointsPerInch = 72;
/// matplotlib's default sans-serif fonts, so that text takes the book's room.
constexpr std::string_view kFontFamily =
    "DejaVu Sans, Bitstream Vera Sans, Arial, Helvetica, sans-serif";
/// Font sizes in points: tick labels, axis labels, titles.
constexpr double kTickFont = 9;
constexpr double kLabelFont = 10;
constexpr double kTitleFont = 11;
constexpr double kTickLength = 3.5;
/// Frames and tick marks.
constexpr double kLineWidth = 0.8;

/// Width of `text` in a `font`-point sans-serif font, estimated without
/// measuring glyphs: enough to keep labels apart and inside the figure.
double text_width(std::string_view text, double font);

/// Width of a numeric label: DejaVu Sans digits are wider than its average
/// glyph, and a label must never overlap its neighbour.
double number_width(std::string_view label, double font);

/// `v` rounded as a coordinate is written (two decimals). Shapes that meet,
/// such as neighbouring heatmap cells, compute their edges from it so that
/// they share them exactly.
double written_coordinate(double v);

/// `text` as valid UTF-8: every byte that does not start a well-formed UTF-8
/// sequence (stray continuation bytes, truncated or overlong sequences,
/// surrogates, code points past U+10FFFF) becomes U+FFFD, and so does every
/// code point that `allowed` rejects.
std::string valid_utf8(std::string_view text, bool (*allowed)(char32_t));

/// Whether XML 1.0 allows `c` in a document: not the C0 controls other than
/// tab, newline and carriage return, nor U+FFFE and U+FFFF.
bool xml_char(char32_t c);

/// Whether a terminal prints `c` as a character: not a C0 or C1 control
/// (which could start an escape sequence) nor DEL.
bool printable_char(char32_t c);

/// `text` as XML character data or attribute value, as every viz writer
/// writes user text: valid_utf8(text, xml_char) with the five special
/// characters as entities.
std::string xml_escape(std::string_view text);

/// Largest figsize side in inches: beyond it coordinates stop being sane
/// (a figsize of 1e308 inches is infinite points).
constexpr double kMaxFigsizeInches = 1000;

/// Checks a figsize (width, height) in inches: finite, positive and at most
/// kMaxFigsizeInches. Throws c10::Error "<fn>: figsize must be ...".
void check_figsize(const char* fn, double width, double height);

/// The root element of a document, `width` x `height` user units.
struct SvgCanvas {
  double width = 0, height = 0;
  /// The heatmaps are written as matplotlib's SVG backend writes figures: an
  /// XML declaration and a size in points. The line plots keep the bare root
  /// sized in unitless user units (CSS pixels) they were first published
  /// with: points would make every plot already embedded a third larger.
  bool standalone = false;
};

/// Opens the document: the root element and a white background, so that the
/// figure reads the same on a dark page.
void open_svg(fmt::memory_buffer& out, const SvgCanvas& canvas);

/// Closes what open_svg opened.
void close_svg(fmt::memory_buffer& out);

/// Writes `text` to `path`, replacing the file. Throws c10::Error
/// "<fn>: cannot write '<path>': <reason>" where that fails, so that every
/// viz function that saves a file reports it the same way.
void write_file(const char* fn, const std::string& path, std::string_view text);

}  // namespace d2l::detail
