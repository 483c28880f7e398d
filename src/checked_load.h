#pragma once

// The one implementation behind every module's `load` override: LibTorch's
// Module::load, which `set_`s each tensor to whatever the archive holds, with
// every parameter and buffer checked first (docs/reliability.md, "Loading
// archives").

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

namespace d2l::detail {

/// The archive key under which MultiHeadAttention::save writes num_heads.
inline constexpr const char* kNumHeadsKey = "num_heads";

/// Loads `module` (and its submodules, recursively) from `archive` as
/// torch::nn::Module::load does, after checking the whole tree: every
/// parameter and buffer must be in the archive with the module's shape, dtype
/// and layout, every submodule must be there, and the archive must hold
/// nothing the module lacks; a multi-head attention module anywhere in the
/// tree must have the num_heads its archive was saved with (where the archive
/// records it). On a mismatch, throws c10::Error starting with
/// `fn` (e.g. "d2l::MultiHeadAttention::load") and naming the dotted key and
/// both shapes; the module is then unchanged.
void checked_load(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                  const char* fn);

}  // namespace d2l::detail
