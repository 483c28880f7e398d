#pragma once

// What the benchmark programs share: the shape of an attention problem and
// the peak-memory probe on the CPU.

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

namespace d2l::bench {

/// Batch B, queries n, keys m, query/key features d, hidden units h.
struct Shape {
  std::string name;
  int64_t B, n, m, d, h;
};

/// A byte count from /proc/self/status ("VmRSS:", "VmHWM:"), or -1.
inline int64_t status_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field))) * 1024;
  }
  return -1;
}

/// Growth of the resident-set high-water mark over one call of `fn`; the mark
/// is reset first (clear_refs 5), since ru_maxrss only ever grows.
inline double peak_rss_delta(const std::function<void()>& fn) {
  std::ofstream("/proc/self/clear_refs") << "5";
  const int64_t before = status_bytes("VmRSS:");
  fn();
  return static_cast<double>(status_bytes("VmHWM:") - before);
}

}  // namespace d2l::bench
