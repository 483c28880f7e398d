// The pickle virtual machine that reads data.pkl. It knows the opcodes that
// torch.save emits (protocol 2) and the common protocol 3-5 ones, calls only
// whitelisted globals, and keeps every value in an arena owned by the
// machine: a pickle that builds cycles through the memo cannot leak, and
// nothing here recurses into values, so nesting depth costs no stack.

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>

#include "serialize/pickle.h"
#include "serialize/pickle_values.h"

namespace d2l::serialize {
namespace {

class Machine {
 public:
  Machine(std::string_view pkl, const StorageLoader& load, const Source& source)
      : in_(pkl), globals_(source, load), source_(source) {}

  Value* run() {
    while (true) {
      op_at_ = pos_;
      const auto code = static_cast<unsigned char>(take(1)[0]);
      if (code == '.') return pop();
      step(code);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    source_.fail(fmt::format("data.pkl: {} (opcode at offset {})", what, op_at_));
  }

  std::string_view take(uint64_t n) {
    if (n > in_.size() - pos_) {
      fail(fmt::format("truncated: needs {} bytes, {} left", n, in_.size() - pos_));
    }
    const auto s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t unsigned_le(int n) {
    const auto s = take(n);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
    return v;
  }
  std::string_view line() {
    const auto end = in_.find('\n', pos_);
    if (end == std::string_view::npos) fail("truncated: a GLOBAL name has no newline");
    const uint64_t n = end - pos_;
    return take(n + 1).substr(0, n);
  }

  Value* pop() {
    if (stack_.size() <= floor()) fail("pop from an empty stack");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.size() <= floor()) fail("the stack is empty");
    return stack_.back();
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  // The items since the last MARK, which is removed.
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                              stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void push(Value* v) { stack_.push_back(v); }
  void push_tuple(std::vector<Value*> items) {
    Value* t = arena_.make(Kind::kTuple);
    t->items = std::move(items);
    push(t);
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  Value* memo_get(uint64_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo key {} was never stored", index));
    return it->second;
  }
  std::string_view string_arg(int width) {
    const uint64_t n = unsigned_le(width);
    return take(n);
  }
  void push_int(int64_t v) {
    Value* i = arena_.make(Kind::kInt);
    i->i = v;
    push(i);
  }

  void set_items(Value* dict, const std::vector<Value*>& kv) {
    if (dict->kind != Kind::kDict) {
      fail(fmt::format("SETITEM(S) on a value of type {}, not a dict", kind_name(dict->kind)));
    }
    if (kv.size() % 2 != 0) fail("SETITEMS with an odd number of items");
    for (size_t i = 0; i < kv.size(); i += 2) {
      if (!dict_set(*dict, kv[i], kv[i + 1])) {
        fail(fmt::format("a dict key must be a str or an int, got {}", kind_name(kv[i]->kind)));
      }
    }
  }
  void append(Value* list, const std::vector<Value*>& items) {
    if (list->kind != Kind::kList) {
      fail(fmt::format("APPEND(S) on a value of type {}, not a list", kind_name(list->kind)));
    }
    list->items.insert(list->items.end(), items.begin(), items.end());
  }

  void step(unsigned char code);

  std::string_view in_;
  uint64_t pos_ = 0, op_at_ = 0;
  Arena arena_;
  Globals globals_;
  const Source& source_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
};

void Machine::step(unsigned char code) {
  switch (code) {
    case 0x80: take(1); return;  // PROTO
    case 0x95: take(8); return;  // FRAME: frames are only a read-ahead hint
    case 'c': {                  // GLOBAL
      const std::string module(line());
      push(globals_.find(arena_, module, std::string(line()), op_at_));
      return;
    }
    case 0x93: {  // STACK_GLOBAL
      Value* name = pop();
      Value* module = pop();
      if (module->kind != Kind::kString || name->kind != Kind::kString) {
        fail("STACK_GLOBAL needs two strs");
      }
      push(globals_.find(arena_, module->s, name->s, op_at_));
      return;
    }
    case '(': marks_.push_back(stack_.size()); return;  // MARK
    case '}': push(arena_.make(Kind::kDict)); return;   // EMPTY_DICT
    case ']': push(arena_.make(Kind::kList)); return;   // EMPTY_LIST
    case ')': push_tuple({}); return;                   // EMPTY_TUPLE
    case 't': push_tuple(pop_mark()); return;           // TUPLE
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1..3
      std::vector<Value*> items(code - 0x84);
      for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
      push_tuple(std::move(items));
      return;
    }
    case 'X':
    case 0x8c:
    case 0x8d: {  // BINUNICODE, SHORT_, 8
      Value* s = arena_.make(Kind::kString);
      s->s = std::string(string_arg(code == 'X' ? 4 : code == 0x8c ? 1 : 8));
      push(s);
      return;
    }
    case 'J': push_int(static_cast<int32_t>(unsigned_le(4))); return;  // BININT
    case 'K': push_int(static_cast<int64_t>(unsigned_le(1))); return;  // BININT1
    case 'M': push_int(static_cast<int64_t>(unsigned_le(2))); return;  // BININT2
    case 0x8a: {                                                       // LONG1
      const uint64_t n = unsigned_le(1);
      if (n > 8) fail(fmt::format("an integer of {} bytes does not fit in 64 bits", n));
      uint64_t v = n == 0 ? 0 : unsigned_le(static_cast<int>(n));
      if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
      push_int(static_cast<int64_t>(v));
      return;
    }
    case 'G': {  // BINFLOAT, big-endian
      uint64_t bits = 0;
      for (const char ch : take(8)) bits = (bits << 8) | static_cast<unsigned char>(ch);
      Value* f = arena_.make(Kind::kFloat);
      std::memcpy(&f->f, &bits, sizeof bits);
      push(f);
      return;
    }
    case 'N': push(arena_.make(Kind::kNone)); return;
    case 0x88:
    case 0x89: {  // NEWTRUE, NEWFALSE
      Value* b = arena_.make(Kind::kBool);
      b->i = code == 0x88;
      push(b);
      return;
    }
    case 'q': memo_put(unsigned_le(1)); return;        // BINPUT
    case 'r': memo_put(unsigned_le(4)); return;        // LONG_BINPUT
    case 0x94: memo_put(memo_.size()); return;         // MEMOIZE
    case 'h': push(memo_get(unsigned_le(1))); return;  // BINGET
    case 'j': push(memo_get(unsigned_le(4))); return;  // LONG_BINGET
    case 'R': {                                        // REDUCE
      Value* args = pop();
      Value* callable = pop();
      if (args->kind != Kind::kTuple) fail("REDUCE arguments are not a tuple");
      push(globals_.call(arena_, *callable, args->items, op_at_));
      return;
    }
    case 'b': {  // BUILD
      Value* state = pop();
      Value* obj = top();
      // torch.save's OrderedDict carries `_metadata` (module versions) as its
      // state; a state dict's values do not need it.
      if (obj->kind != Kind::kDict || (state->kind != Kind::kDict && state->kind != Kind::kNone)) {
        fail(fmt::format("BUILD of a value of type {} with state of type {} is not supported",
                         kind_name(obj->kind), kind_name(state->kind)));
      }
      return;
    }
    case 's': {  // SETITEM
      Value* value = pop();
      Value* key = pop();
      set_items(top(), {key, value});
      return;
    }
    case 'u': {
      auto kv = pop_mark();
      set_items(top(), kv);
      return;
    }  // SETITEMS
    case 'a': {
      Value* v = pop();
      append(top(), {v});
      return;
    }  // APPEND
    case 'e': {
      auto items = pop_mark();
      append(top(), items);
      return;
    }                                                                          // APPENDS
    case 'Q': push(globals_.persistent_load(arena_, *pop(), op_at_)); return;  // BINPERSID
    default: fail(fmt::format("unsupported opcode 0x{:02x}", code));
  }
}

}  // namespace

StateDict unpickle_state_dict(std::string_view pkl, const StorageLoader& load_storage,
                              const Source& source) {
  Machine machine(pkl, load_storage, source);
  const Value* top = machine.run();
  if (top->kind != Kind::kDict) {
    source.fail(
        fmt::format("data.pkl holds a value of type {}, not a dict of tensors (a state_dict)",
                    kind_name(top->kind)));
  }
  StateDict out;
  out.reserve(top->items.size() / 2);
  for (size_t i = 0; i < top->items.size(); i += 2) {
    const Value* key = top->items[i];
    const Value* value = top->items[i + 1];
    if (key->kind != Kind::kString) {
      source.fail(
          fmt::format("data.pkl: a state_dict key has type {}, not str", kind_name(key->kind)));
    }
    if (value->kind != Kind::kTensor) {
      source.fail(fmt::format("data.pkl: the value of '{}' has type {}, not tensor", key->s,
                              kind_name(value->kind)));
    }
    out.emplace_back(key->s, value->tensor);
  }
  return out;
}

}  // namespace d2l::serialize
