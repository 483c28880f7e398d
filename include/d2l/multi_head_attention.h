#pragma once

#include <d2l/dot_product_attention.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace d2l {

class MultiHeadAttentionCache;
namespace detail {
struct MultiHeadAttentionCacheAccess;  // src/multi_head_attention_cache_internal.h
class WeightSignature;                 // src/weight_signature.h
}  // namespace detail

struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(int64_t key_size, int64_t query_size, int64_t value_size,
                            int64_t num_hiddens, int64_t num_heads);
  /// Feature size of the keys.
  TORCH_ARG(int64_t, key_size);
  /// Feature size of the queries.
  TORCH_ARG(int64_t, query_size);
  /// Feature size of the values.
  TORCH_ARG(int64_t, value_size);
  /// Width of every projection and of the output; a multiple of num_heads.
  TORCH_ARG(int64_t, num_hiddens);
  /// Number of heads, each attending over num_hiddens / num_heads features.
  TORCH_ARG(int64_t, num_heads);
  /// Probability of zeroing an attention weight during training.
  TORCH_ARG(double, dropout) = 0.0;
  /// Whether the four projections have biases.
  TORCH_ARG(bool, bias) = false;
  /// Backend of the inner DotProductAttention (DotProductAttentionOptions::backend).
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
  /// Whether the inner DotProductAttention keeps the per-head weights of the
  /// last call in `attention->attention_weights`; off for concurrent use
  /// (DotProductAttentionOptions::record_attention_weights).
  TORCH_ARG(bool, record_attention_weights) = true;
  /// Grouped-query attention, which the book does not teach: keys and values
  /// of num_kv_heads heads (dividing num_heads), each read in place by its
  /// group of num_heads / num_kv_heads query heads; W_k and W_v then have
  /// num_hiddens / num_heads · num_kv_heads rows, and so do the cache's
  /// keys and values. Unset: num_heads (the book's).
  TORCH_ARG(std::optional<int64_t>, num_kv_heads) = std::nullopt;

 public:
  /// The `backend` option's name in 0.2, kept for one minor version.
  [[deprecated("the `path` option is now `backend`")]] MultiHeadAttentionOptions& path(
      AttentionBackend backend) {
    return this->backend(backend);
  }
  [[deprecated("the `path` option is now `backend`")]] AttentionBackend path() const {
    return backend();
  }
};

/// Splits the features of `X` (B, n, num_hiddens) into heads:
/// (B * num_heads, n, num_hiddens / num_heads), head-major within each batch.
torch::Tensor transpose_qkv(const torch::Tensor& X, int64_t num_heads);

/// Inverse of transpose_qkv: (B * num_heads, n, d) -> (B, n, num_heads * d).
torch::Tensor transpose_output(const torch::Tensor& X, int64_t num_heads);

namespace functional {

/// The weights and settings of functional::multi_head_attention. The four
/// projections are given as Linear weights (out_features, in_features):
/// W_q (h, query_size), W_k (h, key_size), W_v (h, value_size), W_o (h, h),
/// with h = num_hiddens; biases are (h) or undefined (no bias). W_k and W_v
/// of h / num_heads · g rows, g dividing num_heads, give grouped-query
/// attention: g key/value heads, each read by num_heads / g query heads. The mask
/// (`mask`, or `valid_lens`, `key_padding_mask`, `attn_mask` and `is_causal`
/// one by one) is AttentionMask's, whose attn_mask may also be (B *
/// num_heads, n, m), one per head, as torch::nn::MultiheadAttention's.
struct MultiHeadAttentionFuncOptions : AttentionMaskArgs<MultiHeadAttentionFuncOptions> {
  MultiHeadAttentionFuncOptions(int64_t num_heads, torch::Tensor W_q, torch::Tensor W_k,
                                torch::Tensor W_v, torch::Tensor W_o);
  /// Number of heads; h must be a multiple of it.
  TORCH_ARG(int64_t, num_heads);
  TORCH_ARG(torch::Tensor, W_q);
  TORCH_ARG(torch::Tensor, W_k);
  TORCH_ARG(torch::Tensor, W_v);
  TORCH_ARG(torch::Tensor, W_o);
  TORCH_ARG(torch::Tensor, b_q) = {};
  TORCH_ARG(torch::Tensor, b_k) = {};
  TORCH_ARG(torch::Tensor, b_v) = {};
  TORCH_ARG(torch::Tensor, b_o) = {};
  /// Probability of zeroing an attention weight when `training`.
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, training) = false;
  /// Backend: kAuto and kFused run small heads on the CPU as one node
  /// (explain_path), and otherwise pass it to the per-head dot-product
  /// attention.
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
  /// Whether to return the per-head weights (off, AttentionBackend::kAuto
  /// runs heads past small_heads' sizes on the flash kernel without them on
  /// the CPU, and SDPA on CUDA).
  TORCH_ARG(bool, need_weights) = true;

 public:
  /// The `backend` option's name in 0.2, kept for one minor version.
  [[deprecated("the `path` option is now `backend`")]] MultiHeadAttentionFuncOptions& path(
      AttentionBackend backend) {
    return this->backend(backend);
  }
  [[deprecated("the `path` option is now `backend`")]] AttentionBackend path() const {
    return backend();
  }
};

/// The book's multi-head attention: project queries (B, n, query_size), keys
/// (B, m, key_size) and values (B, m, value_size), split the h features into
/// num_heads heads, run dot-product attention per head with the mask of
/// `options` (the book's valid_lens, (B) or (B, n), and LibTorch's masks:
/// AttentionMask) for each head, join the heads and project by W_o.
/// Returns (output (B, n, h), per-head attention_weights (B * num_heads, n, m),
/// undefined when `need_weights` is false).
std::tuple<torch::Tensor, torch::Tensor> multi_head_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const MultiHeadAttentionFuncOptions& options);

/// The positional valid_lens of 0.3, kept for one minor version; lengths given
/// both here and in `options` are refused.
[[deprecated(
    "the valid lengths are an option: functional::multi_head_attention(q, k, v, "
    "options.valid_lens(l))")]] inline std::tuple<torch::Tensor, torch::Tensor>
multi_head_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                     const torch::Tensor& values, const torch::Tensor& valid_lens,
                     MultiHeadAttentionFuncOptions options) {
  TORCH_CHECK(!valid_lens.defined() || !options.valid_lens().defined(),
              "d2l::multi_head_attention: valid lengths given twice, as the positional valid_lens "
              "and in options.valid_lens(); give them once, in the options");
  if (valid_lens.defined()) options.valid_lens(valid_lens);
  return multi_head_attention(queries, keys, values, options);
}

}  // namespace functional

/// Which path functional::multi_head_attention takes for these arguments, and
/// why it refused the faster ones: "small_heads" (the projections, a kernel
/// over the heads in place and the output projection, one autograd node; the
/// CPU in float or double, heads of up to 64 x 64 (query, key) pairs with at
/// most 16 features, 32 x 32 with more, masks that are lengths), else the
/// per-head dot-product attention's path, with "small_heads: <why>" first
/// among the reasons. The same checks and errors as the call, without
/// computing anything.
PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values,
                             const functional::MultiHeadAttentionFuncOptions& options);

/// The positional valid_lens of 0.3, kept for one minor version.
[[deprecated(
    "the valid lengths are an option: explain_path(q, k, v, "
    "options.valid_lens(l))")]] inline PathExplanation
explain_path(const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
             const torch::Tensor& valid_lens, functional::MultiHeadAttentionFuncOptions options) {
  TORCH_CHECK(!valid_lens.defined() || !options.valid_lens().defined(),
              "d2l::multi_head_attention: valid lengths given twice, as the positional valid_lens "
              "and in options.valid_lens(); give them once, in the options");
  if (valid_lens.defined()) options.valid_lens(valid_lens);
  return explain_path(queries, keys, values, options);
}

/// d2l's `MultiHeadAttention`: queries (B, n, query_size), keys (B, m, key_size),
/// values (B, m, value_size), valid_lens (B) or (B, n) -> (B, n, num_hiddens).
/// Parameters are named as in the book's state_dict: `W_q.weight`, `W_k.weight`,
/// `W_v.weight`, `W_o.weight` (and `.bias` of each with bias=true). `forward`
/// is functional::multi_head_attention with the module's weights, and the
/// dropout and options of its inner `attention`.
class MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl> {
 public:
  MultiHeadAttentionImpl(int64_t key_size, int64_t query_size, int64_t value_size,
                         int64_t num_hiddens, int64_t num_heads, double dropout, bool bias = false);
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  /// An archive saved with another num_heads (which no tensor's shape shows)
  /// is refused too.
  void load(torch::serialize::InputArchive& archive) override;
  /// Module::save, and num_heads beside the tensors.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// The book's `forward(queries, keys, values, valid_lens)`; `mask` is the
  /// valid lengths, (B) or (B, n), or any AttentionMask.
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const AttentionMask& mask = {});

  /// forward, returning (output, per-head weights (B * num_heads, n, m)
  /// before dropout, with their graph) and leaving attention->attention_weights
  /// alone, as LibTorch's MultiheadAttention::forward returns (attn_output,
  /// attn_output_weights). Safe to call from many threads at once.
  std::tuple<torch::Tensor, torch::Tensor> forward_with_weights(const torch::Tensor& queries,
                                                                const torch::Tensor& keys,
                                                                const torch::Tensor& values,
                                                                const AttentionMask& mask = {});

  /// forward's name for masks in 0.3, kept for one minor version.
  [[deprecated("forward takes the AttentionMask: forward(q, k, v, mask)")]] torch::Tensor
  forward_masked(const torch::Tensor& queries, const torch::Tensor& keys,
                 const torch::Tensor& values, const AttentionMask& mask) {
    return forward(queries, keys, values, mask);
  }

  /// Which path forward takes for these inputs in the module's mode, and why
  /// (explain_path with the module's weights, dropout and options).
  PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                               const torch::Tensor& values, const AttentionMask& mask = {}) const;

  /// attention->attention_weights, read safely while other threads call
  /// forward (Note [Recording attention weights] in src/attention_weights.h).
  torch::Tensor last_attention_weights() const;

  MultiHeadAttentionOptions options;
  /// Its attention_weights after a forward call are per head: (B * num_heads, n, m).
  DotProductAttention attention{nullptr};
  torch::nn::Linear W_q{nullptr};
  torch::nn::Linear W_k{nullptr};
  torch::nn::Linear W_v{nullptr};
  torch::nn::Linear W_o{nullptr};

  // -------------------------------------------------------------------------
  // Keys and values projected once (src/multi_head_attention_cache_internal.h,
  // Note [Cached keys and values]).

  /// Projects keys (B, s, key_size) and values (B, s, value_size) through
  /// W_k and W_v and appends them to `cache` (empty, or filled by this
  /// module for B entries), without attending.
  void extend_cache(MultiHeadAttentionCache& cache, const torch::Tensor& keys,
                    const torch::Tensor& values);

  /// A new cache holding keys and values projected once: a memory attended
  /// by many calls, as the encoder's outputs are by a decoder's steps.
  MultiHeadAttentionCache project_memory(const torch::Tensor& keys, const torch::Tensor& values);

  /// forward over every key and value of `cache` after appending new_keys
  /// (B, s, key_size) and new_values (B, s, value_size) to it (both
  /// undefined: the cache as it is): the same numbers as forward(queries,
  /// cat(past keys, new_keys), cat(past values, new_values), ...) without
  /// projecting the past again. `mask` is over all the cached keys, m of
  /// them (AttentionMask; is_causal aligns the last query with the last
  /// key). The same checks and choice of path as forward: a decoding step
  /// runs the small-heads kernels on the cache in place. With autograd
  /// recording, the cache grows by concatenation (earlier steps' graphs stay
  /// valid) and the heads run on the per-head path, which differentiates the
  /// cached projections.
  torch::Tensor forward_cached(const torch::Tensor& queries, const torch::Tensor& new_keys,
                               const torch::Tensor& new_values, MultiHeadAttentionCache& cache,
                               const AttentionMask& mask = {});

  /// Which path forward_cached takes for these arguments, and why; the same
  /// checks, appending and computing nothing.
  PathExplanation explain_path_cached(const torch::Tensor& queries, const torch::Tensor& new_keys,
                                      const torch::Tensor& new_values,
                                      const MultiHeadAttentionCache& cache,
                                      const AttentionMask& mask = {}) const;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(AttentionMask())})
};
TORCH_MODULE(MultiHeadAttention);

/// The keys and values a MultiHeadAttention has projected by its W_k and W_v,
/// (B, m, num_hiddens) with the heads side by side, for forward_cached. It
/// grows by doubling its buffers (8, 16, 32, ... keys) and so copies none of
/// the past at most steps. A cache serves the module that filled it, while
/// the projections' weights are unchanged (else it is refused: an optimizer
/// step, a load, `to`, and on the CPU an edit through `.data()` too, which
/// autograd's version counter does not see); used from
/// several threads at once, it needs a lock of the caller's. Copies share
/// the buffers, so that appending through one copy may overwrite rows
/// another copy appended after their common part: branch (as beam search
/// does) with clone().
class MultiHeadAttentionCache {
 public:
  /// The number of keys held, m.
  int64_t size() const { return length_; }
  bool empty() const { return length_ == 0; }
  /// The projected keys and values held, (B, m, num_hiddens): views of the
  /// buffers (undefined when empty).
  torch::Tensor keys() const;
  torch::Tensor values() const;
  /// A copy with buffers of its own.
  MultiHeadAttentionCache clone() const;
  /// A cache of the batch rows `index` of this one ((R) int64 on the
  /// buffers' device; rows may repeat), with buffers of its own of the same
  /// capacity: beam search reorders its hypotheses' keys and values this way.
  /// The new cache keeps this one's buffers as its spares: when it is
  /// selected from in turn and nothing else refers to them any more (this
  /// cache, its views and copies gone), the rows go into them rather than
  /// into fresh memory, so a beam's steps alternate between two buffers.
  MultiHeadAttentionCache select_rows(const torch::Tensor& index) const;
  /// Forgets every key (the buffers go too).
  void clear();
  /// Whether forward_cached and extend_cache read the bytes of W_k and W_v
  /// (on the CPU) to see an edit made through `.data()`, which autograd's
  /// version counter does not see: true by default. A loop that decodes step
  /// by step with weights it knows to be fixed may turn it off, as the
  /// library's decoders do for the caches of one decoding: the bytes cost
  /// about 5 % of a step at 256 hidden units and 10 % at 512 (batch 1);
  /// every other change (an optimizer step, a load, `to`) is still refused.
  void set_check_weight_bytes(bool check) { check_values_ = check; }
  bool check_weight_bytes() const { return check_values_; }

 private:
  friend struct detail::MultiHeadAttentionCacheAccess;
  /// (B, capacity, num_hiddens), rows [0, length_) filled.
  torch::Tensor keys_, values_;
  /// The buffers of the cache this one was selected from (select_rows).
  torch::Tensor spare_keys_, spare_values_;
  int64_t length_ = 0;
  /// The projections' parameters that filled the cache, as they were then
  /// (Note [Caches keyed on weights]): a cache used with other or changed
  /// weights is refused.
  std::shared_ptr<const detail::WeightSignature> sources_;
  /// set_check_weight_bytes.
  bool check_values_ = true;
};

}  // namespace d2l
