// fuzz_attention's plot area: plot_svg with any number of series of any
// doubles (NaN, ±inf, subnormals, ±1e308, values equal up to rounding), any
// styles, limits, figsize, y scale and byte strings as text. Every document
// returned must be well-formed XML in UTF-8 with finite numbers.

#include <d2l/viz/plot.h>

#include <cmath>

#include <string>
#include <utility>
#include <vector>

#include "fuzz_viz.h"

namespace d2l_fuzz {
namespace {

d2l::PlotOptions::OptionalRange some_range(Bytes& in) {
  if (in.below(3) != 0) return c10::nullopt;
  const double lo = some_double(in);
  return std::make_pair(lo, in.flag() ? some_double(in) : std::nextafter(lo, kInf));
}

}  // namespace

void fuzz_plot(Bytes& in) {
  std::vector<d2l::Series> series;
  for (int64_t i = 0, n = in.below(4); i < n; ++i) {
    d2l::Series s;
    const int64_t points = in.below(8);
    s.x = some_doubles(in, points);
    // Now and then one y value fewer: a mismatch must be refused.
    s.y = some_doubles(in, in.below(8) == 0 && points > 0 ? points - 1 : points);
    s.label = some_text(in);
    s.style = in.pick<std::string>({"-", "--", "-.", ":", "o", "-o", "m--", "ko", "x", "", "r"});
    series.push_back(std::move(s));
  }
  const std::vector<double> sizes = {3.5, 0.0, -1.0, 1e-300, 1e300, 1000.0, kInf, kNaN, 0.5};
  auto options = d2l::PlotOptions()
                     .title(some_text(in))
                     .xlabel(some_text(in))
                     .ylabel(some_text(in))
                     .figsize({in.pick(sizes), in.pick(sizes)})
                     .xlim(some_range(in))
                     .ylim(some_range(in))
                     .yscale(in.pick<std::string>({"linear", "linear", "log", "symlog"}))
                     .grid(in.flag());
  current.description =
      "plot_svg series=" + std::to_string(series.size()) + " yscale=" + options.yscale();
  check_svg(d2l::plot_svg(series, options));
}

}  // namespace d2l_fuzz
