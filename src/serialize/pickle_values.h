#pragma once

// The values of the pickle machine (pickle.cpp) and the whitelisted globals it
// may push and call (pickle_globals.cpp).

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "serialize/pickle.h"

namespace d2l::serialize {

enum class Kind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kTuple,
  kList,
  kDict,
  kGlobal,
  kStorage,
  kTensor
};

const char* kind_name(Kind kind);

struct Value;

/// A dict's keys (str or int) by content, hashed once per key value: a key
/// referenced through the memo into many dicts is neither copied nor rehashed,
/// so memory and time stay proportional to the pickle's size.
struct KeyHash {
  size_t operator()(const Value* key) const;
};
struct KeyEqual {
  bool operator()(const Value* a, const Value* b) const;
};

/// One Python value. Containers point into the machine's arena; a dict keeps
/// its items flattened (key, value, key, value, ...) in insertion order.
struct Value {
  explicit Value(Kind k) : kind(k) {}
  Kind kind;
  int64_t i = 0;              // kInt, kBool
  double f = 0;               // kFloat
  std::string s;              // kString; kGlobal: "module.name"; kStorage: its key
  std::vector<Value*> items;  // kTuple, kList, kDict
  std::unordered_map<const Value*, size_t, KeyHash, KeyEqual> index;  // kDict: key -> position
  mutable size_t hash = 0;  // kString, kInt as a dict key: KeyHash's value, once computed
  mutable bool hashed = false;
  torch::Tensor tensor;  // kStorage (1-D), kTensor
};

/// Owns every value of one run.
class Arena {
 public:
  Value* make(Kind kind) {
    values_.push_back(std::make_unique<Value>(kind));
    return values_.back().get();
  }

 private:
  std::vector<std::unique_ptr<Value>> values_;
};

/// dict[key] = value, as Python does (a key already there keeps its place).
/// False when the key is neither a str nor an int.
bool dict_set(Value& dict, Value* key, Value* value);

/// The globals a pickle may name, and what calling them does.
class Globals {
 public:
  Globals(const Source& source, const StorageLoader& load) : source_(source), load_(load) {}

  /// The global `module`.`name`; an error naming it when it is not on the
  /// whitelist.
  Value* find(Arena& arena, const std::string& module, const std::string& name, uint64_t at);
  /// REDUCE: `callable(*args)`.
  Value* call(Arena& arena, const Value& callable, const std::vector<Value*>& args, uint64_t at);
  /// BINPERSID: the storage of a persistent id ('storage', torch.<Dtype>Storage,
  /// key, location, numel), loaded once per key.
  Value* persistent_load(Arena& arena, const Value& pid, uint64_t at);

 private:
  [[noreturn]] void fail(const std::string& what, uint64_t at) const;
  Value* rebuild_tensor(Arena& arena, const std::vector<Value*>& args, uint64_t at);

  const Source& source_;
  const StorageLoader& load_;
  std::unordered_map<std::string, Value*> storages_;
};

}  // namespace d2l::serialize
