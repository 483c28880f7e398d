#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <tuple>

namespace d2l {

namespace functional {
/// The book's non-parametric Nadaraya–Watson pooling with a Gaussian kernel:
/// every query attends to the same `keys` (n_k) with weights
/// softmax_j(-(q_i - k_j)² / 2), and pools `values` (n_k). `queries` is (n_q).
/// Returns (output (n_q), attention_weights (n_q, n_k)).
std::tuple<torch::Tensor, torch::Tensor> nadaraya_watson(const torch::Tensor& queries,
                                                         const torch::Tensor& keys,
                                                         const torch::Tensor& values);

/// The parametric pooling of the book's NWKernelRegression: query i attends to
/// its own row of `keys` (n_q, n_k) with weights softmax_j(-((q_i - k_ij) w)² / 2)
/// and pools its row of `values` (n_q, n_k). `w` holds one element (shape [1]
/// or []). Returns (output (n_q), attention_weights (n_q, n_k)).
std::tuple<torch::Tensor, torch::Tensor> nw_kernel_regression(const torch::Tensor& queries,
                                                              const torch::Tensor& keys,
                                                              const torch::Tensor& values,
                                                              const torch::Tensor& w);
}  // namespace functional

/// d2l's `NWKernelRegression`: Nadaraya–Watson pooling with a learnable
/// kernel width. Its one parameter is named `w` (shape [1], drawn from U[0, 1)
/// as in the book), so `named_parameters()` matches the book's state_dict.
class NWKernelRegressionImpl : public torch::nn::Cloneable<NWKernelRegressionImpl> {
 public:
  NWKernelRegressionImpl();

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// Module::load, checked first: a tensor of another shape or dtype, or a
  /// missing or extra one, is a c10::Error and nothing is loaded.
  void load(torch::serialize::InputArchive& archive) override;

  /// queries (n_q), keys and values (n_q, n_k) -> (n_q).
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& keys,
                        const torch::Tensor& values);

  /// attention_weights, read safely while other threads call forward.
  torch::Tensor last_attention_weights() const;

  torch::Tensor w;
  /// Weights of the last forward call, (n_q, n_k). Shared modules are safe
  /// to call from many threads; while they run, read the weights through
  /// last_attention_weights() (Note [Recording attention weights] in
  /// src/attention_weights.h; README, "Threads").
  torch::Tensor attention_weights;
};
TORCH_MODULE(NWKernelRegression);

}  // namespace d2l
