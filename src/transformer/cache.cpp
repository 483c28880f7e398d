#include "transformer/cache.h"

#include <algorithm>
#include <utility>

#include "multi_head_attention_cache_internal.h"

namespace d2l::detail {

bool BlockCache::serves(const torch::Tensor& key_values) const {
  if (!key_values.defined()) return length == 0;
  // Sizes and strides compared without a view made: this runs every step.
  return length > 0 && inputs.defined() && key_values.dim() == 3 &&
         key_values.data_ptr() == inputs.data_ptr() && key_values.size(0) == inputs.size(0) &&
         key_values.size(1) == length && key_values.size(2) == inputs.size(2) &&
         key_values.strides() == inputs.strides();
}

void BlockCache::reserve_inputs(int64_t batch, int64_t needed, int64_t num_hiddens,
                                const torch::TensorOptions& options) {
  if (inputs.defined() && needed <= inputs.size(1)) return;
  const int64_t capacity =
      std::max<int64_t>({needed, inputs.defined() ? 2 * inputs.size(1) : 0, 8});
  auto grown = torch::empty({batch, capacity, num_hiddens}, options);
  if (length > 0) grown.narrow(1, 0, length).copy_(inputs.narrow(1, 0, length));
  inputs = std::move(grown);
}

void BlockCache::append_inputs(const torch::Tensor& X) {
  const int64_t steps = X.size(1), needed = length + steps;
  reserve_inputs(X.size(0), needed, X.size(2), X.options());
  inputs.narrow(1, length, steps).copy_(X);
  length = needed;
}

torch::Tensor BlockCache::filled_inputs() const {
  // narrow's view in one ATen call rather than three (narrow, slice, as_strided).
  return inputs.as_strided({inputs.size(0), length, inputs.size(2)}, inputs.strides(),
                           inputs.storage_offset());
}

std::shared_ptr<DecoderCache> TransformerDecoderCache::select_rows(const DecoderState& state,
                                                                   const torch::Tensor& index,
                                                                   DecoderState& selected,
                                                                   bool same_sources) const {
  auto out = std::make_shared<TransformerDecoderCache>();
  out->blocks.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& block = blocks[i];
    if (!block) continue;
    // A block that does not serve the state (it is rebuilt at the next
    // step anyway) is left out.
    if (i >= state.key_values.size() || !block->serves(state.key_values[i])) continue;
    auto fresh = std::make_shared<BlockCache>();
    if (block->length > 0) {
      fresh->inputs = gather_rows(block->inputs, index, block->length, block->spare_inputs);
      fresh->spare_inputs = block->inputs;
      fresh->length = block->length;
      selected.key_values[i] = fresh->filled_inputs();
    }
    fresh->self_attention = block->self_attention.select_rows(index);
    if (same_sources) {
      fresh->cross_source = block->cross_source;
      fresh->cross_attention = block->cross_attention;
    } else if (block->cross_source.defined()) {
      fresh->cross_attention = block->cross_attention.select_rows(index);
      fresh->cross_source = selected.enc_outputs;
    }
    out->blocks[i] = std::move(fresh);
  }
  return out;
}

}  // namespace d2l::detail
