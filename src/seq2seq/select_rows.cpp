// d2l::select_rows (include/d2l/generate.h): a decoder state's batch rows,
// and its cache's through DecoderCache::select_rows, for the rows that go on
// (Note [Generation] in generate.cpp).

#include <d2l/generate.h>

#include "multi_head_attention_cache_internal.h"

namespace d2l {

DecoderState select_rows(const DecoderState& state, const torch::Tensor& index, bool same_sources) {
  const auto pick = [&](const torch::Tensor& t, int64_t dim) {
    if (!t.defined()) return t;
    return dim == 0 ? detail::gather_rows(t, index) : t.index_select(dim, index);
  };
  DecoderState selected;
  selected.hidden_state = pick(state.hidden_state, 1);
  if (same_sources) {
    selected.enc_outputs = state.enc_outputs;
    selected.enc_valid_lens = state.enc_valid_lens;
    selected.enc_key_padding_mask = state.enc_key_padding_mask;
  } else {
    selected.enc_outputs = pick(state.enc_outputs, 0);
    selected.enc_valid_lens = pick(state.enc_valid_lens, 0);
    selected.enc_key_padding_mask = pick(state.enc_key_padding_mask, 0);
  }
  selected.key_values = state.key_values;
  if (state.cache) selected.cache = state.cache->select_rows(state, index, selected, same_sources);
  for (size_t i = 0; i < state.key_values.size(); ++i) {
    const auto& old = state.key_values[i];
    if (old.defined() && selected.key_values[i].is_same(old)) {
      selected.key_values[i] = detail::gather_rows(old, index);
    }
  }
  return selected;
}

}  // namespace d2l
