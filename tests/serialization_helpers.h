#pragma once

// Helpers of the serialisation tests (test_serialization*.cpp): archives as
// bytes, snapshots of a module's tensors, and the library's modules built
// with chosen options.

#include <d2l/attention.h>

#include <map>
#include <sstream>
#include <string>

#include "test_utils.h"

namespace d2l::testing {

/// What torch::save writes for `module`.
template <typename Module>
std::string archive_bytes(const Module& module) {
  std::ostringstream out;
  torch::save(module, out);
  return out.str();
}

/// torch::load of `module` from archive bytes, through a stream.
template <typename Module>
void load_bytes(Module& module, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::load(module, in);
}

/// Every parameter and buffer of `module` (recursively), by dotted name, as
/// copies.
inline std::map<std::string, torch::Tensor> snapshot(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& p : module.named_parameters()) tensors[p.key()] = p.value().detach().clone();
  for (const auto& b : module.named_buffers()) tensors[b.key()] = b.value().detach().clone();
  return tensors;
}

/// Whether the two snapshots have the same names, dtypes, shapes and bits.
inline bool identical(const std::map<std::string, torch::Tensor>& a,
                      const std::map<std::string, torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto other = b.find(name);
    if (other == b.end() || t.scalar_type() != other->second.scalar_type() ||
        !torch::equal(t, other->second)) {
      return false;
    }
  }
  return true;
}

inline d2l::EncoderDecoder make_encoder_decoder(bool attention, const d2l::Seq2SeqOptions& o) {
  d2l::Seq2SeqEncoder encoder(o);
  if (attention) return d2l::EncoderDecoder(encoder, d2l::Seq2SeqAttentionDecoder(o));
  return d2l::EncoderDecoder(encoder, d2l::Seq2SeqDecoder(o));
}

}  // namespace d2l::testing
