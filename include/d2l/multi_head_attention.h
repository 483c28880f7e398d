#pragma once

#include <d2l/dot_product_attention.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>

namespace d2l {

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
  /// Path of the inner DotProductAttention (DotProductAttentionOptions::impl).
  TORCH_ARG(Impl, impl) = Impl::kAuto;
  /// Whether the inner DotProductAttention keeps the per-head weights of the
  /// last call in `attention->attention_weights`; off for concurrent use
  /// (DotProductAttentionOptions::record_attention_weights).
  TORCH_ARG(bool, record_attention_weights) = true;
};

/// Splits the features of `X` (B, n, num_hiddens) into heads:
/// (B * num_heads, n, num_hiddens / num_heads), head-major within each batch.
torch::Tensor transpose_qkv(const torch::Tensor& X, int64_t num_heads);

/// Inverse of transpose_qkv: (B * num_heads, n, d) -> (B, n, num_heads * d).
torch::Tensor transpose_output(const torch::Tensor& X, int64_t num_heads);

/// d2l's `MultiHeadAttention`: queries (B, n, query_size), keys (B, m, key_size),
/// values (B, m, value_size), valid_lens (B) or (B, n) -> (B, n, num_hiddens).
/// Parameters are named as in the book's state_dict: `W_q.weight`, `W_k.weight`,
/// `W_v.weight`, `W_o.weight` (and `.bias` of each with bias=true).
class MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl> {
 public:
  MultiHeadAttentionImpl(int64_t key_size, int64_t query_size, int64_t value_size,
                         int64_t num_hiddens, int64_t num_heads, double dropout, bool bias = false);
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& valid_lens = {});

  MultiHeadAttentionOptions options;
  /// Its attention_weights after a forward call are per head: (B * num_heads, n, m).
  DotProductAttention attention{nullptr};
  torch::nn::Linear W_q{nullptr};
  torch::nn::Linear W_k{nullptr};
  torch::nn::Linear W_v{nullptr};
  torch::nn::Linear W_o{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(MultiHeadAttention);

}  // namespace d2l
