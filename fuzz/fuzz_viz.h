#pragma once

// What the writer areas of fuzz_attention (fuzz_heatmap.cpp, fuzz_plot.cpp)
// share: hostile doubles and byte strings from the input, and the check of
// every document they write (tests/xml_helpers.h: well-formed XML by
// libxml2, valid UTF-8, no NaN or infinity as a number).

#include <string>
#include <vector>

#include "fuzz_common.h"

namespace d2l_fuzz {

// Any double: a special one (NaN, ±inf, subnormals, ±1e308, the ends of the
// doubles), eight raw bytes as its bit pattern, a small integer, or a
// special one moved by a few ulps (values equal up to rounding).
double some_double(Bytes& in);

std::vector<double> some_doubles(Bytes& in, int64_t n);

// Up to 15 arbitrary bytes, or text from an alphabet of XML-special
// characters and pieces of UTF-8 sequences.
std::string some_text(Bytes& in);

// Aborts with a finding unless `svg` passes svg_problem.
void check_svg(const std::string& svg);

// Aborts with a finding unless `text` is valid UTF-8.
void check_utf8(const std::string& text);

void fuzz_plot(Bytes& in);  // fuzz_plot.cpp

}  // namespace d2l_fuzz
