#pragma once

// Weights trained in Python: the files that `torch.save(model.state_dict(),
// path)` writes (the zip format of PyTorch >= 1.6; tested with 1.13 and 2.11)
// loaded into our modules, whose named_parameters() and named_buffers() keys
// are the book's state_dict keys; and the same files written from C++ for
// Python's `torch.load` (README, "Loading weights trained in Python").
//
// The reader is our own and trusts nothing in the file: every failure is a
// c10::Error naming the function and the path, never a crash, and memory
// stays within a small multiple of the file's size.

#include <torch/nn/module.h>
#include <torch/types.h>

#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

namespace d2l {

/// Loads the state dict at `path` into `module`: each key (dotted, as Python
/// names it) is a parameter or buffer of `module` or its submodules, and each
/// value is copied in without recording gradients. Shapes and dtypes must
/// match the module's. With `strict`, the file's keys must also be exactly the
/// module's keys. Everything is checked before anything is assigned: on any
/// error (one c10::Error starting "d2l::load_state_dict: <path>: " that lists
/// every offending key) the module is unchanged.
void load_state_dict(torch::nn::Module& module, const std::string& path, bool strict = true);
/// As above, from a stream holding the file's bytes (named "<stream>").
void load_state_dict(torch::nn::Module& module, std::istream& in, bool strict = true);

/// Writes `module`'s parameters and buffers (recursive, dotted keys, in the
/// order of Python's state_dict()) as torch.save writes a state dict:
/// Python's `torch.load` (1.13, and 2.x with weights_only=True) returns an
/// OrderedDict of the same tensors. The same module gives the same bytes.
void save_state_dict(const torch::nn::Module& module, const std::string& path);
void save_state_dict(const torch::nn::Module& module, std::ostream& out);

/// The (key, tensor) items of a torch.save'd state dict, in file order. The
/// tensors are on the CPU and share storage where the file's do.
std::vector<std::pair<std::string, torch::Tensor>> read_state_dict(const std::string& path);
std::vector<std::pair<std::string, torch::Tensor>> read_state_dict(std::istream& in);

/// Writes `entries` as a torch.save'd OrderedDict; each tensor is written as a
/// contiguous CPU copy. Keys must be unique; dtypes are float32/64, float16,
/// bfloat16, int8/16/32/64, uint8 and bool.
void write_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& entries,
                      const std::string& path);
void write_state_dict(const std::vector<std::pair<std::string, torch::Tensor>>& entries,
                      std::ostream& out);

}  // namespace d2l
