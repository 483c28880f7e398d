// MultiHeadAttentionCache: keys and values projected once, the buffers'
// growth, their checks against the module, extend_cache and project_memory
// (Note [Cached keys and values] in multi_head_attention_cache_internal.h).

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "checks.h"
#include "linear.h"
#include "multi_head_attention_cache_internal.h"
#include "packed_weights.h"
#include "parallel.h"

namespace d2l {

using Access = detail::MultiHeadAttentionCacheAccess;

torch::Tensor MultiHeadAttentionCache::keys() const {
  return length_ > 0 ? keys_.narrow(1, 0, length_) : torch::Tensor();
}

torch::Tensor MultiHeadAttentionCache::values() const {
  return length_ > 0 ? values_.narrow(1, 0, length_) : torch::Tensor();
}

MultiHeadAttentionCache MultiHeadAttentionCache::clone() const {
  MultiHeadAttentionCache copy = *this;
  copy.spare_keys_ = copy.spare_values_ = torch::Tensor();
  if (keys_.defined()) {
    copy.keys_ = keys_.clone();
    copy.values_ = values_.clone();
  }
  return copy;
}

MultiHeadAttentionCache MultiHeadAttentionCache::select_rows(const torch::Tensor& index) const {
  MultiHeadAttentionCache copy = *this;
  // The copy's handles on the spares would keep them from being reused.
  copy.spare_keys_ = copy.spare_values_ = torch::Tensor();
  if (keys_.defined()) {
    // The filled keys of each row; the buffers keep their capacity.
    copy.keys_ = detail::gather_rows(keys_, index, length_, spare_keys_);
    copy.values_ = detail::gather_rows(values_, index, length_, spare_values_);
    copy.spare_keys_ = keys_;
    copy.spare_values_ = values_;
  }
  return copy;
}

void MultiHeadAttentionCache::clear() { *this = MultiHeadAttentionCache(); }

namespace {

// The parameters whose values the cached projections depend on.
std::vector<torch::Tensor> projection_parameters(const MultiHeadAttentionImpl& m) {
  std::vector<torch::Tensor> p{m.W_k->weight, m.W_v->weight};
  if (m.W_k->bias.defined()) p.push_back(m.W_k->bias);
  if (m.W_v->bias.defined()) p.push_back(m.W_v->bias);
  return p;
}

// A buffer of `capacity` rows along dim 1 holding the first `length` rows of `old`.
torch::Tensor regrow(const torch::Tensor& old, const torch::Tensor& like, int64_t length,
                     int64_t capacity) {
  auto grown = torch::empty({like.size(0), capacity, like.size(2)}, like.options());
  if (length > 0) grown.narrow(1, 0, length).copy_(old.narrow(1, 0, length));
  return grown;
}

// Appends projected keys and values k, v (B, s, h): in place, doubling the
// buffers when full; by concatenation when autograd records.
void append(MultiHeadAttentionCache& cache, const torch::Tensor& k, const torch::Tensor& v,
            bool grad) {
  auto& keys = Access::keys(cache);
  auto& values = Access::values(cache);
  auto& length = Access::length(cache);
  const int64_t steps = k.size(1), needed = length + steps;
  if (length == 0) {
    // The projections are new tensors of their own: the first buffers.
    keys = k.contiguous();
    values = v.contiguous();
    length = steps;
    return;
  }
  if (grad) {
    keys = torch::cat({keys.narrow(1, 0, length), k}, 1);
    values = torch::cat({values.narrow(1, 0, length), v}, 1);
    length = needed;
    return;
  }
  if (needed > keys.size(1)) {
    const int64_t capacity = std::max<int64_t>({needed, 2 * keys.size(1), 8});
    keys = regrow(keys, k, length, capacity);
    values = regrow(values, v, length, capacity);
  }
  keys.narrow(1, length, steps).copy_(k);
  values.narrow(1, length, steps).copy_(v);
  length = needed;
}

void record_sources(MultiHeadAttentionCache& cache, const MultiHeadAttentionImpl& m) {
  Access::sources(cache) =
      std::make_shared<const detail::WeightSignature>(projection_parameters(m));
}

}  // namespace

namespace detail {

// Autograd records this call: gradients may flow into the cache's graph.
bool recording(const MultiHeadAttentionImpl& m, std::initializer_list<torch::Tensor> inputs) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  for (const auto& p : m.parameters()) {
    if (p.requires_grad()) return true;
  }
  return false;
}

// The cache against the module: filled by its W_k and W_v as they are now.
void check_cache_source(const char* fn, const MultiHeadAttentionImpl& m,
                        const MultiHeadAttentionCache& cache) {
  if (cache.empty()) return;
  const auto& sources = Access::sources(cache);
  const auto match = sources ? sources->match(projection_parameters(m), cache.check_weight_bytes())
                             : WeightSignature::Match::kOther;
  TORCH_CHECK(match != WeightSignature::Match::kOther,
              fmt::format("{}: cache was filled by another MultiHeadAttention (its keys and "
                          "values were projected by other W_k and W_v)",
                          fn));
  TORCH_CHECK(match == WeightSignature::Match::kSame,
              fmt::format("{}: cache was filled before this module's W_k or W_v changed (an "
                          "optimizer step, a load, `to`, an edit through .data()); clear() it "
                          "and fill it again",
                          fn));
}

// new_keys (B, s, key_size) and new_values (B, s, value_size), both or neither,
// for a cache of B entries (if filled) in the weights' dtype and device.
void check_new_keys_values(const char* fn, const MultiHeadAttentionImpl& m,
                           const torch::Tensor& new_keys, const torch::Tensor& new_values,
                           const MultiHeadAttentionCache& cache, const char* keys_name,
                           const char* values_name) {
  detail::check_strided_layout(fn, keys_name, new_keys);
  detail::check_strided_layout(fn, values_name, new_values);
  TORCH_CHECK(new_keys.defined() == new_values.defined(),
              fmt::format("{}: {} and {} must be given together (or both left undefined), got "
                          "{} {} and {} {}",
                          fn, keys_name, values_name, keys_name, detail::shape_of(new_keys),
                          values_name, detail::shape_of(new_values)));
  if (!new_keys.defined()) return;
  const auto& o = m.options;
  detail::check_floating(fn, keys_name, new_keys, 3);
  detail::check_floating(fn, values_name, new_values, 3);
  TORCH_CHECK(new_keys.size(0) == new_values.size(0) && new_keys.size(1) == new_values.size(1) &&
                  new_keys.size(2) == o.key_size() && new_values.size(2) == o.value_size(),
              fmt::format("{}: {} must have shape [batch_size, s, key_size={}] and {} "
                          "[batch_size, s, value_size={}], got {} {} and {} {}",
                          fn, keys_name, o.key_size(), values_name, o.value_size(), keys_name,
                          detail::shape_of(new_keys), values_name, detail::shape_of(new_values)));
  const auto& W = m.W_k->weight;
  detail::check_same_dtype(fn, "W_k.weight", W, keys_name, new_keys);
  detail::check_same_dtype(fn, "W_k.weight", W, values_name, new_values);
  detail::check_same_device(fn, "W_k.weight", W, keys_name, new_keys);
  detail::check_same_device(fn, "W_k.weight", W, values_name, new_values);
  TORCH_CHECK(cache.empty() || Access::keys(cache).size(0) == new_keys.size(0),
              fmt::format("{}: {} must have the cache's batch size, got {} {} and a cache of "
                          "keys {}",
                          fn, keys_name, keys_name, detail::shape_of(new_keys),
                          detail::shape_of(cache.keys())));
}

// The batch size of a call: the new keys', else the cache's (0 when empty).
int64_t batch_of(const torch::Tensor& new_keys, const MultiHeadAttentionCache& cache) {
  if (new_keys.defined()) return new_keys.size(0);
  return cache.empty() ? 0 : Access::keys(cache).size(0);
}

// keys (B, n, in) · Wᵀ (+ b) without autograd: on the packed kernel where W
// is packed and there are 64 rows or more (linear_into, its bytes compared
// now, since this runs outside a decoding's steps too: reading W once more,
// which beside fewer rows' product would cost more than it saves), else as
// detail::linear.
torch::Tensor project_for_cache(const torch::Tensor& keys, const torch::nn::Linear& W,
                                AttentionBackend backend) {
  const auto& w = W->weight;
  if (!torch::GradMode::is_enabled() && backend == AttentionBackend::kAuto &&
      keys.scalar_type() == torch::kFloat && w.scalar_type() == torch::kFloat &&
      keys.device().is_cpu() && keys.is_contiguous() && keys.dim() == 3 &&
      keys.size(0) * keys.size(1) >= 64 && w.is_contiguous() &&
      (!W->bias.defined() || W->bias.is_contiguous()) &&
      detail::packed_weights(w, /*check_bytes=*/true) != nullptr) {
    auto out = torch::empty({keys.size(0), keys.size(1), w.size(0)}, keys.options());
    detail::linear_into<float>(out.data_ptr<float>(), keys.data_ptr<float>(),
                               keys.size(0) * keys.size(1), w, W->bias);
    return out;
  }
  return detail::linear(keys, w, W->bias, backend);
}

// Projects and appends, after the checks.
void extend_checked(MultiHeadAttentionImpl& m, MultiHeadAttentionCache& cache,
                    const torch::Tensor& keys, const torch::Tensor& values, bool grad) {
  const auto backend = m.attention->options.backend();
  const auto k = project_for_cache(keys, m.W_k, backend);
  const auto v = project_for_cache(values, m.W_v, backend);
  if (cache.empty()) record_sources(cache, m);
  append(cache, k, v, grad);
}

namespace {

// Whether gather_rows may write its output into the first rows of `spare`:
// a CPU tensor of t's dtype with at least sizes[0] rows and sizes' other
// dimensions, contiguous, held by one handle whose storage no other tensor
// (a view, a copy's handle, autograd's saved tensors) shares. A beam's
// cache keeps the buffers of the state before it as spares; by the next
// reorder that state is gone and they are free. Fewer rows than the spare's
// (a batch whose finished rows were dropped) take its first rows: a fresh
// buffer costs its pages' first touches (the kernel zeroing each page, a
// tenth of a base-size beam search's time when every shrink allocated).
bool reusable_spare(const torch::Tensor& spare, at::IntArrayRef sizes, const torch::Tensor& t) {
  return spare.defined() && spare.device().is_cpu() && spare.scalar_type() == t.scalar_type() &&
         spare.dim() == static_cast<int64_t>(sizes.size()) && spare.size(0) >= sizes[0] &&
         spare.sizes().slice(1) == sizes.slice(1) && spare.is_contiguous() &&
         spare.use_count() == 1 && spare.storage().use_count() == 1 && !spare.requires_grad();
}

}  // namespace

torch::Tensor gather_rows(const torch::Tensor& t, const torch::Tensor& index, int64_t filled,
                          const torch::Tensor& spare) {
  if (!t.device().is_cpu() || !index.device().is_cpu() || index.scalar_type() != torch::kLong ||
      index.dim() != 1 || !t.is_contiguous() || !index.is_contiguous() || t.dim() < 2) {
    return t.index_select(0, index);
  }
  const int64_t rows = t.size(0), R = index.size(0);
  const int64_t row_bytes = t.numel() / std::max<int64_t>(rows, 1) * t.element_size();
  const int64_t copied = filled < 0 || t.size(1) == 0
                             ? row_bytes
                             : row_bytes / t.size(1) * std::min(filled, t.size(1));
  const int64_t* picks = index.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(picks[r] >= 0 && picks[r] < rows,
                fmt::format("d2l::select_rows: index {} out of range for {} rows", picks[r], rows));
  }
  auto sizes = t.sizes().vec();
  sizes[0] = R;
  // Fewer rows are a tensor of their own on the spare's storage, not a view
  // (a view holds its base, whose storage would then count two holders).
  auto out =
      !reusable_spare(spare, sizes, t) ? torch::empty(sizes, t.options())
      : spare.size(0) == R
          ? spare
          : torch::empty({0}, t.options()).set_(spare.storage(), spare.storage_offset(), sizes);
  const auto* from = static_cast<const char*>(t.data_ptr());
  auto* to = static_cast<char*>(out.data_ptr());
  // Rows split between the threads, at least 256 KiB a task: a beam's
  // reorder copies every filled row of every cache at every step (the base
  // Transformer, beam 4 × 32 sources: a sixth of a step on one thread),
  // which on one thread kept the second from halving the step.
  const int64_t grain = std::max<int64_t>(1, (int64_t{256} << 10) / std::max<int64_t>(copied, 1));
  at::parallel_for(0, R, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(to + r * row_bytes, from + picks[r] * row_bytes, copied);
    }
  });
  return out;
}

void reserve_keys_values(MultiHeadAttentionCache& cache, const MultiHeadAttentionImpl& m,
                         int64_t batch, int64_t needed, int64_t minimum) {
  auto& keys = Access::keys(cache);
  auto& values = Access::values(cache);
  const int64_t length = Access::length(cache);
  if (length == 0) {
    const auto& W = m.W_k->weight;
    const int64_t capacity = std::max<int64_t>(needed, minimum);
    keys = torch::empty({batch, capacity, W.size(0)}, W.options());
    values = torch::empty({batch, capacity, m.W_v->weight.size(0)}, W.options());
    record_sources(cache, m);
  } else if (needed > keys.size(1)) {
    const int64_t capacity = std::max<int64_t>(needed, 2 * keys.size(1));
    keys = regrow(keys, keys, length, capacity);
    values = regrow(values, values, length, capacity);
  }
}

}  // namespace detail

void MultiHeadAttentionImpl::extend_cache(MultiHeadAttentionCache& cache, const torch::Tensor& keys,
                                          const torch::Tensor& values) {
  constexpr const char* fn = "d2l::MultiHeadAttention::extend_cache";
  detail::check_cache_source(fn, *this, cache);
  detail::check_new_keys_values(fn, *this, keys, values, cache, "keys", "values");
  TORCH_CHECK(keys.defined(), fmt::format("{}: keys and values must be defined", fn));
  detail::extend_checked(*this, cache, keys, values,
                         detail::recording(*this, {keys, values, cache.keys()}));
}

MultiHeadAttentionCache MultiHeadAttentionImpl::project_memory(const torch::Tensor& keys,
                                                               const torch::Tensor& values) {
  constexpr const char* fn = "d2l::MultiHeadAttention::project_memory";
  MultiHeadAttentionCache cache;
  detail::check_new_keys_values(fn, *this, keys, values, cache, "keys", "values");
  TORCH_CHECK(keys.defined(), fmt::format("{}: keys and values must be defined", fn));
  detail::extend_checked(*this, cache, keys, values, detail::recording(*this, {keys, values}));
  return cache;
}

}  // namespace d2l
