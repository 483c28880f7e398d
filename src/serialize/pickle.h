#pragma once

// The pickle side of torch.save's format: a small virtual machine that runs
// data.pkl with a whitelist of globals, and the protocol-2 writer of a state
// dict (README, "Loading weights trained in Python").

#include <torch/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serialize/zip.h"

namespace d2l::serialize {

using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

/// The storage stored under `key`: a 1-D CPU tensor of `dtype` with `numel`
/// elements (throws through Source::fail when there is no such record or it
/// is too small). Called once per key.
using StorageLoader =
    std::function<torch::Tensor(const std::string& key, c10::ScalarType dtype, int64_t numel)>;

/// Runs the pickle `pkl` (a dict of str -> tensor, as torch.save writes a
/// state_dict) and returns its items in order. Anything else, an opcode
/// outside the supported set or a global off the whitelist, is an error
/// through `source`.
StateDict unpickle_state_dict(std::string_view pkl, const StorageLoader& load_storage,
                              const Source& source);

/// The protocol-2 pickle torch.save writes for an OrderedDict of tensors:
/// tensor i is `_rebuild_tensor_v2` of storage key "i" (contiguous, offset 0).
std::string pickle_state_dict(const StateDict& entries);

/// "Float" for kFloat (torch.FloatStorage), ...; nullptr for a dtype that has
/// no storage class.
const char* storage_class(c10::ScalarType dtype);

}  // namespace d2l::serialize
