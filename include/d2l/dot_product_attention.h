#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <d2l/backend.h>

#include <tuple>

namespace d2l {

struct DotProductAttentionOptions {
  /// Probability of zeroing an attention weight during training.
  TORCH_ARG(double, dropout) = 0.0;
  /// Fused CPU kernel, the book's composite ops, LibTorch's SDPA, or the best
  /// for the inputs (Path).
  TORCH_ARG(Path, path) = Path::kAuto;
  /// Keep each forward's weights in `attention_weights` (as the book does);
  /// turn off in inference servers to save the memory and the lock. Off, no
  /// (B, n, m) tensor is made on the CPU, and Path::kAuto runs SDPA on CUDA
  /// (Path).
  TORCH_ARG(bool, record_attention_weights) = true;

  D2L_DEPRECATED_IMPL_OPTION(DotProductAttentionOptions)
};

namespace functional {
/// Scaled dot-product attention, softmax(Q Kᵀ / √d) V with masking by
/// `valid_lens` ((batch) or (batch, queries)). Returns (output, attention_weights);
/// the weights are those before dropout, as the book stores them. With
/// `need_weights` false the weights are undefined, no (B, n, m) tensor is
/// made on the CPU, and Path::kAuto may run LibTorch's SDPA on CUDA (Path).
std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens = {}, double dropout = 0.0, bool training = false,
    Path path = Path::kAuto, bool need_weights = true);
}  // namespace functional

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

  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& valid_lens = {});

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
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(DotProductAttention);

}  // namespace d2l
