#pragma once

// What every fuzzed area of fuzz_attention shares: the call under test and the
// report of a finding, the reader of the input bytes, the makers of values,
// layouts, lengths and (queries, keys, values), and the checks of weights and
// gradients. Definitions in fuzz_common.cpp; fuzz_attention.cpp describes the
// contract and the input format.

#include <torch/torch.h>

#include <d2l/backend.h>

#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace d2l_fuzz {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The call under test and its arguments, printed with a finding.
struct Call {
  std::string description;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
};
extern Call current;

inline void note(const std::string& name, const torch::Tensor& t) {
  current.tensors.emplace_back(name, t);
}

[[noreturn]] void finding(const char* what, const std::string& detail = "");

#define FUZZ_CHECK(cond, what)                 \
  do {                                         \
    if (!(cond)) finding(what, "(" #cond ")"); \
  } while (false)

class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t below(int64_t n) { return byte() % n; }
  bool flag() { return (byte() & 1) != 0; }
  int64_t u16() {
    const int64_t lo = byte();
    return lo | (int64_t{byte()} << 8);
  }
  // Every byte not read yet; afterwards the input is exhausted.
  std::string rest() {
    std::string out(reinterpret_cast<const char*>(data_ + pos_), size_ - pos_);
    pos_ = size_;
    return out;
  }
  template <typename T>
  T pick(const std::vector<T>& options) {
    return options[static_cast<size_t>(below(static_cast<int64_t>(options.size())))];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

inline const std::vector<torch::Dtype> kDataDtypes = {
    torch::kFloat,    torch::kFloat, torch::kDouble, torch::kHalf,
    torch::kBFloat16, torch::kLong,  torch::kInt,    torch::kBool};
inline const std::vector<double> kDropouts = {0.0, 0.0, 0.1, 0.5, 0.9, 1.0, -0.1, 1.5, kNaN};
inline const std::vector<d2l::AttentionBackend> kPaths = {
    d2l::AttentionBackend::kAuto, d2l::AttentionBackend::kComposite, d2l::AttentionBackend::kFused};

bool floating(const torch::Tensor& t);

// Finite, and small enough (|x| <= 4) that no sum of products of a few of
// them overflows even float16: the inputs for which results must be finite.
bool tame(const torch::Tensor& t);

bool all_finite(const torch::Tensor& t);

std::vector<int64_t> dims(Bytes& in, int64_t rank);

struct Arg {
  torch::Tensor leaf;   // owns the storage; gets the gradient
  torch::Tensor value;  // what the library sees: a view of leaf
};

// Values of `shape` and `dtype` (make_values: normal, with a few special
// ones) behind one of several memory layouts (lay_out); see fuzz_common.cpp.
Arg make_arg(Bytes& in, torch::IntArrayRef shape, torch::Dtype dtype, bool requires_grad);

// Lengths for (B, n, m) scores: undefined, (B), (B, n), a wrong shape, or a
// strided (B, n); any dtype.
torch::Tensor make_lengths(Bytes& in, int64_t B, int64_t n, int64_t m);

// Valid positions of (B, n, m) scores for lengths that the library accepted.
torch::Tensor valid_mask(const torch::Tensor& lens, int64_t B, int64_t n, int64_t m);

double sum_tolerance(torch::Dtype dtype);

// Attention weights (B, n, m): exactly 0 where masked; finite with rows
// summing to 1 (or 0 without a valid key) when `finite_expected`.
void check_weights(const torch::Tensor& w, const torch::Tensor& valid, bool finite_expected);

// Runs backward through `out` with a tame upstream gradient and checks that
// every leaf's gradient is finite when `finite_expected`.
void check_backward(const torch::Tensor& out, const std::vector<torch::Tensor>& leaves,
                    bool finite_expected, Bytes& in);

enum class GradMode { kEnabled, kNoGrad, kInference };

// Grad mode for the call under test (backward runs outside it).
struct GradModeScope {
  explicit GradModeScope(GradMode mode) {
    if (mode == GradMode::kNoGrad) no_grad.emplace();
    if (mode == GradMode::kInference) inference.emplace();
  }
  std::optional<torch::NoGradGuard> no_grad;
  std::optional<c10::InferenceMode> inference;
};

GradMode pick_grad_mode(Bytes& in);

struct QKVArgs {
  Arg queries, keys, values;
  torch::Tensor lens;
  bool tame_inputs;
};

// Queries (B, n, dq), keys (B, m, dk), values (B, m, dv): mostly consistent,
// sometimes with one dimension, rank or dtype wrong.
QKVArgs make_qkv(Bytes& in, bool same_feature_size);

// What every attention module promises, for `attention` (configured with
// `options`, mode already set) on `a` under a random grad mode: weights kept
// only when asked and masked, a finite output for tame inputs, and a clean
// backward to `leaves` and the inputs.
template <typename Holder, typename Options>
void check_attention_module(Bytes& in, Holder& attention, const Options& options, const QKVArgs& a,
                            std::vector<torch::Tensor> leaves) {
  const auto grad_mode = pick_grad_mode(in);
  std::ostringstream description;
  description << *attention << " path=" << static_cast<int>(options.backend())
              << " record=" << options.record_attention_weights()
              << " training=" << attention->is_training()
              << " grad_mode=" << static_cast<int>(grad_mode);
  current.description = description.str();
  for (const auto& p : attention->named_parameters()) note(p.key(), p.value());
  torch::Tensor out;
  {
    GradModeScope scope(grad_mode);
    out = attention(a.queries.value, a.keys.value, a.values.value, a.lens);
  }
  note("out", out);
  note("attention_weights", attention->attention_weights);
  const int64_t B = a.queries.value.size(0), n = a.queries.value.size(1), m = a.keys.value.size(1);
  if (options.record_attention_weights()) {
    check_weights(attention->attention_weights, valid_mask(a.lens, B, n, m), a.tame_inputs);
  } else {
    FUZZ_CHECK(!attention->attention_weights.defined(), "weights recorded while turned off");
  }
  if (a.tame_inputs) FUZZ_CHECK(all_finite(out), "output not finite for finite inputs");
  leaves.insert(leaves.end(), {a.queries.leaf, a.keys.leaf, a.values.leaf});
  check_backward(out, leaves, a.tame_inputs, in);
}

// The fuzzed areas, one per value of the input's first byte (fuzz_attention.cpp).
void fuzz_sequence_mask(Bytes& in);           // fuzz_masking.cpp
void fuzz_masked_softmax(Bytes& in);          // fuzz_masking.cpp
void fuzz_dot_product_functional(Bytes& in);  // fuzz_dot_product.cpp
void fuzz_dot_product_module(Bytes& in);      // fuzz_dot_product.cpp
void fuzz_additive_scores(Bytes& in);         // fuzz_additive.cpp
void fuzz_additive_module(Bytes& in);         // fuzz_additive.cpp
void fuzz_heatmaps(Bytes& in);                // fuzz_heatmap.cpp
void fuzz_multi_head(Bytes& in);              // fuzz_modules.cpp
void fuzz_nadaraya_watson(Bytes& in);         // fuzz_modules.cpp
void fuzz_seq2seq(Bytes& in);                 // fuzz_seq2seq.cpp
void fuzz_encoder_decoder(Bytes& in);         // fuzz_seq2seq.cpp
void fuzz_loading(Bytes& in);                 // fuzz_loading.cpp
void fuzz_state_dict(Bytes& in);              // fuzz_state_dict.cpp
void fuzz_nmt_data(Bytes& in);                // fuzz_nmt_data.cpp

}  // namespace d2l_fuzz
