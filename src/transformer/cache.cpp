#include "transformer/cache.h"

#include <algorithm>

namespace d2l::detail {

bool BlockCache::serves(const torch::Tensor& key_values) const {
  if (!key_values.defined()) return length == 0;
  return length > 0 && key_values.size(1) == length && inputs.defined() &&
         key_values.data_ptr() == inputs.data_ptr() &&
         key_values.sizes() == filled_inputs().sizes() && key_values.strides() == inputs.strides();
}

void BlockCache::append_inputs(const torch::Tensor& X) {
  const int64_t steps = X.size(1), needed = length + steps;
  if (!inputs.defined() || needed > inputs.size(1)) {
    const int64_t capacity =
        std::max<int64_t>({needed, inputs.defined() ? 2 * inputs.size(1) : 0, 8});
    auto grown = torch::empty({X.size(0), capacity, X.size(2)}, X.options());
    if (length > 0) grown.narrow(1, 0, length).copy_(inputs.narrow(1, 0, length));
    inputs = std::move(grown);
  }
  inputs.narrow(1, length, steps).copy_(X);
  length = needed;
}

torch::Tensor BlockCache::filled_inputs() const { return inputs.narrow(1, 0, length); }

}  // namespace d2l::detail
