// The book's MaskedSoftmaxCELoss and grad_clipping.

#include <d2l/sequence_mask.h>
#include <d2l/train.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>

#include <cmath>
#include <ostream>

#include "train_internal.h"

namespace d2l {

namespace {

std::string shape(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += fmt::format("{}{}", d ? ", " : "", t.size(d));
  return s + "]";
}

}  // namespace

torch::Tensor MaskedSoftmaxCELossImpl::forward(const torch::Tensor& pred,
                                               const torch::Tensor& label,
                                               const torch::Tensor& valid_len) {
  constexpr const char* fn = "d2l::MaskedSoftmaxCELoss";
  TORCH_CHECK(pred.defined() && pred.dim() == 3 && pred.is_floating_point(),
              fmt::format("{}: pred must be a floating-point (batch, steps, vocab) tensor, got {}",
                          fn, shape(pred)));
  TORCH_CHECK(
      label.defined() && label.dim() == 2 && !label.is_floating_point() &&
          label.size(0) == pred.size(0) && label.size(1) == pred.size(1),
      fmt::format("{}: label must be an integer (batch, steps) tensor matching pred {}, got {}", fn,
                  shape(pred), shape(label)));
  TORCH_CHECK(valid_len.defined() && valid_len.dim() == 1 && valid_len.size(0) == pred.size(0),
              fmt::format("{}: valid_len must be a (batch) tensor for pred {}, got {}", fn,
                          shape(pred), shape(valid_len)));
  if (label.numel() > 0) {
    const int64_t lo = label.min().item<int64_t>(), hi = label.max().item<int64_t>();
    const int64_t bad = lo < 0 ? lo : hi;
    TORCH_CHECK(lo >= 0 && hi < pred.size(2),
                fmt::format("{}: label holds id {}, outside the vocabulary of size {}", fn, bad,
                            pred.size(2)));
  }
  const auto weights = d2l::sequence_mask(torch::ones_like(label, pred.options()), valid_len);
  const auto unweighted = torch::nn::functional::cross_entropy(
      pred.permute({0, 2, 1}), label.to(torch::kLong),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (unweighted * weights).mean(1);
}

void MaskedSoftmaxCELossImpl::pretty_print(std::ostream& stream) const {
  stream << "d2l::MaskedSoftmaxCELoss()";
}

namespace detail {

void clip_gradients(const std::vector<torch::Tensor>& params, double theta) {
  TORCH_CHECK(theta > 0, fmt::format("d2l::grad_clipping: theta must be positive, got {}", theta));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.requires_grad() && p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return;
  auto norm = torch::zeros({}, grads.front().options().dtype(torch::kDouble));
  for (const auto& g : grads) {
    // A bfloat16 sum keeps 8 bits: square and add in float32.
    const bool reduced = g.scalar_type() == torch::kBFloat16 || g.scalar_type() == torch::kHalf;
    norm += (reduced ? g.to(torch::kFloat) : g).pow(2).sum().to(torch::kDouble);
  }
  const double value = std::sqrt(norm.item<double>());
  if (value > theta) {
    for (auto& g : grads) g.mul_(theta / value);
  }
}

}  // namespace detail

// Not torch::nn::utils::clip_grad_norm_: see the header.
void grad_clipping(torch::nn::Module& net, double theta) {
  detail::clip_gradients(net.parameters(), theta);
}

}  // namespace d2l
