// fuzz_attention's heatmap area: heatmaps_svg and heatmaps_ansi with any rank,
// dtype, size, values (any doubles too), title and label bytes and colour map.
// Every SVG returned must be well-formed XML in UTF-8 with finite numbers,
// every terminal text valid UTF-8.

#include <d2l/viz/heatmap.h>

#include <string>
#include <vector>

#include "fuzz_viz.h"

namespace d2l_fuzz {

void fuzz_heatmaps(Bytes& in) {
  const int64_t rank = in.below(6) == 0 ? in.below(6) : 4;
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) shape.push_back(in.below(5));
  int64_t numel = 1;
  for (const int64_t size : shape) numel *= size;
  // Arbitrary doubles (NaN, ±inf, subnormals, ±1e308, values equal up to
  // rounding), or the tensors of the other areas in any dtype and layout.
  const auto matrices = in.flag()
                            ? torch::tensor(some_doubles(in, numel), torch::kDouble).reshape(shape)
                            : make_arg(in, shape, in.pick(kDataDtypes), false).value;
  const std::vector<double> sizes = {2.5, 0.0, -1.0, 1e-300, 1e300, 1000.0, kInf, kNaN, 0.01};
  std::vector<std::string> titles;
  for (int64_t i = 0, n = in.below(4); i < n; ++i) titles.push_back(some_text(in));
  const auto options =
      d2l::HeatmapOptions()
          .xlabel(some_text(in))
          .ylabel(some_text(in))
          .titles(titles)
          .figsize({in.pick(sizes), in.pick(sizes)})
          .cmap(in.pick<std::string>({"Reds", "Blues", "Greens", "Greys", "viridis", "jet", ""}));
  current.description = "heatmaps cmap=" + options.cmap() +
                        " figsize=" + std::to_string(options.figsize().first) + "," +
                        std::to_string(options.figsize().second);
  note("matrices", matrices);
  if (in.flag()) {
    check_svg(d2l::heatmaps_svg(matrices, options));
  } else {
    const auto text = d2l::heatmaps_ansi(matrices, options);
    FUZZ_CHECK(!text.empty(), "a heatmap rendered as nothing");
    check_utf8(text);
  }
}

}  // namespace d2l_fuzz
