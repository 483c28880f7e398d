#pragma once

// What the fused passes of the 0.17 Transformer share (fused_step.cpp: the
// decoder's step; fused_encoder.cpp: the encoder; Note [The fused decoder
// step]): the checks that the modules let a pass stand in for them, and the
// pieces of a block on the pass's own arrays.

#include <d2l/transformer.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "attention_weights.h"
#include "cpu/multi_head_attention_kernel.h"

namespace d2l::detail::fused {

/// Why the modules of a pass (the blocks' attention, add & norm and FFN,
/// in `blocks`) may not be run by it: training mode, a backend other than
/// kAuto and kFused, sizes other than num_hiddens, parameters not contiguous
/// in `type` on the CPU. Empty when they may.
std::string why_not_modules(const TransformerBlockOptions& o,
                            const std::vector<const torch::nn::Module*>& training_modules,
                            const std::vector<const MultiHeadAttentionImpl*>& attentions,
                            const std::vector<torch::Tensor>& parameters, c10::ScalarType type,
                            int64_t block);

/// The parameters of an attention's projections, an add & norm's layer norm
/// and an FFN, appended to `out`.
void append_parameters(const MultiHeadAttentionImpl& m, std::vector<torch::Tensor>& out);
void append_parameters(const AddNormImpl& a, std::vector<torch::Tensor>& out);
void append_parameters(const PositionWiseFFNImpl& f, std::vector<torch::Tensor>& out);

/// Whether a dropout module draws: in training mode.
inline bool draws(const torch::nn::Dropout& dropout) { return dropout->is_training(); }

/// Σ_j f(x[j]) in double, in four chains (j mod 4) added at the end.
template <typename T, typename F>
double four_chains(const T* x, int64_t h, const F& f) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t j = 0;
  for (; j + 4 <= h; j += 4) {
    s0 += f(static_cast<double>(x[j]));
    s1 += f(static_cast<double>(x[j + 1]));
    s2 += f(static_cast<double>(x[j + 2]));
    s3 += f(static_cast<double>(x[j + 3]));
  }
  if (j < h) s0 += f(static_cast<double>(x[j]));
  if (j + 1 < h) s1 += f(static_cast<double>(x[j + 1]));
  if (j + 2 < h) s2 += f(static_cast<double>(x[j + 2]));
  return (s0 + s1) + (s2 + s3);
}

/// out = layer_norm(a + b) over rows of h features (AddNorm in evaluation:
/// ln(dropout(Y) + X)), the moments in double, each summed in four chains
/// (j mod 4) added at the end: one chain of h additions was a twentieth of a
/// decoding step at the book's size, waiting on each addition's latency.
template <typename T>
void add_layer_norm(const AddNorm& addnorm, const T* a, const T* b, int64_t rows, int64_t h,
                    T* out) {
  const auto& ln = addnorm->ln;
  const T* gamma = ln->weight.data_ptr<T>();
  const T* beta = ln->bias.data_ptr<T>();
  const double eps = ln->options.eps();
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + r * h;
    for (int64_t j = 0; j < h; ++j) o[j] = a[r * h + j] + b[r * h + j];
    const double mean = four_chains(o, h, [](double x) { return x; }) / static_cast<double>(h);
    const double squares = four_chains(o, h, [mean](double x) { return (x - mean) * (x - mean); });
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(h) + eps);
    for (int64_t j = 0; j < h; ++j) {
      o[j] = static_cast<T>((o[j] - mean) * rstd) * gamma[j] + beta[j];
    }
  }
}

/// x[r] = embedding[ids[r]] · sqrt(h) + P[position of r] for B rows of n
/// tokens, positions 0..n-1 (as PositionalEncoding in evaluation).
template <typename T>
void embed(const TransformerOptions& o, const torch::nn::Embedding& embedding,
           const PositionalEncoding& positions, const int64_t* ids, int64_t B, int64_t n, T* x) {
  const int64_t h = o.block().num_hiddens();
  const T* E = embedding->weight.data_ptr<T>();
  const float* P = positions->P.data_ptr<float>();
  const auto scale = static_cast<T>(std::sqrt(static_cast<double>(h)));
  for (int64_t r = 0; r < B * n; ++r) {
    const float* p = P + (r % n) * h;
    const T* e = E + ids[r] * h;
    for (int64_t j = 0; j < h; ++j) x[r * h + j] = e[j] * scale + static_cast<T>(p[j]);
  }
}

template <typename T>
void relu(T* x, int64_t count) {
  for (int64_t k = 0; k < count; ++k) x[k] = std::max(x[k], T(0));
}

/// The small-heads kernel (as m's own small-heads path runs it) on arrays
/// of the caller's: queries q (B, n, h), keys and values k and v (B,
/// capacity, h) with the heads side by side, each row of entry b over its
/// first lens[b] keys (lens nullptr: all of them); the weights (B · heads, n,
/// capacity) into `weights`, the heads joined into `joined` (B, n, h).
template <typename T>
void heads(int64_t num_heads, const T* q, const T* k, const T* v, const int64_t* lens, int64_t B,
           int64_t n, int64_t capacity, int64_t h, T* weights, T* joined) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(h / num_heads));
  const auto& kernels = cpu::multi_head_attention_kernels();
  if constexpr (std::is_same_v<T, float>) {
    kernels.forward_float(q, k, v, lens, B, n, capacity, h, num_heads, scale, weights, joined);
  } else {
    kernels.forward_double(q, k, v, lens, B, n, capacity, h, num_heads, scale, weights, joined);
  }
}

/// Where m's heads write their weights, (B · heads, n, capacity): a tensor
/// that record() stores in m where m records them on this thread, else
/// scratch of the caller's.
template <typename T>
struct HeadWeights {
  torch::Tensor tensor;
  std::vector<T> scratch;
  T* data = nullptr;

  HeadWeights(const MultiHeadAttentionImpl& m, int64_t B, int64_t n, int64_t capacity,
              const torch::TensorOptions& options) {
    const int64_t size = B * m.options.num_heads() * n * capacity;
    if (records_weights(m.attention->options.record_attention_weights())) {
      tensor = torch::empty({B * m.options.num_heads(), n, capacity}, options);
      data = tensor.data_ptr<T>();
    } else {
      scratch.resize(static_cast<size_t>(size));
      data = scratch.data();
    }
  }

  /// Records the weights over the first `held` keys in m, where it records.
  void record(MultiHeadAttentionImpl& m, int64_t held) {
    if (!tensor.defined()) return;
    // narrow's view in one ATen call (rather than narrow's, slice's and
    // as_strided's).
    record_weights(
        m.attention->attention_weights,
        held == tensor.size(2)
            ? tensor
            : tensor.as_strided({tensor.size(0), tensor.size(1), held}, tensor.strides()));
  }
};

}  // namespace d2l::detail::fused
