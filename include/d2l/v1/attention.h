#pragma once

// d2l 1.0's scoring functions and multi-head attention (d2l.ai, "Attention
// Mechanisms and Transformers"), with the book's constructors: the layers'
// input widths are lazy (d2l/lazy.h), read from the first call or from a
// loaded state dict. The computation is the 0.17 edition's, with its fast
// paths and explain_path (docs/editions.md).

#include <d2l/additive_attention.h>
#include <d2l/attention_mask.h>
#include <d2l/backend.h>
#include <d2l/dot_product_attention.h>
#include <d2l/lazy.h>
#include <d2l/masked_softmax.h>
#include <d2l/multi_head_attention.h>
#include <d2l/sequence_mask.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <tuple>

namespace d2l::v1 {

// The same in both editions: d2l 1.0's masked_softmax(X, valid_lens) and
// DotProductAttention(dropout) are 0.17's.
using d2l::masked_softmax;
using d2l::sequence_mask;
using DotProductAttention = d2l::DotProductAttention;
using DotProductAttentionImpl = d2l::DotProductAttentionImpl;

/// d2l 1.0's `AdditiveAttention(num_hiddens, dropout)`: W_q, W_k and w_v are
/// lazy (LazyLinear without bias), so the query and key widths come from the
/// first call. Parameters `W_k.weight`, `W_q.weight`, `w_v.weight`, as the
/// book's state_dict.
class AdditiveAttentionImpl : public torch::nn::Cloneable<AdditiveAttentionImpl> {
 public:
  AdditiveAttentionImpl(int64_t num_hiddens, double dropout);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// queries (B, n, q), keys (B, m, k), values (B, m, v), `mask` the book's
  /// valid_lens ((B) or (B, n)) or any AttentionMask -> (B, n, v). The book
  /// requires valid_lens; here it may be left out.
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const AttentionMask& mask = {});
  /// forward, returning (output, weights (B, n, m) before dropout).
  std::tuple<torch::Tensor, torch::Tensor> forward_with_weights(const torch::Tensor& queries,
                                                                const torch::Tensor& keys,
                                                                const torch::Tensor& values,
                                                                const AttentionMask& mask = {});
  /// Which path forward takes, and why (the widths must be fixed already).
  PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                               const torch::Tensor& values, const AttentionMask& mask = {}) const;
  torch::Tensor last_attention_weights() const;

  int64_t num_hiddens;
  double dropout_p;
  AttentionBackend backend = AttentionBackend::kAuto;
  LazyLinear W_k{nullptr};
  LazyLinear W_q{nullptr};
  LazyLinear w_v{nullptr};
  torch::nn::Dropout dropout{nullptr};
  /// Weights of the last forward call, (B, n, m), before dropout.
  torch::Tensor attention_weights;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(AttentionMask())})

 private:
  void ensure_widths(const char* fn, const torch::Tensor& queries, const torch::Tensor& keys,
                     const torch::Tensor& values);
  functional::AdditiveAttentionFuncOptions call(const char* fn, const AttentionMask& mask,
                                                bool need_weights) const;
};
TORCH_MODULE(AdditiveAttention);

/// d2l 1.0's `MultiHeadAttention(num_hiddens, num_heads, dropout,
/// bias=False)`: W_q, W_k, W_v and W_o are LazyLinear(num_hiddens, bias), so
/// queries, keys and values may have any widths, fixed by the first call.
/// Parameters `W_q.weight`, `W_k.weight`, `W_v.weight`, `W_o.weight` (and
/// `.bias`), as the book's state_dict. Its inner `attention` holds the
/// per-head weights of the last call, (B * num_heads, n, m), as the book's.
class MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl> {
 public:
  MultiHeadAttentionImpl(int64_t num_hiddens, int64_t num_heads, double dropout,
                         bool bias = false);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  void load(torch::serialize::InputArchive& archive) override;

  /// The book's forward(queries, keys, values, valid_lens): queries (B, n, q),
  /// keys (B, m, k), values (B, m, v) -> (B, n, num_hiddens); `mask` is the
  /// valid lengths or any AttentionMask (optional here).
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const AttentionMask& mask = {});
  /// forward, returning (output, per-head weights (B * num_heads, n, m)).
  std::tuple<torch::Tensor, torch::Tensor> forward_with_weights(const torch::Tensor& queries,
                                                                const torch::Tensor& keys,
                                                                const torch::Tensor& values,
                                                                const AttentionMask& mask = {});
  /// Which path forward takes, and why (the widths must be fixed already).
  PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                               const torch::Tensor& values, const AttentionMask& mask = {}) const;
  torch::Tensor last_attention_weights() const;

  int64_t num_hiddens;
  int64_t num_heads;
  double dropout_p;
  bool bias;
  DotProductAttention attention{nullptr};
  LazyLinear W_q{nullptr};
  LazyLinear W_k{nullptr};
  LazyLinear W_v{nullptr};
  LazyLinear W_o{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(AttentionMask())})

 private:
  void ensure_widths(const char* fn, const torch::Tensor& queries, const torch::Tensor& keys,
                     const torch::Tensor& values);
  functional::MultiHeadAttentionFuncOptions call(const char* fn, const AttentionMask& mask,
                                                 bool need_weights) const;
};
TORCH_MODULE(MultiHeadAttention);

}  // namespace d2l::v1
