#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/common.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <d2l/backend.h>

#include <memory>
#include <mutex>
#include <tuple>

#include <cstdint>

namespace d2l {

class AdditiveAttentionImpl;
namespace detail {
/// Internal, not part of the API: AdditiveAttention::forward after its checks
/// and projections. Returns (output, attention weights) and records the
/// weights in the module if its options say so. Apart from forward so that a
/// decoder can project its keys once per sequence and reuse them at every step.
std::tuple<torch::Tensor, torch::Tensor> additive_attention_nocheck(
    AdditiveAttentionImpl& attention, const torch::Tensor& projected_queries,
    const torch::Tensor& projected_keys, const torch::Tensor& values,
    const torch::Tensor& valid_lens);
}  // namespace detail

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
  TORCH_ARG(Impl, impl) = Impl::kAuto;
  /// Keep each forward's weights in `attention_weights` (as the book does);
  /// turn off in inference servers to save the memory and the lock.
  TORCH_ARG(bool, record_attention_weights) = true;
};

namespace functional {
/// Additive attention scores w_vᵀ tanh(q_i + k_j) for queries already projected
/// by W_q, (B, n, h), keys already projected by W_k, (B, m, h), and `w_v` of
/// shape (1, h) (the weight of the bias-free Linear(h, 1)). Returns (B, n, m).
/// No path but kComposite holds the (B, n, m, h) features: the fused CPU kernel
/// and the chunked path (other devices) recompute tanh in backward.
torch::Tensor additive_scores(const torch::Tensor& projected_queries,
                              const torch::Tensor& projected_keys, const torch::Tensor& w_v,
                              Impl impl = Impl::kAuto);
}  // namespace functional

/// d2l's `AdditiveAttention`: queries (B, n, query_size), keys (B, m, key_size),
/// values (B, m, v) -> (B, n, v). Parameters are named exactly as in the book's
/// state_dict: `W_k.weight`, `W_q.weight`, `w_v.weight`.
class AdditiveAttentionImpl : public torch::nn::Cloneable<AdditiveAttentionImpl> {
 public:
  AdditiveAttentionImpl(int64_t key_size, int64_t query_size, int64_t num_hiddens,
                        double dropout);
  explicit AdditiveAttentionImpl(const AdditiveAttentionOptions& options_);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& valid_lens = {});

  AdditiveAttentionOptions options;
  torch::nn::Linear W_k{nullptr};
  torch::nn::Linear W_q{nullptr};
  torch::nn::Linear w_v{nullptr};
  torch::nn::Dropout dropout{nullptr};
  /// Weights of the last forward call, (B, n, m), before dropout. Concurrent
  /// forward calls are safe: each stores its weights under a lock, and the
  /// member holds one of them afterwards; read it only when no forward runs.
  torch::Tensor attention_weights;

 protected:
  FORWARD_HAS_DEFAULT_ARGS({3, torch::nn::AnyValue(torch::Tensor())})

 private:
  friend std::tuple<torch::Tensor, torch::Tensor> detail::additive_attention_nocheck(
      AdditiveAttentionImpl&, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
      const torch::Tensor&);
  std::shared_ptr<std::mutex> record_mutex_ = std::make_shared<std::mutex>();
};
TORCH_MODULE(AdditiveAttention);

}  // namespace d2l
