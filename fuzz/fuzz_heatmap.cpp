// fuzz_attention's heatmap area: heatmaps_svg and heatmaps_ansi with any rank,
// dtype, size, title and label text and colour map.

#include <d2l/viz/heatmap.h>

#include <string>
#include <vector>

#include "fuzz_common.h"

namespace d2l_fuzz {

std::string some_text(Bytes& in) {
  std::string text;
  for (int64_t i = 0, n = in.below(12); i < n; ++i) {
    text.push_back(static_cast<char>(
        in.pick<uint8_t>({'a', 'Z', '<', '&', '"', ' ', 0xC3, 0xA9, 0xE2, 0x80, 0xFF, 0})));
  }
  return text;
}

void fuzz_heatmaps(Bytes& in) {
  const int64_t rank = in.below(6) == 0 ? in.below(6) : 4;
  std::vector<int64_t> shape;
  for (int64_t i = 0; i < rank; ++i) shape.push_back(in.below(5));
  const auto matrices = make_arg(in, shape, in.pick(kDataDtypes), false).value;
  const std::vector<double> sizes = {2.5, 0.0, -1.0, 1e-300, 1e300, kInf, kNaN, 0.01};
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
  const auto text =
      in.flag() ? d2l::heatmaps_svg(matrices, options) : d2l::heatmaps_ansi(matrices, options);
  FUZZ_CHECK(!text.empty(), "a heatmap rendered as nothing");
}

}  // namespace d2l_fuzz
