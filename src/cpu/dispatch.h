#pragma once

#include <d2l/backend.h>

// Note [CPU kernels per instruction set]
// Each src/cpu/*_kernel.cpp is compiled once per instruction set, with
// -DCPU_CAPABILITY=DEFAULT, AVX2 or AVX512 and the matching -m flags (see
// src/CMakeLists.txt), as ATen compiles its native/cpu kernels. Each copy
// defines, in namespace d2l::cpu::<ISA>, a function returning its table of
// kernels; dispatch.cpp returns the table of the instruction set chosen for
// this process (d2l::cpu_isa()). The kernels take tensors that the op layer
// has allocated and made contiguous, and create none themselves.

#define D2L_DECLARE_CPU_KERNELS(Table, getter)                     \
  namespace DEFAULT {                                              \
  const Table& getter();                                           \
  }                                                                \
  namespace AVX2 {                                                 \
  const Table& getter();                                           \
  }                                                                \
  namespace AVX512 {                                               \
  const Table& getter();                                           \
  }                                                                \
  /** The table of the instruction set chosen for this process. */ \
  const Table& getter();

namespace d2l::cpu {

/// The kernels' instruction set that D2L_CPU_ISA's value asks for, which is
/// also the widest the process may use: nullptr or "" means the widest this
/// CPU and build run, up to avx512_bf16, with no cap. A value
/// that names no level, or a level this CPU or build cannot run, is a
/// c10::Error naming the variable, the level asked and the levels at hand:
/// pinning a level that would fault (SIGILL) or quietly running another is
/// never right.
CpuIsa isa_from_environment(const char* value);

/// Whether this CPU and build run `isa`, whatever D2L_CPU_ISA caps the
/// process at (d2l::cpu_isa_available: both).
bool isa_runnable_on_this_cpu(CpuIsa isa);

}  // namespace d2l::cpu
