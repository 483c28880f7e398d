// empty_output (cpu/kernel_args.h): kernel outputs on transparent huge pages.

#include "cpu/kernel_args.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <cstdint>

namespace d2l::detail {

namespace {

constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;

// Asks the kernel to back [p, p + bytes) with 2 MiB pages where it leaves
// transparent huge pages to madvise (Debian's default): only whole, aligned
// huge pages inside the range, which the caller is about to write in full,
// so no page holds memory the tensor does not use. Only a hint: where THP
// is off (or always on) nothing changes, and a refusal is harmless.
void advise_huge_pages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const auto first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const auto last = (begin + bytes) & ~(kHugePage - 1);
  if (last > first) {
    madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#else
  (void)p;
  (void)bytes;
#endif
}

// Maps every whole page of [p, p + bytes) now, on the calling thread
// (MADV_POPULATE_WRITE, Linux 5.14): the kernels' threads then write memory
// that is already there. Left to their first writes, the page faults of a
// fresh buffer stall the threads against each other: two threads writing
// rows of one 2 MiB page wait while one of them clears it. The float32
// forward of 8 heads × 8192 queries × 128 features (a 33.5 MB output, 2
// threads, Intel AMX VM) took 133 ms with the faults in the kernel and 85
// ms without them. Where Linux has no such advice, pages fault as before.
void populate(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr std::uintptr_t kPage = 4096;
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const auto first = (begin + kPage - 1) & ~(kPage - 1);
  const auto last = (begin + bytes) & ~(kPage - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace

torch::Tensor empty_output(at::IntArrayRef sizes, const torch::TensorOptions& options) {
  auto t = torch::empty(sizes, options);
  if (t.device().is_cpu() && t.nbytes() >= kHugePageOutputBytes) {
    advise_huge_pages(t.data_ptr(), t.nbytes());
    populate(t.data_ptr(), t.nbytes());
  }
  return t;
}

torch::Tensor contiguous_input(const torch::Tensor& t) {
  if (t.is_contiguous() || !t.device().is_cpu() || t.nbytes() < kHugePageOutputBytes) {
    return t.contiguous();
  }
  return empty_output(t.sizes(), t.options()).copy_(t);
}

}  // namespace d2l::detail
