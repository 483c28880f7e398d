#pragma once

// The choice of path (src/select.h) called as the ops call it, for the
// decision-table tests: the parameter struct filled from the arguments that
// decide, the reasons appended to `reasons` when given.

#include <torch/types.h>

#include <string>
#include <vector>

#include "select.h"

namespace d2l::testing {

inline d2l::detail::DotProductPath select_dot(const char* fn, AttentionBackend backend,
                                              const torch::Tensor& queries,
                                              const torch::Tensor& keys, double dropout,
                                              bool training, bool need_weights,
                                              std::vector<std::string>* reasons = nullptr) {
  d2l::detail::DotProductParams params;
  params.queries = queries;
  params.keys = keys;
  params.values = keys;
  params.backend = backend;
  params.dropout = dropout;
  params.training = training;
  params.need_weights = need_weights;
  auto selection = d2l::detail::select_dot_product(fn, params, reasons != nullptr);
  if (reasons != nullptr) {
    reasons->insert(reasons->end(), selection.reasons.begin(), selection.reasons.end());
  }
  return selection.path;
}

inline d2l::detail::AdditivePath select_additive(const char* fn, AttentionBackend backend,
                                                 const torch::Tensor& queries, double dropout,
                                                 bool training, d2l::detail::AdditiveStage stage,
                                                 std::vector<std::string>* reasons = nullptr) {
  d2l::detail::AdditiveParams params;
  params.queries = queries;
  params.stage = stage;
  params.backend = backend;
  params.dropout = dropout;
  params.training = training;
  auto selection = d2l::detail::select_additive(fn, params, reasons != nullptr);
  if (reasons != nullptr) {
    reasons->insert(reasons->end(), selection.reasons.begin(), selection.reasons.end());
  }
  return selection.path;
}

}  // namespace d2l::testing
