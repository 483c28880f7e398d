#include "transformer/cache.h"

#include <algorithm>

namespace d2l::detail {
namespace {

// A buffer of `capacity` rows along dim 1 holding the first `length` rows of `old`.
torch::Tensor regrow(const torch::Tensor& old, const torch::Tensor& like, int64_t length,
                     int64_t capacity) {
  auto grown = torch::empty({like.size(0), capacity, like.size(2)}, like.options());
  if (length > 0) grown.narrow(1, 0, length).copy_(old.narrow(1, 0, length));
  return grown;
}

}  // namespace

bool BlockCache::serves(const torch::Tensor& key_values) const {
  if (!key_values.defined()) return length == 0;
  return length > 0 && key_values.size(1) == length && inputs.defined() &&
         key_values.data_ptr() == inputs.data_ptr() && key_values.sizes() == filled_inputs().sizes() &&
         key_values.strides() == inputs.strides();
}

void BlockCache::append(const torch::Tensor& X, const torch::Tensor& new_keys,
                        const torch::Tensor& new_values) {
  const int64_t steps = X.size(1), needed = length + steps;
  if (!inputs.defined() || needed > inputs.size(1)) {
    const int64_t capacity =
        std::max<int64_t>({needed, inputs.defined() ? 2 * inputs.size(1) : 0, 8});
    inputs = regrow(inputs, X, length, capacity);
    keys = regrow(keys, new_keys, length, capacity);
    values = regrow(values, new_values, length, capacity);
  }
  inputs.narrow(1, length, steps).copy_(X);
  keys.narrow(1, length, steps).copy_(new_keys);
  values.narrow(1, length, steps).copy_(new_values);
  length = needed;
}

torch::Tensor BlockCache::filled_inputs() const { return inputs.narrow(1, 0, length); }
torch::Tensor BlockCache::filled_keys() const { return keys.narrow(1, 0, length); }
torch::Tensor BlockCache::filled_values() const { return values.narrow(1, 0, length); }

}  // namespace d2l::detail
