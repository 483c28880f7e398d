#pragma once

#include <string>

namespace d2l {

/// Which implementation an attention function or module runs.
enum class Impl {
  /// The fused kernels where one exists for the inputs' device (CPU), else
  /// the composite path (CUDA: composite softmax, chunked additive scores).
  kAuto,
  /// The book's formulation with ATen ops: the readable oracle.
  kComposite,
  /// The fused CPU kernels; an error for tensors on another device.
  kFused,
};

/// Instruction sets the fused CPU kernels are compiled for.
enum class CpuIsa { kDefault, kAvx2 };

/// The instruction set the fused kernels run with in this process: AVX2+FMA
/// when the CPU has them and the library was built with that variant, unless
/// the environment variable D2L_CPU_ISA=default (or set_cpu_isa) says otherwise.
CpuIsa cpu_isa();

/// Chooses the kernels' instruction set, e.g. to compare them; throws
/// c10::Error if this CPU or build cannot run `isa`. Not thread-safe with
/// respect to kernels running at the same time.
void set_cpu_isa(CpuIsa isa);

/// "default" or "avx2".
std::string to_string(CpuIsa isa);

}  // namespace d2l
