#pragma once

// Drop-ins for LibTorch's own attention modules (docs/nn.md): change
// `torch::nn::MultiheadAttention` to `d2l::nn::MultiheadAttention` (and the
// Transformer layers likewise) and the same options, parameter names,
// forward signatures and results follow, on the library's kernels, with
// Python's behaviour where LibTorch's C++ differs from it.
//
// Not included by the umbrella d2l/attention.h: include <d2l/nn.h>.

#include <d2l/backend.h>
#include <d2l/scaled_dot_product_attention.h>

#include <torch/arg.h>
#include <torch/enum.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <tuple>
#include <variant>
#include <vector>

namespace d2l::nn {

// ---------------------------------------------------------------------------
// MultiheadAttention
// ---------------------------------------------------------------------------

/// torch::nn::MultiheadAttentionOptions' fields and defaults, plus Python's
/// batch_first.
struct MultiheadAttentionOptions {
  /// kdim and vdim default to embed_dim, as LibTorch's.
  MultiheadAttentionOptions(int64_t embed_dim, int64_t num_heads);
  /// Total feature size of the queries, the heads and the output.
  TORCH_ARG(int64_t, embed_dim);
  /// Number of heads; embed_dim must be a multiple of it.
  TORCH_ARG(int64_t, num_heads);
  /// Probability of zeroing an attention weight during training.
  TORCH_ARG(double, dropout) = 0.0;
  /// Whether the in- and out-projections have biases (in_proj_bias, out_proj.bias).
  TORCH_ARG(bool, bias) = true;
  /// Appends a learned key row bias_k and value row bias_v (1, 1, embed_dim)
  /// to the projected keys and values, which every query sees.
  TORCH_ARG(bool, add_bias_kv) = false;
  /// Appends a zero key and value row to every head, which every query sees.
  TORCH_ARG(bool, add_zero_attn) = false;
  /// Feature size of the keys.
  TORCH_ARG(int64_t, kdim);
  /// Feature size of the values.
  TORCH_ARG(int64_t, vdim);
  /// Python's batch_first: inputs and output (N, L, E) instead of LibTorch's
  /// sequence-first (L, N, E).
  TORCH_ARG(bool, batch_first) = false;
  /// Which implementation runs the heads (d2l::AttentionBackend).
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
};

namespace functional {

/// torch::nn::functional::MultiheadAttentionForwardFuncOptions' fields (without
/// static_k and static_v), plus Python's is_causal and batch_first.
struct MultiheadAttentionForwardFuncOptions {
  MultiheadAttentionForwardFuncOptions(int64_t embed_dim_to_check, int64_t num_heads,
                                       torch::Tensor in_proj_weight, torch::Tensor in_proj_bias,
                                       torch::Tensor bias_k, torch::Tensor bias_v,
                                       bool add_zero_attn, double dropout_p,
                                       torch::Tensor out_proj_weight, torch::Tensor out_proj_bias);
  TORCH_ARG(int64_t, embed_dim_to_check);
  TORCH_ARG(int64_t, num_heads);
  /// (3E, E), rows [0, E) for the queries, [E, 2E) keys, [2E, 3E) values;
  /// unused with use_separate_proj_weight.
  TORCH_ARG(torch::Tensor, in_proj_weight);
  /// (3E) or undefined.
  TORCH_ARG(torch::Tensor, in_proj_bias);
  /// (1, 1, E) each, or both undefined.
  TORCH_ARG(torch::Tensor, bias_k);
  TORCH_ARG(torch::Tensor, bias_v);
  TORCH_ARG(bool, add_zero_attn);
  TORCH_ARG(double, dropout_p);
  TORCH_ARG(torch::Tensor, out_proj_weight);
  TORCH_ARG(torch::Tensor, out_proj_bias);
  TORCH_ARG(bool, training) = true;
  /// (N, S): torch::kBool, true at keys no query sees, or floating, added to
  /// the scores.
  TORCH_ARG(torch::Tensor, key_padding_mask) = {};
  TORCH_ARG(bool, need_weights) = true;
  /// (L, S) or (N * num_heads, L, S): torch::kBool, true where a query may not
  /// see a key, or floating, added to the scores.
  TORCH_ARG(torch::Tensor, attn_mask) = {};
  /// Project with q_proj_weight (E, E), k_proj_weight (E, kdim) and
  /// v_proj_weight (E, vdim) instead of in_proj_weight.
  TORCH_ARG(bool, use_separate_proj_weight) = false;
  TORCH_ARG(torch::Tensor, q_proj_weight) = {};
  TORCH_ARG(torch::Tensor, k_proj_weight) = {};
  TORCH_ARG(torch::Tensor, v_proj_weight) = {};
  /// Weights averaged over the heads (N, L, S); else per head (N, num_heads, L, S).
  TORCH_ARG(bool, average_attn_weights) = true;
  /// Query i sees keys j <= i + S - L (the key count before add_bias_kv and
  /// add_zero_attn rows, which every query sees), beside any attn_mask.
  TORCH_ARG(bool, is_causal) = false;
  /// Inputs and output (N, L, E) instead of (L, N, E).
  TORCH_ARG(bool, batch_first) = false;
  /// Which implementation runs the heads (d2l::AttentionBackend).
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
};

/// torch::nn::functional::multi_head_attention_forward, with Python's mask
/// semantics: query (L, N, E), key (S, N, kdim), value (S, N, vdim) (N first
/// with batch_first) -> (attn_output (L, N, E), attn_output_weights (N, L, S)
/// averaged, (N, num_heads, L, S) per head, or undefined without
/// need_weights). Rows that see no key give zero weights and output.
std::tuple<torch::Tensor, torch::Tensor> multi_head_attention_forward(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const MultiheadAttentionForwardFuncOptions& options);

}  // namespace functional

/// Which path multi_head_attention_forward takes for these arguments and why
/// ("additive_mask" for float masks that are not 0/-inf and for
/// add_bias_kv/add_zero_attn, else the path of d2l::functional::multi_head_attention).
/// The same checks and errors as the call.
PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                             const torch::Tensor& value,
                             const functional::MultiheadAttentionForwardFuncOptions& options);

/// torch::nn::MultiheadAttention on the library's kernels; parameters named as
/// LibTorch and Python name them (in_proj_weight or q/k/v_proj_weight,
/// in_proj_bias, bias_k, bias_v, out_proj.weight, out_proj.bias).
class MultiheadAttentionImpl : public torch::nn::Cloneable<MultiheadAttentionImpl> {
 public:
  MultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads)
      : MultiheadAttentionImpl(MultiheadAttentionOptions(embed_dim, num_heads)) {}
  explicit MultiheadAttentionImpl(const MultiheadAttentionOptions& options_);

  /// (attn_output, attn_output_weights) as torch::nn::MultiheadAttention's
  /// forward, with Python's `is_causal` last (MultiheadAttentionForwardFuncOptions).
  std::tuple<torch::Tensor, torch::Tensor> forward(
      const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
      const torch::Tensor& key_padding_mask = {}, bool need_weights = true,
      const torch::Tensor& attn_mask = {}, bool average_attn_weights = true,
      bool is_causal = false);

  /// Which path forward takes for these arguments in the module's mode.
  PathExplanation explain_path(const torch::Tensor& query, const torch::Tensor& key,
                               const torch::Tensor& value,
                               const torch::Tensor& key_padding_mask = {}, bool need_weights = true,
                               const torch::Tensor& attn_mask = {},
                               bool average_attn_weights = true, bool is_causal = false) const;

  void reset() override;
  /// xavier_uniform_ projections, zero biases, xavier_normal_ bias_k/bias_v, as LibTorch.
  void _reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  MultiheadAttentionOptions options;
  bool _qkv_same_embed_dim = true;
  torch::Tensor in_proj_weight;
  torch::Tensor in_proj_bias;
  torch::Tensor bias_k;
  torch::Tensor bias_v;
  torch::nn::Linear out_proj{nullptr};
  torch::Tensor q_proj_weight;
  torch::Tensor k_proj_weight;
  torch::Tensor v_proj_weight;
  int64_t head_dim = 0;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(torch::Tensor())},
                           {4, torch::nn::AnyValue(true)},
                           {5, torch::nn::AnyValue(torch::Tensor())},
                           {6, torch::nn::AnyValue(true)}, {7, torch::nn::AnyValue(false)})

 private:
  functional::MultiheadAttentionForwardFuncOptions call_options(
      const torch::Tensor& key_padding_mask, bool need_weights, const torch::Tensor& attn_mask,
      bool average_attn_weights, bool is_causal) const;
};
TORCH_MODULE(MultiheadAttention);

// ---------------------------------------------------------------------------
// LayerNorm with Python's `bias` option
// ---------------------------------------------------------------------------

struct LayerNormOptions {
  /* implicit */ LayerNormOptions(std::vector<int64_t> normalized_shape);
  TORCH_ARG(std::vector<int64_t>, normalized_shape);
  TORCH_ARG(double, eps) = 1e-5;
  /// Learned weight (and bias) of normalized_shape.
  TORCH_ARG(bool, elementwise_affine) = true;
  /// Python 2.1's bias: without it, only the weight is learned.
  TORCH_ARG(bool, bias) = true;
};

/// torch::nn::LayerNorm with Python's `bias` option; the same parameter names
/// (weight, bias) and forward.
class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl> {
 public:
  LayerNormImpl(std::vector<int64_t> normalized_shape)
      : LayerNormImpl(LayerNormOptions(std::move(normalized_shape))) {}
  explicit LayerNormImpl(LayerNormOptions options_);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& input);

  LayerNormOptions options;
  torch::Tensor weight;
  torch::Tensor bias;
};
TORCH_MODULE(LayerNorm);

// ---------------------------------------------------------------------------
// Transformer layers
// ---------------------------------------------------------------------------

/// torch::nn's activation choice: kReLU, kGELU or a function.
using activation_t = std::variant<torch::enumtype::kReLU, torch::enumtype::kGELU,
                                  std::function<torch::Tensor(const torch::Tensor&)>>;

/// torch::nn::TransformerEncoderLayerOptions, plus Python's batch_first,
/// norm_first, layer_norm_eps and bias.
struct TransformerEncoderLayerOptions {
  TransformerEncoderLayerOptions(int64_t d_model, int64_t nhead);
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, nhead);
  TORCH_ARG(int64_t, dim_feedforward) = 2048;
  TORCH_ARG(double, dropout) = 0.1;
  TORCH_ARG(activation_t, activation) = torch::kReLU;
  /// Inputs (N, S, E) instead of (S, N, E).
  TORCH_ARG(bool, batch_first) = false;
  /// Pre-norm: x + sa(norm1(x)), then x + ff(norm2(x)).
  TORCH_ARG(bool, norm_first) = false;
  TORCH_ARG(double, layer_norm_eps) = 1e-5;
  /// Biases of the attention, the feed-forward Linears and the LayerNorms.
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
};

/// torch::nn::TransformerEncoderLayer on d2l::nn::MultiheadAttention.
class TransformerEncoderLayerImpl : public torch::nn::Cloneable<TransformerEncoderLayerImpl> {
 public:
  TransformerEncoderLayerImpl(int64_t d_model, int64_t nhead)
      : TransformerEncoderLayerImpl(TransformerEncoderLayerOptions(d_model, nhead)) {}
  explicit TransformerEncoderLayerImpl(TransformerEncoderLayerOptions options_);

  /// src (S, N, E) (N first with batch_first); src_mask (S, S) or (N * nhead,
  /// S, S) and src_key_padding_mask (N, S), boolean or float as
  /// MultiheadAttention's; is_causal (Python's) masks future positions.
  torch::Tensor forward(const torch::Tensor& src, const torch::Tensor& src_mask = {},
                        const torch::Tensor& src_key_padding_mask = {}, bool is_causal = false);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  TransformerEncoderLayerOptions options;
  MultiheadAttention self_attn{nullptr};
  torch::nn::Linear linear1{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear linear2{nullptr};
  LayerNorm norm1{nullptr};
  LayerNorm norm2{nullptr};
  torch::nn::Dropout dropout1{nullptr};
  torch::nn::Dropout dropout2{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({1, torch::nn::AnyValue(torch::Tensor())},
                           {2, torch::nn::AnyValue(torch::Tensor())},
                           {3, torch::nn::AnyValue(false)})
};
TORCH_MODULE(TransformerEncoderLayer);

/// torch::nn::TransformerDecoderLayerOptions, plus Python's batch_first,
/// norm_first, layer_norm_eps and bias.
struct TransformerDecoderLayerOptions {
  TransformerDecoderLayerOptions(int64_t d_model, int64_t nhead);
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, nhead);
  TORCH_ARG(int64_t, dim_feedforward) = 2048;
  TORCH_ARG(double, dropout) = 0.1;
  TORCH_ARG(activation_t, activation) = torch::kReLU;
  TORCH_ARG(bool, batch_first) = false;
  TORCH_ARG(bool, norm_first) = false;
  TORCH_ARG(double, layer_norm_eps) = 1e-5;
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
};

/// torch::nn::TransformerDecoderLayer on d2l::nn::MultiheadAttention.
class TransformerDecoderLayerImpl : public torch::nn::Cloneable<TransformerDecoderLayerImpl> {
 public:
  TransformerDecoderLayerImpl(int64_t d_model, int64_t nhead)
      : TransformerDecoderLayerImpl(TransformerDecoderLayerOptions(d_model, nhead)) {}
  explicit TransformerDecoderLayerImpl(TransformerDecoderLayerOptions options_);

  /// tgt (T, N, E), memory (S, N, E) (N first with batch_first); the masks as
  /// MultiheadAttention's; tgt_is_causal and memory_is_causal are Python's.
  torch::Tensor forward(const torch::Tensor& tgt, const torch::Tensor& memory,
                        const torch::Tensor& tgt_mask = {}, const torch::Tensor& memory_mask = {},
                        const torch::Tensor& tgt_key_padding_mask = {},
                        const torch::Tensor& memory_key_padding_mask = {},
                        bool tgt_is_causal = false, bool memory_is_causal = false);

  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  TransformerDecoderLayerOptions options;
  MultiheadAttention self_attn{nullptr};
  MultiheadAttention multihead_attn{nullptr};
  torch::nn::Linear linear1{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear linear2{nullptr};
  LayerNorm norm1{nullptr};
  LayerNorm norm2{nullptr};
  LayerNorm norm3{nullptr};
  torch::nn::Dropout dropout1{nullptr};
  torch::nn::Dropout dropout2{nullptr};
  torch::nn::Dropout dropout3{nullptr};

 protected:
  FORWARD_HAS_DEFAULT_ARGS({2, torch::nn::AnyValue(torch::Tensor())},
                           {3, torch::nn::AnyValue(torch::Tensor())},
                           {4, torch::nn::AnyValue(torch::Tensor())},
                           {5, torch::nn::AnyValue(torch::Tensor())},
                           {6, torch::nn::AnyValue(false)}, {7, torch::nn::AnyValue(false)})
};
TORCH_MODULE(TransformerDecoderLayer);

}  // namespace d2l::nn
