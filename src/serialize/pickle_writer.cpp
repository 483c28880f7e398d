// The writer of a state dict as torch.save (protocol 2) writes it, with the
// opcodes that Python's unpickler and torch.load(weights_only=True) accept.

#include <c10/util/strides.h>
#include <fmt/format.h>

#include "serialize/pickle.h"

namespace d2l::serialize {
namespace {

class PickleWriter {
 public:
  void op(char code) { out_.push_back(code); }
  void global(const char* module, const char* name) {
    out_ += fmt::format("c{}\n{}\n", module, name);
  }
  void string(const std::string& s) {
    op('X');
    le(s.size(), 4);
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      op('M');
      le(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      le(static_cast<uint64_t>(v), 4);
    } else {
      op('\x8a');  // LONG1, 8 bytes of two's complement
      le(8, 1);
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void tuple(c10::IntArrayRef values) {
    op('(');
    for (const int64_t v : values) integer(v);
    op('t');
  }
  std::string take() { return std::move(out_); }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

}  // namespace

const char* storage_class(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return "Float";
    case c10::kDouble: return "Double";
    case c10::kHalf: return "Half";
    case c10::kBFloat16: return "BFloat16";
    case c10::kLong: return "Long";
    case c10::kInt: return "Int";
    case c10::kShort: return "Short";
    case c10::kChar: return "Char";
    case c10::kByte: return "Byte";
    case c10::kBool: return "Bool";
    default: return nullptr;
  }
}

std::string pickle_state_dict(const StateDict& entries) {
  PickleWriter w;
  w.op('\x80');  // PROTO 2
  w.op('\x02');
  w.global("collections", "OrderedDict");
  w.op(')');
  w.op('R');
  w.op('(');
  for (size_t i = 0; i < entries.size(); ++i) {
    const torch::Tensor& t = entries[i].second;
    w.string(entries[i].first);
    w.global("torch._utils", "_rebuild_tensor_v2");
    w.op('(');
    // The persistent id ('storage', torch.<Dtype>Storage, key, location, numel).
    w.op('(');
    w.string("storage");
    w.global("torch", fmt::format("{}Storage", storage_class(t.scalar_type())).c_str());
    w.string(std::to_string(i));
    w.string("cpu");
    w.integer(t.numel());
    w.op('t');
    w.op('Q');
    w.integer(0);
    w.tuple(t.sizes());
    w.tuple(c10::contiguous_strides(t.sizes()));
    w.op('\x89');  // requires_grad=False, as state_dict() detaches
    w.global("collections", "OrderedDict");
    w.op(')');
    w.op('R');
    w.op('t');
    w.op('R');
  }
  w.op('u');
  w.op('.');
  return w.take();
}

}  // namespace d2l::serialize
