#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace d2l {

/// Which implementation an attention function or module runs, as PyTorch's
/// SDPBackend does for scaled_dot_product_attention: the `backend` field of
/// every FuncOptions, the `backend` option of every module and the last
/// argument of masked_softmax (docs/api.md, "Choosing a backend"). Within a
/// backend each op takes one of its paths (flash, fused softmax, chunked,
/// ...): explain_path says which and why.
enum class AttentionBackend {
  /// The fastest correct path for the inputs (docs/api.md, "Choosing a
  /// backend"): the fused kernels on the CPU, the composite path elsewhere
  /// (CUDA: composite softmax, chunked additive scores). Dot-product
  /// attention that draws no training dropout runs the flash kernel on the
  /// CPU (writing the weights when they are asked), and without weights
  /// LibTorch's scaled_dot_product_attention on CUDA (2.1+).
  kAuto,
  /// The book's formulation with ATen ops: the readable oracle.
  kComposite,
  /// The fused CPU kernels; an error for tensors on another device. For
  /// dot-product attention without training dropout, the flash kernel.
  kFused,
  /// Dot-product attention only: LibTorch's at::scaled_dot_product_attention
  /// (flash / memory-efficient / cuDNN on CUDA, flash on the CPU), with the
  /// same masking contract. It returns no attention weights, and its dropout
  /// draws from SDPA's own random stream. Needs LibTorch 2.1 or newer; other
  /// builds and other ops throw c10::Error.
  kSdpa,
};

/// The name of AttentionBackend in 0.2, kept for one minor version (it read
/// as a file path beside load_state_dict(module, path)).
using Path [[deprecated(
    "d2l::Path is now d2l::AttentionBackend (and the `path` options are `backend`)")]] =
    AttentionBackend;

/// "auto", "composite", "fused" or "sdpa".
std::string to_string(AttentionBackend backend);

/// What an attention call runs, and why not something faster: what
/// explain_path returns (docs/api.md, "Which path runs, and why").
struct PathExplanation {
  /// The function or module asked about, as its errors name it.
  std::string op;
  /// The backend asked for.
  AttentionBackend backend = AttentionBackend::kAuto;
  /// The path the call runs. Dot-product attention: "flash", "sdpa",
  /// "fused_softmax" or "composite"; multi-head attention: "small_heads" or
  /// its heads' dot-product path; additive attention: "fused_projections",
  /// "fused_values", "fused_scores", "chunked" or "composite".
  std::string path;
  /// Why each path faster than `path` was refused, fastest first, each as
  /// "<path>: <reason>"; empty when the fastest path for the device runs.
  std::vector<std::string> reasons;
  /// One line: "d2l::dot_product_attention (backend auto): fused_softmax;
  /// flash: ...".
  std::string to_string() const;
};

/// Instruction sets the fused CPU kernels are compiled for: generic C++
/// (what the compiler makes of it for the baseline x86-64), AVX2 + FMA (8
/// floats a vector), AVX-512 F/BW/VL/DQ (16 floats a vector), AVX-512
/// with AVX512-BF16, whose VDPBF16PS the bfloat16 flash kernel multiplies
/// with, and that with AMX tiles (TDPBF16PS, Intel Sapphire Rapids and
/// later), which the bfloat16 flash kernel's products then run on, where
/// Linux grants the process the tile state (docs/kernels.md, "bfloat16");
/// below kAvx512Bf16, bfloat16 inputs are widened to float. Each level
/// includes the ones before it, as oneDNN's ISA levels do.
enum class CpuIsa { kDefault, kAvx2, kAvx512, kAvx512Bf16, kAmxBf16 };

/// The instruction set the fused kernels run with in this process: the widest
/// one up to kAvx512Bf16 that both this CPU and this build of the library
/// have, unless the environment variable D2L_CPU_ISA (`default`, `avx2`,
/// `avx512`, `avx512_bf16` or `amx_bf16`) names another or set_cpu_isa chose
/// one. D2L_CPU_ISA is also the widest level the process may use, so that
/// a wider CPU runs as a narrower one would. A D2L_CPU_ISA that names no
/// level, or one this CPU or build cannot run, is a c10::Error naming it and
/// the levels at hand, from the first call that needs the level on.
/// kAmxBf16 is chosen where the CPU has AMX and Linux grants this process
/// its tile state, which the first call asks for (docs/kernels.md, "AMX").
CpuIsa cpu_isa();

/// Chooses the kernels' instruction set, e.g. to compare them; throws
/// c10::Error if this CPU or build cannot run `isa`, if D2L_CPU_ISA caps the
/// process below it, or if `isa` is no CpuIsa. Not thread-safe with respect
/// to kernels running at the same time.
void set_cpu_isa(CpuIsa isa);

/// Whether `isa` can run in this process: this CPU and build have it and
/// D2L_CPU_ISA, where set, is not below it (kDefault always can).
bool cpu_isa_available(CpuIsa isa);

/// "default", "avx2", "avx512", "avx512_bf16" or "amx_bf16".
std::string to_string(CpuIsa isa);

/// The CPU thread pools of this process (README, "Two thread pools").
///
/// At a given thread count the fused kernels return the same bits from call
/// to call, except the flash backward's dQ with more than one thread on its
/// block path (batch entries of more than 4 queries, or more than 12 where
/// the longest length is at most 64 keys) where there are few batch entries
/// for the threads (one sequence, say): its key blocks then add into it in the
/// order the threads get there. With LibTorch's deterministic algorithms on
/// (at::globalContext().setDeterministicAlgorithms(true, false);
/// torch.use_deterministic_algorithms(True) in Python) it too sums in a fixed
/// order, holding n × d more per extra thread (README, "Threads"). Results at
/// different thread counts agree within rounding.
struct CpuThreads {
  /// ATen's intra-op pool (OpenMP), which the fused kernels run on:
  /// at::get_num_threads().
  int64_t intra_op = 0;
  /// OpenBLAS's own pthread pool, where LibTorch's BLAS is OpenBLAS
  /// (Debian's libtorch with libopenblas0-pthread); 0 where this process has
  /// no OpenBLAS (PyPI's wheels use MKL, which runs on ATen's OpenMP pool and
  /// which at::set_num_threads sizes).
  int64_t openblas = 0;
  /// The BLAS this process calls, as found at run time (never inferred from
  /// the LibTorch version): "openblas" where OpenBLAS's controls are among
  /// the loaded libraries (Debian's libtorch 1.13 and 2.6), "mkl" where
  /// LibTorch was built with MKL (PyPI's wheels), else "other".
  std::string blas;
};

/// The pools' sizes now.
CpuThreads cpu_threads();

/// Sizes both pools consistently: ATen's intra-op pool to `threads`
/// (at::set_num_threads) and OpenBLAS's pool, where there is one, to
/// `openblas_threads`. The default, 1, keeps one pool of `threads` threads:
/// at::set_num_threads alone leaves OpenBLAS at OPENBLAS_NUM_THREADS or every
/// core, and on the same cores its workers and OpenMP's (which spin after
/// each parallel region) slow each other down, most at 2 threads. Returns
/// the sizes now in force. c10::Error for a count below 1. Like
/// at::set_num_threads, call it before the work, not while ops run.
CpuThreads set_num_threads(int64_t threads, int64_t openblas_threads = 1);

}  // namespace d2l
