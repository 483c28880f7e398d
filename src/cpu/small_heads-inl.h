#pragma once

// The small-heads kernel's tasks (multi_head_attention_kernel.cpp, Note
// [Small heads]; included inside each instruction set's CPU_CAPABILITY
// namespace, as every -inl.h here): one head of one batch entry, its sizes,
// its rows' valid keys, and the split of the tasks over threads.

#include <ATen/core/TensorBase.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/parallel_runs-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

struct HeadDims {
  int64_t batch, n, m, h, heads, d;
};

HeadDims head_dims(const at::TensorBase& q, const at::TensorBase& k, int64_t heads) {
  const int64_t h = q.size(2);
  return {q.size(0), q.size(1), k.size(1), h, heads, h / heads};
}

// The valid keys of query i of head `head` of entry b.
struct HeadLengths {
  const int64_t* data = nullptr;
  bool per_head = false, per_query = false;

  HeadLengths(const at::TensorBase& lens, const HeadDims& s) {
    if (lens.numel() == 0) return;
    data = lens.data_ptr<int64_t>();
    per_head = lens.size(0) != s.batch;
    per_query = lens.dim() == 2;
  }
  // One length per entry, or none (every key).
  explicit HeadLengths(const int64_t* per_entry) : data(per_entry) {}

  int64_t at(const HeadDims& s, int64_t b, int64_t head, int64_t i) const {
    if (data == nullptr) return s.m;
    const int64_t e = per_head ? b * s.heads + head : b;
    return std::clamp<int64_t>(data[per_query ? e * s.n + i : e], 0, s.m);
  }
};

// What both passes read: the sizes, the lengths, and q, k, v and the
// dropout's multipliers (nullptr: none).
template <typename T>
struct HeadInputs {
  HeadDims s;
  HeadLengths L;
  const T *q, *k, *v, *noise;

  HeadInputs(const at::TensorBase& q_, const at::TensorBase& k_, const at::TensorBase& v_,
             const at::TensorBase& lens, const at::TensorBase& noise_, int64_t heads)
      : s(head_dims(q_, k_, heads)),
        L(lens, s),
        q(q_.data_ptr<T>()),
        k(k_.data_ptr<T>()),
        v(v_.data_ptr<T>()),
        noise(noise_.numel() > 0 ? noise_.data_ptr<T>() : nullptr) {}
  HeadInputs(const HeadDims& dims, const int64_t* lens, const T* q_, const T* k_, const T* v_)
      : s(dims), L(lens), q(q_), k(k_), v(v_), noise(nullptr) {}
};

// A head costs about its valid (query, key) pairs times d, and each row a
// little on its own. Task t is head t % heads of entry t / heads.
std::vector<int64_t> head_costs(const HeadDims& s, const HeadLengths& L) {
  std::vector<int64_t> costs(s.batch * s.heads);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t head = 0; head < s.heads; ++head) {
      int64_t pairs = 0;
      for (int64_t i = 0; i < s.n; ++i) pairs += L.at(s, b, head, i) + 4;
      costs[b * s.heads + head] = pairs * (s.d + 8);
    }
  }
  return costs;
}

template <typename F>
void parallel_heads(const HeadDims& s, const HeadLengths& L, const F& body) {
  parallel_runs(head_costs(s, L), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) body(t / s.heads, t % s.heads);
  });
}

// The keys some query of some head of entry b reads.
int64_t longest_of_entry(const HeadDims& s, const HeadLengths& L, int64_t b) {
  int64_t longest = 0;
  for (int64_t head = 0; head < s.heads; ++head) {
    for (int64_t i = 0; i < s.n; ++i) longest = std::max(longest, L.at(s, b, head, i));
  }
  return longest;
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
