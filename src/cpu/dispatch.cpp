#include <d2l/backend.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "cpu/kernels.h"

namespace d2l {
namespace {

bool avx2_runnable() {
#if defined(D2L_HAVE_AVX2_KERNELS) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

CpuIsa initial_isa() {
  const char* env = std::getenv("D2L_CPU_ISA");
  if (env != nullptr && std::strcmp(env, "default") == 0) return CpuIsa::kDefault;
  return avx2_runnable() ? CpuIsa::kAvx2 : CpuIsa::kDefault;
}

std::atomic<CpuIsa>& chosen_isa() {
  static std::atomic<CpuIsa> isa{initial_isa()};
  return isa;
}

}  // namespace

CpuIsa cpu_isa() { return chosen_isa().load(std::memory_order_relaxed); }

void set_cpu_isa(CpuIsa isa) {
  TORCH_CHECK(isa != CpuIsa::kAvx2 || avx2_runnable(),
              "d2l::set_cpu_isa: AVX2 kernels cannot run here (the CPU lacks AVX2/FMA or the "
              "library was built without the AVX2 variant)");
  chosen_isa().store(isa, std::memory_order_relaxed);
}

std::string to_string(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "default"; }

namespace cpu {

template <>
const KernelTable<float>& kernels<float>() {
#ifdef D2L_HAVE_AVX2_KERNELS
  if (cpu_isa() == CpuIsa::kAvx2) return AVX2::float_kernels();
#endif
  return DEFAULT::float_kernels();
}

template <>
const KernelTable<double>& kernels<double>() {
#ifdef D2L_HAVE_AVX2_KERNELS
  if (cpu_isa() == CpuIsa::kAvx2) return AVX2::double_kernels();
#endif
  return DEFAULT::double_kernels();
}

}  // namespace cpu
}  // namespace d2l
