// fuzz_attention's state-dict area: d2l::read_state_dict and
// d2l::load_state_dict on the rest of the input, taken as the bytes of a
// torch.save file (the seeds in fuzz/corpus, seed-state_dict-*, are real ones
// from tests/fixtures with the two selector bytes in front).
//
// The contract: the reader either throws c10::Error or returns tensors that
// are defined, on the CPU, and whose every element can be read; the load
// either throws c10::Error and leaves the module bit-identical, or succeeds
// with every tensor of the module's own shape and dtype.

#include <d2l/attention.h>
#include <d2l/state_dict.h>

#include <map>
#include <sstream>
#include <string>

#include "fuzz_common.h"

namespace d2l_fuzz {
namespace {

std::map<std::string, std::string> bits(const torch::nn::Module& m) {
  std::map<std::string, std::string> out;
  for (const auto& p : m.named_parameters()) {
    const auto c = p.value().detach().contiguous();
    out[p.key() + c10::toString(c.scalar_type()) + c10::str(c.sizes())] =
        std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
  }
  return out;
}

void check_read(const std::string& bytes) {
  std::istringstream in(bytes);
  for (const auto& [key, t] : d2l::read_state_dict(in)) {
    note(key, t);
    FUZZ_CHECK(t.defined() && t.device().is_cpu(), "read_state_dict returned a bad tensor");
    // Copies every element: a view past its storage is an ASan report.
    FUZZ_CHECK(t.clone().numel() == t.numel(), "a tensor lost elements");
  }
}

void check_load(const std::string& bytes, bool strict) {
  d2l::AdditiveAttention model(2, 20, 8, 0.0);
  const auto before = bits(*model);
  std::istringstream in(bytes);
  try {
    d2l::load_state_dict(*model, in, strict);
  } catch (const c10::Error&) {
    FUZZ_CHECK(bits(*model) == before, "a failed load_state_dict changed the module");
    throw;
  }
  const auto after = bits(*model);
  FUZZ_CHECK(after.size() == before.size(), "load_state_dict changed the module's tensors");
  for (auto a = after.begin(), b = before.begin(); a != after.end(); ++a, ++b) {
    FUZZ_CHECK(a->first == b->first, "load_state_dict changed a shape or dtype");
  }
}

}  // namespace

void fuzz_state_dict(Bytes& in) {
  const int64_t mode = in.below(3);
  const std::string bytes = in.rest();
  current.description = "state dict, mode " + std::to_string(mode);
  if (mode == 0) {
    check_read(bytes);
  } else {
    check_load(bytes, /*strict=*/mode == 1);
  }
}

}  // namespace d2l_fuzz
