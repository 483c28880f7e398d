#pragma once

// Weights packed once for the packed linear kernel (cpu/packed_linear_kernel.h),
// kept while the weights live and are unchanged (Note [Packed weights]).

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

// Note [Packed weights]
// detail::linear_into multiplies many rows by a large float weight matrix
// on the packed linear kernel (Note [Packed linear]), whose panels are W
// transposed and cut to the instruction set's width. The packed copy is
// made at the first such product and kept in a process-wide table keyed on
// the weight tensor, holding a weak reference to it (so the table neither
// keeps a model's weights alive nor mistakes another tensor at the same
// address for them). A copy is used while the weight has the version, data
// pointer and shape it was packed from, and while its bytes are those it
// was packed from: autograd's version counter misses edits made through
// `.data()` (Note [Caches keyed on weights]), so a copy checks the bytes'
// fingerprint again at its first use after recheck_packed_weights(), which
// each decoding (TransformerDecoder::init_state) and each encoder pass call
// (one d2l::generate call counts as one decoding, whatever its batches:
// PackedWeightsCheckedOnce).
// Within one decoding an edit through `.data()` is therefore not seen, as
// for the decoder's caches. Copies of weights that no longer exist are
// dropped at the next packing; release_packed_weights() drops them all.
// The copy costs the weight's size again in memory.

namespace d2l::detail {

struct PackedWeights {
  int64_t rows = 0;   // W's rows: the product's columns (N)
  int64_t cols = 0;   // W's columns (K)
  int64_t panel = 0;  // the kernel table's panel width it was packed for
  std::vector<float> data;
};

/// linear_into multiplies a weight of fewer elements than this on its
/// packed copy whatever the rows (a row's sums in one order in any batch,
/// from one row up); larger ones from cpu::kFewRows rows (fewer rows of a
/// large weight run at the speed memory delivers it on the few-rows kernel).
inline constexpr int64_t kPackedMinimumElements = int64_t{1} << 16;

/// W's packed copy, made now if there is none that matches W: W float,
/// 2-D, non-empty, contiguous, on the CPU, not an inference tensor (which
/// has no version counter). nullptr for other W.
/// With `check_bytes`, a copy compares its weight's bytes now whatever
/// recheck_packed_weights() said (for products made outside a decoding,
/// where a fingerprint costs little beside the product).
std::shared_ptr<const PackedWeights> packed_weights(const torch::Tensor& W,
                                                   bool check_bytes = false);

/// Has every packed copy check its weight's bytes again at its next use
/// (nothing while a PackedWeightsCheckedOnce lives on this thread).
void recheck_packed_weights();

/// Rechecks the packed copies now, then, while it lives, makes this thread's
/// recheck_packed_weights() do nothing: d2l::generate holds one, so that its
/// batches of sources, each a decoding with its own encoder pass and
/// init_state, read each weight's bytes once per call rather than once per
/// batch (240 MB a batch for a base-size Transformer). Nests.
class PackedWeightsCheckedOnce {
 public:
  PackedWeightsCheckedOnce();
  ~PackedWeightsCheckedOnce();
  PackedWeightsCheckedOnce(const PackedWeightsCheckedOnce&) = delete;
  PackedWeightsCheckedOnce& operator=(const PackedWeightsCheckedOnce&) = delete;
};

/// Drops every packed copy (a later product packs again).
void release_packed_weights();

/// Packed copies held now, for tests.
int64_t packed_weights_held();

}  // namespace d2l::detail
