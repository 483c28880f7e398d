#pragma once

// How d2l::generate chooses tokens from a step's scores (generate_tokens.cpp):
// a beam row's best candidates, and a sampled token.

#include <ATen/core/Generator.h>
#include <d2l/generate.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace d2l::detail {

/// The `count` largest of x[0:V] in `best`, largest first, ties by the
/// smaller index: what partial_sort of the indices gives, in one pass that
/// keeps the few best in order (a row's 2 · beam_size of 10,000 tokens),
/// without the index array that partial_sort reorders.
void best_tokens(const float* x, int64_t V, int64_t count, std::vector<int64_t>& best);

/// A token drawn from row `row` of a step: softmax(logits / temperature)
/// restricted to the options' top-k, then top-p, renormalised; `log_probs`
/// is log_softmax(logits) (the temperature-1 distribution).
int64_t sample_token(const torch::Tensor& logits, const torch::Tensor& log_probs, int64_t row,
                     const GenerationOptions& options, at::Generator& generator);

}  // namespace d2l::detail
