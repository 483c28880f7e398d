#pragma once

// Helpers shared by the test files: error-message capture, independent
// double-precision references, finite-difference gradient checks, and a
// module's printed form and parameter names.

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <d2l/masked_softmax.h>

#include <deque>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace d2l::testing {

/// A dtype and the tolerances of a fast path against the composite oracle in
/// that dtype (forward values, input gradients).
struct DtypeTolerance {
  torch::Dtype dtype;
  double forward, backward;
};

/// A sparse copy of `t`: the layout that every argument check must refuse.
inline torch::Tensor sparse(const torch::Tensor& t) { return t.to_sparse(); }

/// Runs `fn`, which must throw c10::Error; returns the message without backtrace.
template <typename Fn>
std::string error_message(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected c10::Error, got another exception: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected c10::Error, nothing was thrown";
  return {};
}

/// Masked softmax computed one row at a time in double, independently of the
/// library: `lens` may be undefined, (B) or (B, n).
inline torch::Tensor reference_masked_softmax(const torch::Tensor& X, const torch::Tensor& lens) {
  const auto x = X.detach().to(torch::kDouble).contiguous();
  auto out = torch::zeros_like(x);
  const int64_t B = x.size(0), n = x.size(1), m = x.size(2);
  auto xa = x.accessor<double, 3>();
  auto oa = out.accessor<double, 3>();
  const auto l = lens.defined() ? lens.to(torch::kLong).cpu() : torch::Tensor();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t valid = m;
      if (l.defined())
        valid = std::min<int64_t>(m, l.dim() == 1 ? l[b].item<int64_t>() : l[b][i].item<int64_t>());
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, xa[b][i][j]);
      double sum = 0;
      for (int64_t j = 0; j < valid; ++j) sum += std::exp(xa[b][i][j] - mx);
      for (int64_t j = 0; j < valid; ++j) oa[b][i][j] = std::exp(xa[b][i][j] - mx) / sum;
    }
  }
  return out;
}

/// Compares the autograd gradient of sum(f(inputs) * G) with central
/// differences, for every element of every input (float64 inputs only).
inline void expect_gradients_match_finite_differences(
    const std::function<torch::Tensor(const std::vector<torch::Tensor>&)>& f,
    std::vector<torch::Tensor> inputs, double eps = 1e-6, double tol = 1e-6) {
  for (auto& t : inputs) t = t.detach().clone().set_requires_grad(true);
  const auto out = f(inputs);
  const auto G = torch::randn_like(out);
  (out * G).sum().backward();
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    auto x = inputs[k];
    auto flat = x.view(-1);
    ASSERT_TRUE(x.grad().defined()) << "input " << k << " got no gradient";
    const auto analytic = x.grad().reshape(-1);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double saved = flat[e].item<double>();
      flat[e] = saved + eps;
      const double plus = (f(inputs) * G).sum().item<double>();
      flat[e] = saved - eps;
      const double minus = (f(inputs) * G).sum().item<double>();
      flat[e] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      EXPECT_NEAR(analytic[e].item<double>(), numeric, tol * std::max(1.0, std::abs(numeric)))
          << "input " << k << ", element " << e;
    }
  }
}

/// Largest |a - b| / max(|b|, 1) over all elements, in double.
inline double max_rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.detach().to(torch::kCPU, torch::kDouble);
  const auto y = b.detach().to(torch::kCPU, torch::kDouble);
  if (x.numel() == 0) return 0;
  return ((x - y).abs() / y.abs().clamp_min(1)).max().item<double>();
}

/// What `m.pretty_print` writes.
inline std::string printed(const torch::nn::Module& m) {
  std::ostringstream s;
  m.pretty_print(s);
  return s.str();
}

/// The keys of `m.named_parameters()` (the Python `state_dict` keys), in
/// registration order.
inline std::vector<std::string> parameter_names(const torch::nn::Module& m) {
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) names.push_back(p.key());
  return names;
}

/// The same keys as a set, for comparisons that ignore the order.
inline std::set<std::string> parameter_name_set(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& p : m.named_parameters()) names.insert(p.key());
  return names;
}

/// d2l::masked_softmax by one path, as a function of (X, valid_lens).
inline auto masked_softmax_by(d2l::AttentionBackend path) {
  return [path](const torch::Tensor& X, const torch::Tensor& valid_lens) {
    return d2l::masked_softmax(X, valid_lens, path);
  };
}

// The names of the autograd nodes behind `out` (every node visited once: two
// nodes may share a name, as two matrix products do).
inline std::set<std::string> graph_nodes(const torch::Tensor& out) {
  std::set<std::string> names;
  std::set<torch::autograd::Node*> seen;
  std::deque<torch::autograd::Node*> queue{out.grad_fn().get()};
  while (!queue.empty()) {
    auto* node = queue.front();
    queue.pop_front();
    if (node == nullptr || !seen.insert(node).second) continue;
    names.insert(node->name());
    for (const auto& edge : node->next_edges()) queue.push_back(edge.function.get());
  }
  return names;
}

// Whether a node's name (for our Functions, CppNode<d2l::detail::...::Name>)
// holds `part`.
inline bool has_node(const std::set<std::string>& names, const std::string& part) {
  for (const auto& name : names) {
    if (name.find(part) != std::string::npos) return true;
  }
  return false;
}

}  // namespace d2l::testing
