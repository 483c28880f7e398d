#pragma once

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
