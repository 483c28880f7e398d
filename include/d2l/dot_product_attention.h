#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <tuple>

namespace d2l {

struct DotProductAttentionOptions {
  /// Probability of zeroing an attention weight during training.
  TORCH_ARG(double, dropout) = 0.0;
};

namespace functional {
/// Scaled dot-product attention, softmax(Q Kᵀ / √d) V with masking by
/// `valid_lens` ((batch) or (batch, queries)). Returns (output, attention_weights);
/// the weights are those before dropout, as the book stores them.
std::tuple<torch::Tensor, torch::Tensor> dot_product_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens = {}, double dropout = 0.0, bool training = false);
}  // namespace functional

/// d2l's `DotProductAttention`: queries (B, n, d), keys (B, m, d), values (B, m, v)
/// -> (B, n, v).
class DotProductAttentionImpl : public torch::nn::Cloneable<DotProductAttentionImpl> {
 public:
  explicit DotProductAttentionImpl(double dropout);
  explicit DotProductAttentionImpl(const DotProductAttentionOptions& options_ = {});

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& valid_lens = {});

  DotProductAttentionOptions options;
  torch::nn::Dropout dropout{nullptr};
  /// Weights of the last forward call, (B, n, m), before dropout.
  torch::Tensor attention_weights;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(DotProductAttention);

}  // namespace d2l
