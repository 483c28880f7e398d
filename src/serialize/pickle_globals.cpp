// The whitelist of globals a state dict's pickle may name, and the checked
// rebuilding of tensors from storages: offset, sizes and strides are checked
// against the storage before any view is made.

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

#include "serialize/pickle_values.h"

namespace d2l::serialize {
namespace {

const std::map<std::string, c10::ScalarType>& storage_dtypes() {
  static const std::map<std::string, c10::ScalarType> m = [] {
    std::map<std::string, c10::ScalarType> out;
    for (const auto t : {c10::kFloat, c10::kDouble, c10::kHalf, c10::kBFloat16, c10::kLong,
                         c10::kInt, c10::kShort, c10::kChar, c10::kByte, c10::kBool}) {
      out.emplace(fmt::format("torch.{}Storage", storage_class(t)), t);
    }
    out.emplace("torch.storage.UntypedStorage", c10::kByte);
    out.emplace("torch.UntypedStorage", c10::kByte);
    return out;
  }();
  return m;
}

bool is_dtype_object(const std::string& module, const std::string& name) {
  static const char* const kNames[] = {"float32",  "float", "float64", "double", "float16", "half",
                                       "bfloat16", "int64", "long",    "int32",  "int",     "int16",
                                       "short",    "int8",  "uint8",   "bool"};
  if (module != "torch") return false;
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

std::string shape(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }

bool as_int(const Value* v, int64_t& out) {
  if (v->kind != Kind::kInt) return false;
  out = v->i;
  return true;
}

}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kTuple: return "tuple";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kGlobal: return "global";
    case Kind::kStorage: return "storage";
    case Kind::kTensor: return "tensor";
  }
  return "value";
}

size_t KeyHash::operator()(const Value* key) const {
  if (!key->hashed) {
    key->hash = key->kind == Kind::kInt ? std::hash<int64_t>{}(key->i)
                                        : std::hash<std::string>{}(key->s) ^ 0x9e3779b97f4a7c15u;
    key->hashed = true;
  }
  return key->hash;
}

bool KeyEqual::operator()(const Value* a, const Value* b) const {
  if (a == b) return true;
  if (a->kind != b->kind) return false;
  return a->kind == Kind::kInt ? a->i == b->i : a->s == b->s;
}

bool dict_set(Value& dict, Value* key, Value* value) {
  if (key->kind != Kind::kString && key->kind != Kind::kInt) return false;
  const auto [it, inserted] = dict.index.emplace(key, dict.items.size());
  if (inserted) {
    dict.items.push_back(key);
    dict.items.push_back(value);
  } else {
    dict.items[it->second + 1] = value;
  }
  return true;
}

void Globals::fail(const std::string& what, uint64_t at) const {
  source_.fail(fmt::format("data.pkl: {} (opcode at offset {})", what, at));
}

Value* Globals::find(Arena& arena, const std::string& module, const std::string& name,
                     uint64_t at) {
  const std::string full = module + "." + name;
  const bool known = full == "collections.OrderedDict" ||
                     full == "torch._utils._rebuild_tensor_v2" ||
                     full == "torch._utils._rebuild_parameter" ||
                     storage_dtypes().count(full) != 0 || is_dtype_object(module, name);
  if (!known) {
    fail(fmt::format("global '{}' is not allowed (a state_dict of tensors needs only "
                     "collections.OrderedDict, torch._utils._rebuild_tensor_v2, "
                     "torch._utils._rebuild_parameter, torch.<Dtype>Storage and torch dtypes)",
                     full),
         at);
  }
  Value* g = arena.make(Kind::kGlobal);
  g->s = full;
  return g;
}

Value* Globals::call(Arena& arena, const Value& callable, const std::vector<Value*>& args,
                     uint64_t at) {
  if (callable.kind != Kind::kGlobal) {
    fail(fmt::format("REDUCE calls a value of type {}", kind_name(callable.kind)), at);
  }
  if (callable.s == "collections.OrderedDict") {
    if (!args.empty()) fail("collections.OrderedDict called with arguments", at);
    return arena.make(Kind::kDict);
  }
  if (callable.s == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(arena, args, at);
  if (callable.s == "torch._utils._rebuild_parameter") {
    if (args.size() != 3 || args[0]->kind != Kind::kTensor) {
      fail("torch._utils._rebuild_parameter needs (tensor, requires_grad, hooks)", at);
    }
    return args[0];
  }
  fail(fmt::format("'{}' cannot be called", callable.s), at);
}

Value* Globals::persistent_load(Arena& arena, const Value& pid, uint64_t at) {
  const auto& items = pid.items;
  int64_t numel = 0;
  if (pid.kind != Kind::kTuple || items.size() != 5 || items[0]->kind != Kind::kString ||
      items[0]->s != "storage" || items[1]->kind != Kind::kGlobal ||
      items[2]->kind != Kind::kString || !as_int(items[4], numel)) {
    fail("a persistent id is not ('storage', torch.<Dtype>Storage, key, location, numel)", at);
  }
  const auto dtype = storage_dtypes().find(items[1]->s);
  if (dtype == storage_dtypes().end()) {
    fail(fmt::format("'{}' is not a storage class", items[1]->s), at);
  }
  if (numel < 0) fail(fmt::format("storage '{}' has a negative size {}", items[2]->s, numel), at);
  // Looked up before inserting: a pid named again through the memo must not
  // copy its key each time.
  auto it = storages_.find(items[2]->s);
  if (it == storages_.end()) {
    Value* storage = arena.make(Kind::kStorage);
    storage->s = items[2]->s;
    storage->tensor = load_(items[2]->s, dtype->second, numel);
    it = storages_.emplace(items[2]->s, storage).first;
  } else if (it->second->tensor.scalar_type() != dtype->second ||
             it->second->tensor.numel() != numel) {
    fail(fmt::format("storage '{}' is named twice with different types or sizes", items[2]->s), at);
  }
  return it->second;
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
// backward_hooks[, metadata]).
Value* Globals::rebuild_tensor(Arena& arena, const std::vector<Value*>& args, uint64_t at) {
  if (args.size() != 6 && args.size() != 7) {
    fail(fmt::format("torch._utils._rebuild_tensor_v2 takes 6 or 7 arguments, got {}", args.size()),
         at);
  }
  int64_t offset = 0;
  if (args[0]->kind != Kind::kStorage || !as_int(args[1], offset) ||
      args[2]->kind != Kind::kTuple || args[3]->kind != Kind::kTuple) {
    fail("torch._utils._rebuild_tensor_v2 needs (storage, int, tuple, tuple, ...)", at);
  }
  const torch::Tensor& storage = args[0]->tensor;
  const auto& size_items = args[2]->items;
  const auto& stride_items = args[3]->items;
  if (size_items.size() != stride_items.size()) {
    fail(
        fmt::format("a tensor has {} sizes and {} strides", size_items.size(), stride_items.size()),
        at);
  }
  std::vector<int64_t> sizes(size_items.size()), strides(size_items.size());
  bool empty = false;
  // The last element's index, offset + sum((size - 1) * stride), must lie in
  // the storage; every step is checked against the storage's numel, so
  // nothing overflows.
  const int64_t limit = storage.numel();
  if (offset < 0 || offset > limit) {
    fail(fmt::format("storage offset {} is outside storage '{}' of {} elements", offset, args[0]->s,
                     limit),
         at);
  }
  int64_t last = offset;
  for (const auto d : c10::irange(sizes.size())) {
    if (!as_int(size_items[d], sizes[d]) || !as_int(stride_items[d], strides[d]) || sizes[d] < 0 ||
        strides[d] < 0) {
      fail("tensor sizes and strides must be non-negative ints", at);
    }
    empty = empty || sizes[d] == 0;
  }
  for (const auto d : c10::irange(sizes.size())) {
    if (empty || sizes[d] == 0 || strides[d] == 0) continue;
    if ((sizes[d] - 1) > (limit - last) / strides[d]) {
      fail(fmt::format("a tensor of size {} and stride {} at offset {} does not fit in storage "
                       "'{}' of {} elements",
                       shape(sizes), shape(strides), offset, args[0]->s, limit),
           at);
    }
    last += (sizes[d] - 1) * strides[d];
  }
  if (!empty && last >= limit) {
    fail(fmt::format("a tensor of size {} and stride {} at offset {} does not fit in storage '{}' "
                     "of {} elements",
                     shape(sizes), shape(strides), offset, args[0]->s, limit),
         at);
  }
  Value* t = arena.make(Kind::kTensor);
  t->tensor = storage.as_strided(sizes, strides, offset);
  return t;
}

}  // namespace d2l::serialize
