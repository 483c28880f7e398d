#pragma once

// What every attention op and module does with its weights after the
// softmax: dropout, and recording them in the module.
//
// Note [Recording attention weights]
// Modules keep the weights of their last forward call in a public tensor
// member, as the book does (`attention.attention_weights`). A module shared
// by threads (an inference server in eval mode) has many forward calls
// writing that member at once, and an unguarded write of a Tensor is a data
// race that corrupts the reference counts. record_weights stores under a
// lock chosen by the member's address from a fixed set, so no module holds
// a mutex of its own (nothing to copy in clone(), nothing in the public
// headers), and a module can record into a submodule's member. The member
// holds one call's weights afterwards; it is read only when no forward runs.

#include <torch/types.h>

namespace d2l::detail {

/// Dropout of attention weights; no dispatcher call when it is the identity.
torch::Tensor dropout_weights(const torch::Tensor& weights, double p, bool training);

/// `slot = weights`, safe against concurrent record_weights on the same slot.
void record_weights(torch::Tensor& slot, torch::Tensor weights);

}  // namespace d2l::detail
