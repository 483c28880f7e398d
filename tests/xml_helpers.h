#pragma once

// The checks every SVG written by d2l::viz must pass, shared by the tests and
// the fuzzer (which links xml_helpers.cpp too): well-formed XML by libxml2,
// valid UTF-8, and no NaN or infinity written as a number. Free of gtest so
// that the fuzzer can use it; tests write EXPECT_EQ(svg_problem(svg), "").

#include <string>
#include <string_view>
#include <vector>

namespace d2l::testing {

/// Empty if `text` is valid UTF-8 (no overlong forms, surrogates or code
/// points past U+10FFFF); else where it is not.
std::string utf8_problem(std::string_view text);

/// Empty if `text` holds no "nan" or "inf" token (any case, optionally
/// signed) standing as a number would: not part of a longer word or name
/// such as "infinity" or "d2l-heatmap-nan"; else the token and its context.
std::string non_finite_problem(std::string_view text);

/// Empty if `svg` is a document that a renderer can read: valid UTF-8,
/// well-formed XML 1.0 (parsed by libxml2) with an <svg> root, and no
/// NaN or infinity in any attribute or in the text of elements we write.
/// Text that came from the user (titles, labels, legend entries: the
/// elements of class title, xlabel, ylabel, label and entry) is checked as
/// XML and UTF-8 only, since a user may well write "inf". Else what is wrong.
std::string svg_problem(std::string_view svg);

/// Doubles that break naive range arithmetic in a writer: non-finite,
/// signed zeros, subnormal, at the ends of the doubles, far from zero, and
/// pairs equal up to rounding. The hostile-input tests take every pair; the
/// fuzzer picks from them.
const std::vector<double>& hostile_doubles();

}  // namespace d2l::testing
