// malloc, free and their relatives, defined in the benchmark executable so
// that every library's calls (operator new, c10's posix_memalign, OpenBLAS)
// resolve here first; each forwards to glibc's own entry points and keeps a
// count of the live bytes and their high-water mark (heap_peak.h).

#include "heap_peak.h"

#if defined(D2L_BENCH_NO_HEAP_COUNTING)

namespace d2l::bench {
bool heap_counting() { return false; }
int64_t peak_heap_delta(const std::function<void()>& fn) {
  fn();
  return -1;
}
}  // namespace d2l::bench

#else

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* p, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void __libc_free(void* p);
}

namespace {

std::atomic<int64_t> live{0};
std::atomic<int64_t> high_water{0};

void* counted(void* p) {
  if (p == nullptr) return p;
  const auto size = static_cast<int64_t>(malloc_usable_size(p));
  const int64_t now = live.fetch_add(size, std::memory_order_relaxed) + size;
  int64_t seen = high_water.load(std::memory_order_relaxed);
  while (now > seen && !high_water.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
  return p;
}

void uncounted(void* p) {
  if (p == nullptr) return;
  live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}

bool power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace

extern "C" {

void* malloc(size_t size) { return counted(__libc_malloc(size)); }

void free(void* p) {
  uncounted(p);
  __libc_free(p);
}

void* calloc(size_t count, size_t size) { return counted(__libc_calloc(count, size)); }

void* realloc(void* p, size_t size) {
  // The old block's size must be read before realloc may release it.
  const auto old = p == nullptr ? 0 : static_cast<int64_t>(malloc_usable_size(p));
  void* q = __libc_realloc(p, size);
  // nullptr: p untouched, unless size was 0, which glibc takes as free(p).
  if (q != nullptr || size == 0) live.fetch_sub(old, std::memory_order_relaxed);
  return counted(q);
}

void* memalign(size_t alignment, size_t size) { return counted(__libc_memalign(alignment, size)); }

void* aligned_alloc(size_t alignment, size_t size) { return memalign(alignment, size); }

int posix_memalign(void** out, size_t alignment, size_t size) {
  if (!power_of_two(alignment) || alignment % sizeof(void*) != 0) return EINVAL;
  void* p = memalign(alignment, size);
  if (p == nullptr && size != 0) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(size_t size) { return memalign(4096, size); }

}  // extern "C"

namespace d2l::bench {

bool heap_counting() { return true; }

int64_t peak_heap_delta(const std::function<void()>& fn) {
  const int64_t start = live.load();
  high_water.store(start);
  fn();
  return high_water.load() - start;
}

}  // namespace d2l::bench

#endif  // D2L_BENCH_NO_HEAP_COUNTING
