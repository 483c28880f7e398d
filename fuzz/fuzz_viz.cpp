// The helpers of fuzz_viz.h.

#include "fuzz_viz.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "xml_helpers.h"

namespace d2l_fuzz {

double some_double(Bytes& in) {
  switch (in.below(4)) {
    case 0: return in.pick(d2l::testing::hostile_doubles());
    case 1: {
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) bits |= uint64_t{in.byte()} << (8 * k);
      double v = 0;
      std::memcpy(&v, &bits, sizeof v);
      return v;
    }
    case 2: return static_cast<double>(in.below(256)) - 128;
    default: {
      double v = in.pick(d2l::testing::hostile_doubles());
      const double toward = in.flag() ? kInf : -kInf;
      for (int64_t k = 0, n = in.below(4); k < n; ++k) v = std::nextafter(v, toward);
      return v;
    }
  }
}

std::vector<double> some_doubles(Bytes& in, int64_t n) {
  std::vector<double> values;
  for (int64_t i = 0; i < n; ++i) values.push_back(some_double(in));
  return values;
}

std::string some_text(Bytes& in) {
  std::string text;
  const bool raw = in.flag();
  for (int64_t i = 0, n = in.below(16); i < n; ++i) {
    text.push_back(static_cast<char>(
        raw ? in.byte()
            : in.pick<uint8_t>({'a', 'Z',  '<',  '&',  '"',  ' ',  0xC3, 0xA9, 0xE2, 0x80, 0xFF,
                                0,   0x1B, 0xED, 0xA0, 0xEF, 0xBF, 0xBE, 0xF4, 0x90, 0xC0, '\n'})));
  }
  return text;
}

void check_svg(const std::string& svg) {
  const auto problem = d2l::testing::svg_problem(svg);
  if (!problem.empty()) finding("an invalid SVG", problem);
}

void check_utf8(const std::string& text) {
  const auto problem = d2l::testing::utf8_problem(text);
  if (!problem.empty()) finding("text that is not UTF-8", problem);
}

}  // namespace d2l_fuzz
