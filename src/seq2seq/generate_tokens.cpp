// Token choice for d2l::generate (generate_tokens.h).

#include "seq2seq/generate_tokens.h"

#include <c10/util/SmallVector.h>
#include <torch/torch.h>

#include <tuple>

namespace d2l::detail {

void best_tokens(const float* x, int64_t V, int64_t count, std::vector<int64_t>& best) {
  best.resize(static_cast<size_t>(count));
  // The held tokens' values beside their ids, and the worst of them in a
  // register: most tokens are passed over by one comparison, with no load
  // through `best` (a tenth of a book-size beam-4 step before).
  c10::SmallVector<float, 64> values(static_cast<size_t>(count));
  int64_t held = 0;
  float worst = 0;  // read once held == count
  for (int64_t v = 0; v < V; ++v) {
    const float value = x[v];
    // Not better than the worst held (a tie keeps the earlier index).
    if (held == count && !(value > worst)) continue;
    int64_t at = held < count ? held++ : held - 1;
    for (; at > 0 && value > values[static_cast<size_t>(at - 1)]; --at) {
      best[static_cast<size_t>(at)] = best[static_cast<size_t>(at - 1)];
      values[static_cast<size_t>(at)] = values[static_cast<size_t>(at - 1)];
    }
    best[static_cast<size_t>(at)] = v;
    values[static_cast<size_t>(at)] = value;
    if (held == count) worst = values[static_cast<size_t>(count - 1)];
  }
}

int64_t sample_token(const torch::Tensor& logits, const torch::Tensor& log_probs, int64_t row,
                     const GenerationOptions& o, at::Generator& generator) {
  const int64_t V = logits.size(1);
  auto p = log_probs.select(0, row);
  if (o.temperature() != 1) p = torch::log_softmax(logits.select(0, row) / o.temperature(), 0);
  p = p.exp();
  if (o.sampling_topk() > 0 && o.sampling_topk() < V) {
    const auto kth = std::get<0>(p.topk(o.sampling_topk())).min();
    p = p.masked_fill(p < kth, 0);
  }
  if (o.sampling_topp() < 1) {
    const auto [sorted, order] = p.sort(/*dim=*/0, /*descending=*/true);
    const auto before = sorted.cumsum(0) - sorted;  // mass of the tokens ranked above
    p = p.index_fill(0, order.masked_select(before >= o.sampling_topp()), 0);
  }
  return torch::multinomial(p, 1, false, generator).item<int64_t>();
}

}  // namespace d2l::detail
