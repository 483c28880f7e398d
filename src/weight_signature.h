#pragma once

// What a cache computed from parameters (MultiHeadAttentionCache's projected
// keys and values, the Bahdanau decoder's projected keys) records of them,
// to tell later whether they are still the parameters it was computed from
// (Note [Caches keyed on weights]).

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

// Note [Caches keyed on weights]
// A cache of projections is right only while the projections' parameters
// hold the values it was computed with. Autograd's version counter sees
// every in-place change made through the parameter or its views (an
// optimizer step, a load, copy_ under NoGradGuard), and Module::to swaps the
// data (another pointer, dtype or device); but `.data()` is a tensor with a
// version counter of its own, so `W_k->weight.data().copy_(w)` (the usual
// C++ idiom for loading or editing weights) changes the values and nothing
// else. A signature therefore holds, for each parameter, the tensor, its
// version, data pointer, dtype, device and shape, and on the CPU a 64-bit
// fingerprint of its bytes, taken again at each check: reading the weights
// once more, at memory speed. On CUDA the fingerprint would cost a
// synchronisation per step: there the signature holds the rest only, and an
// edit through `.data()` is the caller's to announce (clear() the cache).
//
// The decoders' own caches (TransformerDecoder's per block, the Bahdanau
// decoder's projected keys), made by init_state or the first step of a
// decoding and advanced step by step, check everything but the bytes
// (MultiHeadAttentionCache::set_check_weight_bytes(false), which a user's
// own decoding loop may call too): the
// fingerprint of a decoder's W_k and W_v costs 0.5 % of a step at the book's
// sizes but 4 % at 256 hidden units and 8.5 % at 512 (6 blocks, batch 1, one
// core of a Zen 3: docs/reliability.md, "Caches keyed on weights"). An edit
// through `.data()` in the middle of one decoding is therefore not seen
// there; every other change is, and a new init_state starts afresh.

namespace d2l::detail {

/// A fingerprint of the bytes of `t` (a CPU tensor; made contiguous first if
/// it is not): equal for equal bytes, and different, but for a 2^-64
/// chance, for any change of them, their order included.
uint64_t fingerprint(const torch::Tensor& t);

class WeightSignature {
 public:
  WeightSignature() = default;
  /// The parameters as they are now; their bytes' fingerprints too unless
  /// `bytes` is false (a signature only ever matched with `values` false).
  explicit WeightSignature(const std::vector<torch::Tensor>& params, bool bytes = true);

  enum class Match {
    kSame,     // the same tensors, unchanged
    kOther,    // other tensors (another module's), or another number of them
    kChanged,  // the same tensors, changed since (values, dtype, device, shape)
  };
  /// `params` against the ones recorded; their bytes too where `values`
  /// (and the parameter is on the CPU; the signature must hold the bytes).
  Match match(const std::vector<torch::Tensor>& params, bool values = true) const;

 private:
  struct Entry {
    torch::Tensor tensor;
    int64_t version = 0;
    const void* data = nullptr;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    std::vector<int64_t> sizes;
    uint64_t fingerprint = 0;  // 0 off the CPU
  };
  static Entry entry_of(const torch::Tensor& t, bool bytes);
  std::vector<Entry> entries_;
  bool bytes_ = true;
};

}  // namespace d2l::detail
