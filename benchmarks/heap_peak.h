#pragma once

// Exact heap accounting for the CPU benchmarks (heap_peak.cpp): the program
// that links heap_peak.cpp routes malloc and its relatives through counters,
// so that a case's peak memory is the bytes it actually held at once, not
// the resident-set high-water mark, which stays flat whenever the allocator
// reuses pages freed by an earlier call.

#include <cstdint>
#include <functional>

namespace d2l::bench {

/// Whether the heap counters are linked in (not in sanitizer builds, whose
/// runtimes own malloc).
bool heap_counting();

/// The most bytes held on the heap at once during `fn`, above what was held
/// when it started (usable sizes of live blocks, from every thread).
/// Meaningful only where heap_counting() is true; -1 otherwise.
int64_t peak_heap_delta(const std::function<void()>& fn);

}  // namespace d2l::bench
