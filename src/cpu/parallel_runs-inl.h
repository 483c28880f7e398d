#pragma once

// How the kernels split their work over threads (included inside each
// instruction set's CPU_CAPABILITY namespace, as every -inl.h here): runs of
// tasks of about equal cost, one per thread, and sums that come out the same
// from call to call where two runs add into one output.

#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>
#ifdef D2L_RUNS_ON_STD_THREADS
#include <exception>
#include <thread>
#endif

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

// Rows of about this many element-operations make one parallel task.
constexpr int64_t kGrain = 32768;

inline int64_t grain_for(int64_t cost_per_row) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cost_per_row));
}

// Work split by cost (the flash and additive kernels): with random valid
// lengths, equal numbers of tasks would leave one thread with most of the
// keys.
//
// Runs [bounds[r], bounds[r + 1]) of consecutive tasks, at most `parts` of
// them, each of about the same total cost: a run ends before or after the
// task that crosses its share, whichever lands nearer the share, but never
// before its own first task, so no run is empty. (With 32 tasks of random
// cost, ending always after left the larger of two runs 3% over half in the
// median and 7% at the 90th percentile; the nearer end, 1.6% and 3.5%.)
std::vector<int64_t> balanced_runs(const std::vector<int64_t>& costs, int64_t parts) {
  double total = 0;
  for (const int64_t c : costs) total += static_cast<double>(c);
  std::vector<int64_t> bounds{0};
  // Where run `bounds.size()` should end, computed once per run rather than
  // once per task: this loop is serial, before the threads start.
  auto share_of = [&](size_t run) {
    return total * static_cast<double>(run) / static_cast<double>(parts);
  };
  double done = 0, share = share_of(1);
  for (size_t t = 0; t < costs.size(); ++t) {
    const double before = done;
    done += static_cast<double>(costs[t]);
    if (static_cast<int64_t>(bounds.size()) < parts && done >= share) {
      const auto task = static_cast<int64_t>(t);
      const bool before_is_nearer = task > bounds.back() && share - before < done - share;
      bounds.push_back(before_is_nearer ? task : task + 1);
      share = share_of(bounds.size());
    }
  }
  if (bounds.back() != static_cast<int64_t>(costs.size())) {
    bounds.push_back(static_cast<int64_t>(costs.size()));
  }
  return bounds;
}

// The runs of tasks that parallel_runs makes: one run per thread, and one
// run per kGrain of cost at most, so small work is a single run on the
// calling thread, with no parallel region. Opening one per call cost more
// than the work at the sizes of a seq2seq step, and far more when threads are
// oversubscribed (LibTorch 2.x wheels bring their own OpenMP runtime beside
// ours).
inline int64_t run_count(const std::vector<int64_t>& costs) {
  double total = 0;
  for (const int64_t c : costs) total += static_cast<double>(c);
  return std::clamp<int64_t>(static_cast<int64_t>(total / kGrain), 1,
                             std::max(1, at::get_num_threads()));
}

inline std::vector<int64_t> run_bounds(const std::vector<int64_t>& costs) {
  const int64_t parts = run_count(costs);
  if (parts == 1) return {0, static_cast<int64_t>(costs.size())};
  return balanced_runs(costs, parts);
}

// body(r, first, last) for each run r, tasks [bounds[r], bounds[r + 1]).
template <typename F>
void for_each_run(const std::vector<int64_t>& bounds, const F& body) {
  const auto runs = static_cast<int64_t>(bounds.size()) - 1;
  if (runs <= 0) return;
  if (runs == 1) return body(int64_t{0}, bounds[0], bounds[1]);
#ifdef D2L_RUNS_ON_STD_THREADS
  // The sanitizer builds have no OpenMP, and at::parallel_for would run every
  // run on this thread: there each run but the first gets a thread of its
  // own, so that ASan and TSan see the runs at once (thread start and join
  // are the only synchronisation besides the kernels' own).
  std::vector<std::exception_ptr> errors(runs);
  const auto run = [&](int64_t r) {
    try {
      body(r, bounds[r], bounds[r + 1]);
    } catch (...) {
      errors[r] = std::current_exception();
    }
  };
  {
    std::vector<std::thread> threads;
    struct JoinAll {
      std::vector<std::thread>& threads;
      ~JoinAll() {
        for (auto& t : threads) t.join();
      }
    } join_all{threads};
    threads.reserve(runs - 1);
    for (int64_t r = 1; r < runs; ++r) threads.emplace_back(run, r);
    run(0);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
#else
  at::parallel_for(0, runs, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) body(r, bounds[r], bounds[r + 1]);
  });
#endif
}

// body(first, last) for each run of tasks (run_bounds).
template <typename F>
void parallel_runs(const std::vector<int64_t>& costs, const F& body) {
  if (costs.empty()) return;
  for_each_run(run_bounds(costs), [&](int64_t, int64_t t0, int64_t t1) { body(t0, t1); });
}

// body(first, last) over chunks of `chunk` consecutive tasks that the runs
// (as many as run_count gives, one per thread) claim one at a time, each as
// it finishes its last: where the threads do not run at one speed (a VM's
// vCPUs, or the calling thread coming from serial work with other data in
// its caches), fixed shares of equal cost leave the faster threads waiting.
// Fewer than two chunks a run leave nothing to even out: then the runs of
// parallel_runs, split by cost inside chunks. For tasks that write only
// outputs of their own (no sums across tasks): which thread runs a task
// does not change its bits.
template <typename F>
void claimed_runs(const std::vector<int64_t>& costs, int64_t chunk, const F& body) {
  const auto n = static_cast<int64_t>(costs.size());
  if (n == 0) return;
  const int64_t chunks = (n + chunk - 1) / chunk;
  const int64_t runs = run_count(costs);
  if (runs == 1) return body(int64_t{0}, n);
  if (chunks < 2 * runs)
    return for_each_run(balanced_runs(costs, runs),
                        [&](int64_t, int64_t t0, int64_t t1) { body(t0, t1); });
  std::vector<int64_t> bounds(static_cast<size_t>(runs) + 1);
  for (int64_t r = 0; r <= runs; ++r) bounds[static_cast<size_t>(r)] = r;
  std::atomic<int64_t> next{0};
  for_each_run(bounds, [&](int64_t, int64_t, int64_t) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      body(c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

// Sums that come out the same from call to call. Where the tasks of one batch
// entry add into one output (dQ in the flash backward, dK and dV in the
// additive one) and a run boundary falls inside the entry, two threads would
// add into it in whichever order they get there, so the gradients' last bits
// would change between calls with the same inputs. Instead the run holding
// the entry's first task adds into the output, and each run that starts
// inside an entry (a continuation) adds its tasks of that entry into a share
// of its own, which add_shares adds to the output after the parallel region,
// in run order: at a given thread count every element is summed in one order.
struct Continuations {
  std::vector<int64_t> run;    // runs that start inside an entry, ascending
  std::vector<int64_t> entry;  // the entry each one continues

  int64_t size() const { return static_cast<int64_t>(run.size()); }

  // The index of run r among the continuations, or -1.
  int64_t slot_of(int64_t r) const {
    const auto it = std::lower_bound(run.begin(), run.end(), r);
    return it != run.end() && *it == r ? static_cast<int64_t>(it - run.begin()) : -1;
  }
};

template <typename EntryOf>
Continuations continuations(const std::vector<int64_t>& bounds, const EntryOf& entry_of) {
  Continuations c;
  for (size_t r = 1; r + 1 < bounds.size(); ++r) {
    if (entry_of(bounds[r]) == entry_of(bounds[r] - 1)) {
      c.run.push_back(static_cast<int64_t>(r));
      c.entry.push_back(entry_of(bounds[r]));
    }
  }
  return c;
}

// out(entry)[e] += share i's [e] for e < size, for each continuation i in
// order.
template <typename T, typename OutOf>
void add_shares(const Continuations& c, const T* shares, int64_t size, const OutOf& out_of) {
  for (int64_t i = 0; i < c.size(); ++i) {
    T* out = out_of(c.entry[i]);
    const T* share = shares + i * size;
    at::parallel_for(0, size, kGrain, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) out[e] += share[e];
    });
  }
}

}  // namespace
}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
