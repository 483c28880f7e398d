// The fused masked softmax over the last dimension, forward and backward:
// parallel over rows, vectorised within a row (softmax_row-inl.h). Compiled
// once per instruction set (Note [CPU kernels per instruction set]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/masked_softmax_kernel.h"
#include "cpu/parallel_runs-inl.h"
#include "cpu/softmax_row-inl.h"
#include "cpu/vec_helpers-inl.h"

namespace d2l::cpu {
namespace CPU_CAPABILITY {
namespace {

int64_t rows_of(const at::TensorBase& x) {
  const int64_t m = x.size(-1);
  return m == 0 ? 0 : x.numel() / m;
}

int64_t queries_of(const at::TensorBase& x) { return x.dim() == 3 ? x.size(1) : 1; }

// Rows are split over threads by cost, not by count: with random lengths an
// even split of the rows left one thread with most of the valid entries and
// the other waiting at the barrier (16% of a 2-thread forward's time in
// libgomp at the bench's mid shape). A row costs its valid entries times
// the passes over them (forward: max, exp and sum, normalisation; backward:
// dot product, gradient), plus one store per entry for the zeros past them.
// Tasks are kRowsPerTask rows, or where a length's rows are not a multiple of
// that, the rows that share one length (a batch entry's, with (B) lengths):
// tasks of a whole batch entry (32 of them at (32, 128, 128)) left the larger
// of two runs 3% over half in the median; a cost per row, where rows share
// their lengths, would cost more to add up than the imbalance it saves.
// Each row also costs about kSoftmaxRowCost entries' worth on its own (its
// reductions, tails, the call): counted, the book's (64, 10, 10) is work
// enough for two threads (23 µs on one here), where counting entries alone
// kept it on one.
constexpr int64_t kForwardPasses = 4, kBackwardPasses = 2, kRowsPerTask = 16, kSoftmaxRowCost = 128;

template <typename F>
void parallel_rows(const RowLengths& L, int64_t rows, int64_t m, int64_t passes, const F& body) {
  // Whether each task's rows share one length.
  const bool shared = L.data == nullptr || L.rows_per_len % kRowsPerTask == 0;
  const int64_t per_task = shared || L.rows_per_len == 1 ? kRowsPerTask : L.rows_per_len;
  const int64_t tasks = (rows + per_task - 1) / per_task;
  std::vector<int64_t> costs(tasks);
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r0 = t * per_task, r1 = std::min(rows, r0 + per_task);
    int64_t cost = 0;
    if (shared || per_task == L.rows_per_len) {
      cost = (r1 - r0) * (passes * L.at(r0, m) + m + kSoftmaxRowCost);
    } else {
      for (int64_t r = r0; r < r1; ++r) cost += passes * L.at(r, m) + m + kSoftmaxRowCost;
    }
    costs[t] = cost;
  }
  parallel_runs(costs, [&](int64_t t0, int64_t t1) {
    body(t0 * per_task, std::min(rows, t1 * per_task));
  });
}

void forward(const at::TensorBase& x, const at::TensorBase& y, const at::TensorBase& lens,
             double scale) {
  const int64_t m = x.size(-1), rows = rows_of(x);
  const RowLengths L = row_lengths(lens, queries_of(x));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "d2l::masked_softmax", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const auto s = static_cast<scalar_t>(scale);
    parallel_rows(L, rows, m, kForwardPasses, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) softmax_row(xp + r * m, yp + r * m, L.at(r, m), m, s);
    });
  });
}

void backward(const at::TensorBase& y, const at::TensorBase& dy, const at::TensorBase& dx,
              const at::TensorBase& lens, double scale) {
  const int64_t m = y.size(-1), rows = rows_of(y);
  const RowLengths L = row_lengths(lens, queries_of(y));
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "d2l::masked_softmax_backward", [&] {
    const scalar_t* yp = y.data_ptr<scalar_t>();
    const scalar_t* dyp = dy.data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const auto s = static_cast<scalar_t>(scale);
    parallel_rows(L, rows, m, kBackwardPasses, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        softmax_backward_row(yp + r * m, dyp + r * m, dxp + r * m, L.at(r, m), m, s);
      }
    });
  });
}

}  // namespace

const MaskedSoftmaxKernels& masked_softmax_kernels() {
  static const MaskedSoftmaxKernels table{&forward, &backward};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace d2l::cpu
