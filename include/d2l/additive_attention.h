#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <d2l/attention_mask.h>
#include <d2l/backend.h>

#include <tuple>

#include <cstdint>

namespace d2l {

struct AdditiveAttentionOptions {
  AdditiveAttentionOptions(int64_t key_size, int64_t query_size, int64_t num_hiddens);
  /// Feature size of the keys.
  TORCH_ARG(int64_t, key_size);
  /// Feature size of the queries.
  TORCH_ARG(int64_t, query_size);
  /// Hidden units h of the scoring MLP.
  TORCH_ARG(int64_t, num_hiddens);
  /// Probability of zeroing an attention weight during training.
  TORCH_ARG(double, dropout) = 0.0;
  /// Fused CPU kernel, the book's composite ops, or the best for the device
  /// (on CUDA: scores by blocks of queries, so memory stays bounded).
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
  /// Keep each forward's weights in `attention_weights` (as the book does);
  /// turn off in inference servers to save the memory and the lock.
  TORCH_ARG(bool, record_attention_weights) = true;

 public:
  /// The `backend` option's name in 0.2, kept for one minor version.
  [[deprecated("the `path` option is now `backend`")]] AdditiveAttentionOptions& path(
      AttentionBackend backend) {
    return this->backend(backend);
  }
  [[deprecated("the `path` option is now `backend`")]] AttentionBackend path() const {
    return backend();
  }
};

namespace functional {

/// The settings of functional::additive_scores.
struct AdditiveScoresFuncOptions {
  /// Which implementation runs (AttentionBackend; kSdpa is an error).
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
};

/// Additive attention scores w_vᵀ tanh(q_i + k_j) for queries already projected
/// by W_q, (B, n, h), keys already projected by W_k, (B, m, h), and `w_v` of
/// shape (1, h) (the weight of the bias-free Linear(h, 1)). Returns (B, n, m).
/// No path but the composite one holds the (B, n, m, h) features: the fused
/// CPU kernel and the chunked path (other devices) recompute tanh in backward.
torch::Tensor additive_scores(const torch::Tensor& projected_queries,
                              const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                              const AdditiveScoresFuncOptions& options = {});

/// The weights and settings of functional::additive_attention, as LibTorch's
/// F::MultiheadAttentionForwardFuncOptions: the weights of the three
/// bias-free Linear layers in the constructor, W_q (h, query_size), W_k (h,
/// key_size) and w_v (1, h); the rest optional. The mask (`mask`, or
/// `valid_lens`, `key_padding_mask`, `attn_mask` and `is_causal` one by one)
/// is AttentionMask's: masks that are lengths run the fused kernels, others
/// the chunked or composite path.
struct AdditiveAttentionFuncOptions : AttentionMaskArgs<AdditiveAttentionFuncOptions> {
  AdditiveAttentionFuncOptions(torch::Tensor W_q, torch::Tensor W_k, torch::Tensor w_v);
  TORCH_ARG(torch::Tensor, W_q);
  TORCH_ARG(torch::Tensor, W_k);
  TORCH_ARG(torch::Tensor, w_v);
  /// Probability of zeroing an attention weight when `training`; in [0, 1].
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(bool, training) = false;
  /// Which implementation runs (AttentionBackend; kSdpa is an error);
  /// explain_path says which path it takes for given inputs.
  TORCH_ARG(AttentionBackend, backend) = AttentionBackend::kAuto;
  /// Whether to return the weights.
  TORCH_ARG(bool, need_weights) = true;
};

/// The book's additive attention: weights = masked_softmax(w_vᵀ tanh(W_q q_i +
/// W_k k_j), valid_lens), output = dropout(weights) V. `queries` (B, n,
/// query_size), `keys` (B, m, key_size), `values` (B, m, v). Returns (output
/// (B, n, v), attention_weights (B, n, m) before dropout, or undefined when
/// `need_weights` is false).
std::tuple<torch::Tensor, torch::Tensor> additive_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const AdditiveAttentionFuncOptions& options);

/// The positional forms of 0.2, kept for one minor version.
[[deprecated(
    "use functional::additive_scores(q, k, w_v, "
    "AdditiveScoresFuncOptions().backend(b))")]] inline torch::Tensor
additive_scores(const torch::Tensor& projected_queries, const torch::Tensor& projected_keys,
                const torch::Tensor& w_v, AttentionBackend backend) {
  return additive_scores(projected_queries, projected_keys, w_v,
                         AdditiveScoresFuncOptions().backend(backend));
}
[[deprecated(
    "use functional::additive_attention(q, k, v, AdditiveAttentionFuncOptions(W_q, W_k, w_v)"
    ".valid_lens(l).dropout(p).training(t).backend(b).need_weights(w))")]] inline std::
    tuple<torch::Tensor, torch::Tensor>
    additive_attention(const torch::Tensor& queries, const torch::Tensor& keys,
                       const torch::Tensor& values, const torch::Tensor& W_q,
                       const torch::Tensor& W_k, const torch::Tensor& w_v,
                       const torch::Tensor& valid_lens = {}, double dropout = 0.0,
                       bool training = false, AttentionBackend backend = AttentionBackend::kAuto,
                       bool need_weights = true) {
  return additive_attention(queries, keys, values,
                            AdditiveAttentionFuncOptions(W_q, W_k, w_v)
                                .valid_lens(valid_lens)
                                .dropout(dropout)
                                .training(training)
                                .backend(backend)
                                .need_weights(need_weights));
}

}  // namespace functional

/// Which path functional::additive_attention takes for these arguments, and
/// why it refused the faster ones; the same checks and errors as the call,
/// without computing anything.
PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                             const torch::Tensor& values,
                             const functional::AdditiveAttentionFuncOptions& options);

/// d2l's `AdditiveAttention`: queries (B, n, query_size), keys (B, m, key_size),
/// values (B, m, v) -> (B, n, v). Parameters are named exactly as in the book's
/// state_dict: `W_k.weight`, `W_q.weight`, `w_v.weight`. `forward` is
/// functional::additive_attention with the module's weights and options.
class AdditiveAttentionImpl : public torch::nn::Cloneable<AdditiveAttentionImpl> {
 public:
  AdditiveAttentionImpl(int64_t key_size, int64_t query_size, int64_t num_hiddens, double dropout);
  explicit AdditiveAttentionImpl(const AdditiveAttentionOptions& options_);

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

  /// Which path forward takes for these inputs in the module's mode, and why
  /// (explain_path with the module's weights, dropout and options).
  PathExplanation explain_path(const torch::Tensor& queries, const torch::Tensor& keys,
                               const torch::Tensor& values, const AttentionMask& mask = {}) const;

  AdditiveAttentionOptions options;
  torch::nn::Linear W_k{nullptr};
  torch::nn::Linear W_q{nullptr};
  torch::nn::Linear w_v{nullptr};
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
TORCH_MODULE(AdditiveAttention);

}  // namespace d2l
