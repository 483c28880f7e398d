// The flash dot-product attention's backward pass on the CPU: P recomputed
// block by block from lse, parallel over (batch entry, key block), dQ's sums
// in an order fixed by the work split where they must come out the same from
// call to call; batch entries of a few queries row by row (flash_rows-inl.h).
// Note [Flash attention] in dot_product_attention_kernel.cpp. Compiled once
// per instruction set (Note [CPU kernels per instruction set]).

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "cpu/dot_product_attention_kernel_parts.h"
#include "cpu/flash_blocks-inl.h"
#include "cpu/flash_blocks_backward-inl.h"
#include "cpu/flash_rows-inl.h"
#include "cpu/flash_rows_backward-inl.h"
#include "cpu/gemm-inl.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// Whether the runs of the block path can add every shared batch entry's dQ
// in run order by scheduling alone, with no share and no lock: each run that
// continues an entry also holds tasks of other entries, which it runs first,
// and takes its part of the continued entry last, after the run before it
// (which runs that entry's tasks first) is done with them. It must not wait
// long: the earlier run's part must cost no more than the later run's other
// tasks. Waits point only to earlier runs, whose first tasks wait for
// nothing, so runs that share a thread (in order) cannot deadlock.
inline bool ordered_runs(const Continuations& c, const std::vector<int64_t>& bounds,
                         const std::vector<int64_t>& task_b, const std::vector<int64_t>& costs) {
  for (int64_t i = 0; i < c.size(); ++i) {
    const int64_t r = c.run[i], b = c.entry[i];
    const int64_t t0 = bounds[r], t1 = bounds[r + 1];
    if (task_b[t1 - 1] == b) return false;  // nothing else to run first
    int64_t others = 0, earlier = 0;
    for (int64_t t = t0; t < t1; ++t) others += task_b[t] == b ? 0 : costs[t];
    for (int64_t t = t0 - 1; t >= bounds[r - 1] && task_b[t] == b; --t) earlier += costs[t];
    if (earlier > others) return false;
  }
  return true;
}

// Whether the backward runs row by row (backward_rows) for n queries a batch
// entry whose valid lengths reach `longest`. Measured one thread, d = dv = 64,
// AVX-512 float, random lengths, forward+backward, rows against blocks: one to
// three queries 0.29-0.51x (n 1, m 2048: 3.5 against 12.0 ms), four 0.33x at
// m 64 and 0.99x at m 512; ten 0.82x at m 64 (d2l's (64, 10, 10), d 32:
// 150 against 221 us) but 1.52x at m 128; six at m 128 1.47x, sixteen at m 64
// 1.41x.
inline bool backward_by_rows(int64_t n, int64_t longest) {
  return n <= 4 || (n <= 12 && longest <= 64);
}

// The backward of a call whose operands (q, k, v, dout) are of type In: T,
// or bfloat16 read in place by the rows and widened by the blocks into the
// thread's padded rows (padded_rows: a batch entry's Q and dO, a key block's
// K and V). The
// forward's output and lse are T; the gradients are In: dK's and dV's rows
// made in T a key block at a time and rounded once by the task that owns
// them (no whole-size float copy of them, no pass over it afterwards), dQ
// made in a T buffer and rounded at the end.
template <typename T, typename In>
void backward_typed(const at::TensorBase& q, const at::TensorBase& k, const at::TensorBase& v,
                    const at::TensorBase& lens, double scale, const at::TensorBase& out,
                    const at::TensorBase& dout, const at::TensorBase& lse, const at::TensorBase& dq,
                    const at::TensorBase& dk, const at::TensorBase& dv) {
  const Dims s = dims_of(q, v);
  const In *qd = q.data_ptr<In>(), *kd = k.data_ptr<In>(), *vd = v.data_ptr<In>();
  const T* od = out.data_ptr<T>();
  const In* dod = dout.data_ptr<In>();
  const RowLengths row_lens = row_lengths(lens, s.n);
  // Keys at or past a batch entry's longest length get no gradient (nor,
  // with bands, keys before every row's first: the tasks zero those).
  std::vector<int64_t> batch_longest(s.B);
  for (int64_t b = 0; b < s.B; ++b) batch_longest[b] = longest_length(row_lens, s, b, 0, s.n);
  // dQ in T: the output itself, or for bfloat16 a buffer rounded into it at
  // the end (its sums span key blocks, so no block can round its rows).
  std::unique_ptr<T[]> dq_wide;
  T* dqd = nullptr;
  if constexpr (std::is_same_v<In, T>) {
    dqd = dq.data_ptr<T>();
  } else {
    dq_wide = uninitialized_buffer<T>(s.B * s.n * s.d);
    dqd = dq_wide.get();
  }
  In *dkd = dk.data_ptr<In>(), *dvd = dv.data_ptr<In>();
  // The zeros of the gradients, in parallel where there are at least kGrain
  // of them: dq (which the tasks add their shares to) and the rows of dk and
  // dv past each batch entry's longest length (the tasks write the rows below
  // it). With a grain of one batch entry, the toy shape (2 entries, 10 keys)
  // opened a parallel region for a few dozen zeros, and its forward+backward took
  // 19.1 us on 2 threads against 16.3 us on 1.
  const int64_t zeros_per_entry = s.n * s.d + s.m * (s.d + s.dv);
  at::parallel_for(0, s.B, grain_for(zeros_per_entry), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      std::fill_n(dqd + b * s.n * s.d, s.n * s.d, T(0));
      const int64_t from = b * s.m + batch_longest[b], to = (b + 1) * s.m;
      std::fill(dkd + from * s.d, dkd + to * s.d, In(0));
      std::fill(dvd + from * s.dv, dvd + to * s.dv, In(0));
    }
  });
  const int64_t longest =
      batch_longest.empty() ? 0 : *std::max_element(batch_longest.begin(), batch_longest.end());
  // A batch entry of a few queries runs row by row (backward_rows), which reads
  // every operand in place: no padded rows.
  const bool rows_path = backward_by_rows(s.n, longest);
  const int64_t ldq = round_up_to_tile<T>(s.d), ldv = round_up_to_tile<T>(s.dv);
  // dQ's sums in a fixed order (Continuations) on the rows path, where a
  // run's share of an entry is n <= 12 rows, and wherever deterministic
  // algorithms are asked for (torch::use_deterministic_algorithms): there a
  // run that starts inside a batch entry holds n × d of its own, which at one
  // sequence of 8192 queries (d 64, 2 threads) puts the forward+backward's
  // peak at 4.5 MiB instead of 2.5, above SDPA's 4.1. Otherwise the runs
  // order the sums by scheduling where they can (ordered_runs: each shared
  // entry spans two runs, the later of which has other work to do first),
  // and only where they cannot do key blocks add into dQ under locks, in
  // the order the threads reach them.
  const bool deterministic = rows_path || at::globalContext().deterministicAlgorithms();
  const int64_t kb = key_block_size<T>(longest, 4);
  // Tasks: the key blocks of each batch entry below its longest length, at a
  // cost of the rows and keys their query blocks visit (each query block
  // its span of keys, key_span).
  std::vector<int64_t> task_b, task_j0, costs;
  for (int64_t b = 0; b < s.B; ++b) {
    std::vector<KeySpan> spans;
    for (int64_t i0 = 0; i0 < s.n; i0 += kQueryBlock) {
      spans.push_back(key_span(row_lens, s, b, i0, std::min(kQueryBlock, s.n - i0)));
    }
    for (int64_t j0 = 0; j0 < batch_longest[b]; j0 += kb) {
      // The key block's packing, and per visited (row, key) the
      // multiply-adds of five products (S, dP, dV, dK, dQ), 5/2 of the
      // forward's two (macs_to_grain). Costed as a forward pair, the book's
      // (64, 10, 10, d 32) backward came to 1.9 kGrain, stayed on the
      // calling thread, and its forward+backward took as long on 2 threads
      // as on 1.
      int64_t cost = std::min(kb, batch_longest[b] - j0);
      for (const KeySpan& span : spans) {
        const int64_t keys = std::min(span.end, j0 + kb) - std::max(span.first, j0);
        cost += (rows_path ? s.n : kQueryBlock) * std::max<int64_t>(keys, 0);
      }
      cost = cost * macs_to_grain(s) * 5 / 2;
      task_b.push_back(b);
      task_j0.push_back(j0);
      costs.push_back(cost);
    }
  }
  if (costs.empty()) {
    if constexpr (!std::is_same_v<In, T>) std::fill_n(dq.data_ptr<In>(), s.B * s.n * s.d, In(0));
    return;
  }
  const std::vector<int64_t> bounds = run_bounds(costs);
  const Continuations continued = continuations(bounds, [&](int64_t t) { return task_b[t]; });
  // Where every shared entry can be summed in run order by scheduling alone
  // (ordered_runs), no shares and no locks.
  const bool ordered = !deterministic && continued.size() > 0 &&
                       ordered_runs(continued, bounds, task_b, costs);
  const Continuations shared = deterministic ? continued : Continuations{};
  std::array<std::mutex, kDqLocks> dq_locks;
  const BackwardArgs<T, In> args{s,
                                 qd,
                                 kd,
                                 vd,
                                 od,
                                 dod,
                                 lse.data_ptr<T>(),
                                 ldq,
                                 ldv,
                                 row_lens,
                                 T(scale),
                                 dqd,
                                 dkd,
                                 dvd,
                                 deterministic || ordered ? nullptr : dq_locks.data()};
  const int64_t share_size = s.n * s.d;
  const auto shares = shared.size() > 0 ? uninitialized_buffer<T>(shared.size() * share_size)
                                         : std::unique_ptr<T[]>();
  const auto target_of = [&](int64_t r) {
    DqTarget<T> target;
    if (const int64_t slot = shared.slot_of(r); slot >= 0) {
      target.entry = shared.entry[slot];
      target.share = shares.get() + slot * share_size;
      std::fill_n(target.share, share_size, T(0));
    }
    return target;
  };
  // ready[r]: run r - 1 has added its tasks of the entry run r continues.
  std::vector<std::atomic<bool>> ready(ordered ? bounds.size() : 0);
  for_each_run(bounds, [&](int64_t r, int64_t t0, int64_t t1) {
    if (rows_path) {
      RowsScratch<T> scratch(s);
      scratch.target = target_of(r);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = task_b[t], j0 = task_j0[t];
        backward_rows(args, scratch, b, j0, std::min(kb, batch_longest[b] - j0));
      }
      return;
    }
    BackwardScratch<T> scratch(s, ldq, ldv, kb, std::is_same_v<In, T>);
    scratch.target = target_of(r);
    const auto run = [&](int64_t first, int64_t last) {
      for (int64_t t = first; t < last; ++t) {
        const int64_t b = task_b[t], j0 = task_j0[t];
        backward_block(args, scratch, b, j0, std::min(kb, batch_longest[b] - j0));
      }
    };
    if (!ordered) return run(t0, t1);
    // The entry this run continues (its head) goes last, once the run that
    // holds the entry's first tasks has added them; the entry the next run
    // continues (its tail) goes first, and says so when done.
    int64_t head_end = t0, tail_begin = t1;
    if (continued.slot_of(r) >= 0) {
      while (task_b[head_end] == task_b[t0]) ++head_end;
    }
    if (continued.slot_of(r + 1) >= 0) {
      while (tail_begin > head_end && task_b[tail_begin - 1] == task_b[t1 - 1]) --tail_begin;
    }
    run(tail_begin, t1);
    if (tail_begin < t1) ready[r + 1].store(true, std::memory_order_release);
    run(head_end, tail_begin);
    if (t0 < head_end) {
      while (!ready[r].load(std::memory_order_acquire)) std::this_thread::yield();
      run(t0, head_end);
    }
  });
  add_shares(shared, shares.get(), share_size, [&](int64_t b) { return dqd + b * share_size; });
  if constexpr (!std::is_same_v<In, T>) {
    In* out = dq.data_ptr<In>();
    at::parallel_for(0, s.B, grain_for(s.n * s.d), [&](int64_t b0, int64_t b1) {
      narrow(dqd + b0 * s.n * s.d, (b1 - b0) * s.n * s.d, out + b0 * s.n * s.d);
    });
  }
}

}  // namespace

void dot_product_attention_backward(const at::TensorBase& q, const at::TensorBase& k,
                                    const at::TensorBase& v, const at::TensorBase& lens,
                                    double scale, const at::TensorBase& out,
                                    const at::TensorBase& dout, const at::TensorBase& lse,
                                    const at::TensorBase& dq, const at::TensorBase& dk,
                                    const at::TensorBase& dv) {
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "d2l::flash_attention_backward", [&] {
    backward_typed<scalar_t, scalar_t>(q, k, v, lens, scale, out, dout, lse, dq, dk, dv);
  });
}

void dot_product_attention_backward_bf16(const at::TensorBase& q, const at::TensorBase& k,
                                         const at::TensorBase& v, const at::TensorBase& lens,
                                         double scale, const at::TensorBase& out,
                                         const at::TensorBase& dout, const at::TensorBase& lse,
                                         const at::TensorBase& dq, const at::TensorBase& dk,
                                         const at::TensorBase& dv) {
  backward_typed<float, c10::BFloat16>(q, k, v, lens, scale, out, dout, lse, dq, dk, dv);
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
