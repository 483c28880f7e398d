#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

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
  TORCH_ARG(Path, path) = Path::kAuto;
  /// Keep each forward's weights in `attention_weights` (as the book does);
  /// turn off in inference servers to save the memory and the lock.
  TORCH_ARG(bool, record_attention_weights) = true;

  D2L_DEPRECATED_IMPL_OPTION(AdditiveAttentionOptions)
};

namespace functional {
/// Additive attention scores w_vᵀ tanh(q_i + k_j) for queries already projected
/// by W_q, (B, n, h), keys already projected by W_k, (B, m, h), and `w_v` of
/// shape (1, h) (the weight of the bias-free Linear(h, 1)). Returns (B, n, m).
/// No path but kComposite holds the (B, n, m, h) features: the fused CPU kernel
/// and the chunked path (other devices) recompute tanh in backward.
torch::Tensor additive_scores(const torch::Tensor& projected_queries,
                              const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                              Path path = Path::kAuto);

/// The book's additive attention: weights = masked_softmax(w_vᵀ tanh(W_q q_i +
/// W_k k_j), valid_lens), output = dropout(weights) V. `queries` (B, n,
/// query_size), `keys` (B, m, key_size), `values` (B, m, v); `W_q` (h,
/// query_size), `W_k` (h, key_size) and `w_v` (1, h) are the weights of the
/// three bias-free Linear layers. Returns (output (B, n, v), attention_weights
/// (B, n, m) before dropout, or undefined when `need_weights` is false).
std::tuple<torch::Tensor, torch::Tensor> additive_attention(
    const torch::Tensor& queries, const torch::Tensor& keys, const torch::Tensor& values,
    const torch::Tensor& W_q, const torch::Tensor& W_k, const torch::Tensor& w_v,
    const torch::Tensor& valid_lens = {}, double dropout = 0.0, bool training = false,
    Path path = Path::kAuto, bool need_weights = true);
}  // namespace functional

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

  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& valid_lens = {});

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
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(torch::Tensor())})
};
TORCH_MODULE(AdditiveAttention);

}  // namespace d2l
