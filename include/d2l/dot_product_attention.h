#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <d2l/attention_mask.h>
#include <d2l/backend.h>

#include <tuple>

namespace d2l {

struct DotProductAttentionOptions {
  /// Probability of zeroing an attention weight during training.
  TORCH_ARG(double, dropout) = 0.0;
  /// Fused CPU kernel, the book's composite ops, LibTorch's SDPA, or the best
  /// for the inputs (AttentionBackend).
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
  /// Keep each forward's weights in `attention_weights` (as the book does);
  /// turn off in inference servers to save the memory and the lock. Off, no
  /// (B, n, m) tensor is made on the CPU, and AttentionBackend::kAuto runs
  /// SDPA on CUDA.
  TORCH_ARG(bool, record_attention_weights) = true;

 public:
  /// The `backend` option's name in 0.2, kept for one minor version.
  [[deprecated("the `path` option is now `backend`")]] DotProductAttentionOptions& path(
      AttentionBackend backend) {
    return this->backend(backend);
  }
  [[deprecated("the `path` option is now `backend`")]] AttentionBackend path() const {
    return backend();
  }
};

namespace functional {

/// The settings of functional::dot_product_attention, as LibTorch's
/// F::MultiheadAttentionForwardFuncOptions: every field optional. The mask
/// (`mask`, or `valid_lens`, `key_padding_mask`, `attn_mask` and `is_causal`
/// one by one) is AttentionMask's.
struct DotProductAttentionFuncOptions : AttentionMaskArgs<DotProductAttentionFuncOptions> {
  /// Probability of zeroing an attention weight when `training`; in [0, 1].
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, training) = false;
  /// Which implementation runs (AttentionBackend); explain_path says which
  /// path it takes for given inputs.
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
  /// Whether to return the weights. Off, no (B, n, m) tensor is made on the
  /// CPU, and AttentionBackend::kAuto may run LibTorch's SDPA on CUDA.
  TORCH_ARG(bool, need_weights) = true;
};

/// Scaled dot-product attention, softmax(Q Kᵀ / √d) V, masked by
/// `options.valid_lens()` and LibTorch's masks (AttentionMask; a key is seen
/// where all allow it): queries (B, n, d), keys (B, m, d), values (B, m,
/// v). Returns (output (B, n, v), attention_weights (B, n, m) before dropout,
/// as the book stores them, or undefined when `need_weights` is false).
std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const DotProductAttentionFuncOptions& options = {});

/// The positional form of 0.2, kept for one minor version.
[[deprecated(
    "use functional::dot_product_attention(q, k, v, DotProductAttentionFuncOptions()"
    ".valid_lens(l).dropout(p).training(t).backend(b).need_weights(w))")]] inline std::
    tuple<torch::Tensor, torch::Tensor>
    dot_product_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                          const torch::Tensor& values, const torch::Tensor& valid_lens,
                          double dropout = 0.0, bool training = false,
                          AttentionBackend backend = AttentionBackend::kAuto,
                          bool need_weights = true) {
  return dot_product_attention(queries, keys, values,
                               DotProductAttentionFuncOptions()
                                   .valid_lens(valid_lens)
                                   .dropout(dropout)
                                   .training(training)
                                   .backend(backend)
                                   .need_weights(need_weights));
}

}  // namespace functional

/// Which path functional::dot_product_attention takes for these arguments,
/// and why it refused the faster ones; the same checks and errors as the
/// call, without computing anything.
PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values,
                             const functional::DotProductAttentionFuncOptions& options = {});

/// d2l's `DotProductAttention`: queries (B, n, d), keys (B, m, d), values (B, m, v)
/// -> (B, n, v). `forward` is functional::dot_product_attention with the
/// module's dropout and options.
class DotProductAttentionImpl : public torch::nn::Cloneable<DotProductAttentionImpl> {
 public:
  explicit DotProductAttentionImpl(double dropout);
  explicit DotProductAttentionImpl(const DotProductAttentionOptions& options_ = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's `forward(queries, keys, values, valid_lens)`; `mask` is the
  /// valid lengths or any AttentionMask.
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const AttentionMask& mask = {});

  /// forward, returning (output, weights (B, n, m) before dropout, with their
  /// graph) and leaving `attention_weights` alone, as LibTorch's
  /// MultiheadAttention::forward returns (attn_output, attn_output_weights).
  /// Safe to call from many threads at once.
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
  /// (explain_path with the module's dropout and options).
  PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                               const torch::Tensor& values, const AttentionMask& mask = {}) const;

  DotProductAttentionOptions options;
  torch::nn::Dropout dropout{nullptr};
  /// attention_weights, read safely while other threads call forward
  /// (Note [Recording attention weights] in src/attention_weights.h).
  torch::Tensor last_attention_weights() const;

  /// Weights of the last forward call, (B, n, m), before dropout, outside the
  /// autograd graph. Shared modules are safe to call from many threads; while
  /// they run, read the weights through last_attention_weights() (README,
  /// "Threads").
  torch::Tensor attention_weights;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(AttentionMask())})
};
TORCH_MODULE(DotProductAttention);

}  // namespace d2l
