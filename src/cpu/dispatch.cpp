// Which instruction set the CPU kernels run with (d2l::cpu_isa), and the
// kernel tables of that set (Note [CPU kernels per instruction set]).

#include <d2l/backend.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define D2L_AMX_PROBE 1
#endif

#include "cpu/additive_attention_kernel.h"
#include "cpu/dispatch.h"
#include "cpu/dot_product_attention_kernel.h"
#include "cpu/few_rows_linear_kernel.h"
#include "cpu/masked_softmax_kernel.h"
#include "cpu/multi_head_attention_kernel.h"
#include "cpu/packed_linear_kernel.h"

namespace d2l {
namespace {

bool avx2_runnable() {
#if defined(D2L_HAVE_AVX2_KERNELS) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The subsets ATen's AVX512 Vectorized<T> uses (vec512/*.h).
bool avx512_runnable() {
#if defined(D2L_HAVE_AVX512_KERNELS) && (defined(__GNUC__) || defined(__clang__))
  return avx2_runnable() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

// AVX-512 and AVX512-BF16 (VDPBF16PS, VCVTNE2PS2BF16): the bfloat16 flash
// kernel's (Note [bfloat16 flash attention]).
bool avx512_bf16_runnable() {
#if defined(D2L_HAVE_AVX512_BF16_KERNELS) && (defined(__GNUC__) || defined(__clang__))
  return avx512_runnable() && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// AMX for bfloat16 (TDPBF16PS on tiles): what the CPU says (CPUID leaf 7:
// AMX-TILE and AMX-BF16).
[[maybe_unused]] bool cpu_has_amx_bf16() {
  static const bool has = [] {
#ifdef D2L_AMX_PROBE
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (edx >> 24 & 1) != 0 &&
           (edx >> 22 & 1) != 0;
#else
    return false;
#endif
  }();
  return has;
}

// Whether Linux lets this process use the tile data, which it enables per
// process on request (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16 and later;
// sandboxes and older kernels refuse it, and a tile instruction without it
// is SIGILL). Asked once, and only when something asks for amx_bf16: the
// grant enlarges every signal frame of the process.
struct AmxPermission {
  bool granted = false;
  std::string refusal;  // why not
};
std::atomic<bool> amx_permission_asked{false};

[[maybe_unused]] const AmxPermission& amx_permission() {
  static const AmxPermission permission = [] {
    AmxPermission p;
#ifdef D2L_AMX_PROBE
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
      p.granted = true;
    } else {
      p.refusal = fmt::format(
          "Linux refused this process the AMX tile state (arch_prctl(ARCH_REQ_XCOMP_PERM): {})",
          std::strerror(errno));
    }
#endif
    amx_permission_asked.store(true, std::memory_order_release);
    return p;
  }();
  return permission;
}

// The bfloat16 flash kernel on AMX tiles: built, and the CPU's tiles granted
// (or, in a test build, modelled in software: D2L_AMX_SOFTWARE_TILES).
bool amx_bf16_runnable() {
#if defined(D2L_HAVE_AMX_BF16_KERNELS) && defined(D2L_AMX_SOFTWARE_TILES)
  return avx512_bf16_runnable();
#elif defined(D2L_HAVE_AMX_BF16_KERNELS)
  return avx512_bf16_runnable() && cpu_has_amx_bf16() && amx_permission().granted;
#else
  return false;
#endif
}

constexpr CpuIsa kAllIsas[] = {CpuIsa::kDefault, CpuIsa::kAvx2, CpuIsa::kAvx512,
                               CpuIsa::kAvx512Bf16, CpuIsa::kAmxBf16};

bool is_known(CpuIsa isa) {
  return std::find(std::begin(kAllIsas), std::end(kAllIsas), isa) != std::end(kAllIsas);
}

// Whether this CPU and build run `isa`, whatever D2L_CPU_ISA says.
bool runnable(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kDefault: return true;
    case CpuIsa::kAvx2: return avx2_runnable();
    case CpuIsa::kAvx512: return avx512_runnable();
    case CpuIsa::kAvx512Bf16: return avx512_bf16_runnable();
    case CpuIsa::kAmxBf16: return amx_bf16_runnable();
  }
  return false;  // not a level (an integer cast to CpuIsa)
}

// "default, avx2": the levels this CPU and build run.
std::string runnable_levels() {
  std::string out;
  for (const auto isa : kAllIsas) {
    if (runnable(isa)) out += (out.empty() ? "" : ", ") + to_string(isa);
  }
  return out;
}

// D2L_CPU_ISA's level, the widest this process may use (as oneDNN's
// ONEDNN_MAX_CPU_ISA): read once; unset, no cap. A refused value throws
// here, on the first call that needs it, and again on every later one.
struct Pin {
  bool set = false;
  CpuIsa level = CpuIsa::kAmxBf16;
};
const Pin& pin() {
  static const Pin p = [] {
    const char* value = std::getenv("D2L_CPU_ISA");
    if (value == nullptr || *value == '\0') return Pin{};
    return Pin{true, cpu::isa_from_environment(value)};
  }();
  return p;
}

// The level chosen, or -1 until the first call resolves it.
std::atomic<int> chosen_isa{-1};

}  // namespace

namespace cpu {

CpuIsa isa_from_environment(const char* value) {
  if (value == nullptr || *value == '\0') {
    // The widest: amx_bf16 where the CPU has AMX and Linux grants this
    // process its tiles (asked here, once), except in a test build that
    // models the tiles in software, which runs them only when asked for.
#if defined(D2L_AMX_SOFTWARE_TILES)
    constexpr bool amx_by_default = false;
#else
    constexpr bool amx_by_default = true;
#endif
    if (amx_by_default && runnable(CpuIsa::kAmxBf16)) return CpuIsa::kAmxBf16;
    for (const auto isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2}) {
      if (runnable(isa)) return isa;
    }
    return CpuIsa::kDefault;
  }
  for (const auto isa : kAllIsas) {
    if (to_string(isa) != value) continue;
    TORCH_CHECK(runnable(isa), "d2l: D2L_CPU_ISA=", value, " asks for the ", value,
                " kernels, which cannot run here: this CPU and build run ", runnable_levels(),
                " (name one of them, or unset D2L_CPU_ISA for the widest)");
    return isa;
  }
  TORCH_CHECK(false, "d2l: D2L_CPU_ISA=", value,
              " names no instruction set: default, avx2, avx512, avx512_bf16 or amx_bf16 (this "
              "CPU and build run ",
              runnable_levels(), ")");
}

bool isa_runnable_on_this_cpu(CpuIsa isa) { return runnable(isa); }

}  // namespace cpu

CpuIsa cpu_isa() {
  int isa = chosen_isa.load(std::memory_order_relaxed);
  if (isa < 0) {
    isa = static_cast<int>(pin().set ? pin().level : cpu::isa_from_environment(nullptr));
    int unresolved = -1;
    if (!chosen_isa.compare_exchange_strong(unresolved, isa, std::memory_order_relaxed)) {
      isa = unresolved;  // set_cpu_isa, or another thread, came first
    }
  }
  return static_cast<CpuIsa>(isa);
}

bool cpu_isa_available(CpuIsa isa) { return runnable(isa) && isa <= pin().level; }

void set_cpu_isa(CpuIsa isa) {
  TORCH_CHECK(is_known(isa), "d2l::set_cpu_isa: ", static_cast<int>(isa),
              " is not a CpuIsa; this CPU and build run ", runnable_levels());
  if (cpu_isa_available(isa)) {
    chosen_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
    return;
  }
  TORCH_CHECK(!runnable(isa), "d2l::set_cpu_isa: ", to_string(isa),
              " kernels cannot run here: D2L_CPU_ISA=", to_string(pin().level),
              " caps this process at ", to_string(pin().level),
              " (unset it to choose wider levels; this CPU and build run ", runnable_levels(), ")");
  // A CPU with AMX whose tile state Linux refused: say that, not "lacks".
  const bool refused = isa == CpuIsa::kAmxBf16 && cpu_has_amx_bf16() &&
                       amx_permission_asked.load(std::memory_order_acquire) &&
                       !amx_permission().granted;
  TORCH_CHECK(!refused, fmt::format("d2l::set_cpu_isa: amx_bf16 kernels cannot run here: {}",
                                    amx_permission().refusal));
  TORCH_CHECK(false,
              fmt::format("d2l::set_cpu_isa: {} kernels cannot run here (the CPU lacks the "
                          "instructions or the library was built without that variant); this "
                          "CPU and build run {}",
                          to_string(isa), runnable_levels()));
}

std::string to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
    case CpuIsa::kAmxBf16: return "amx_bf16";
    default: return "default";
  }
}

namespace cpu {
namespace {

// The table of `isa` among the compiled variants (nullptr: not built). The
// float kernels of kAvx512Bf16 are the AVX-512 ones.
template <typename Table>
const Table& pick(const Table& (*default_table)(), const Table& (*avx2)(),
                  const Table& (*avx512)()) {
  const CpuIsa isa = cpu_isa();
  if (isa >= CpuIsa::kAvx512 && avx512 != nullptr) return avx512();
  if (isa == CpuIsa::kAvx2 && avx2 != nullptr) return avx2();
  return default_table();
}

}  // namespace

#ifdef D2L_HAVE_AVX2_KERNELS
#define D2L_AVX2(getter) &AVX2::getter
#else
#define D2L_AVX2(getter) nullptr
#endif
#ifdef D2L_HAVE_AVX512_KERNELS
#define D2L_AVX512(getter) &AVX512::getter
#else
#define D2L_AVX512(getter) nullptr
#endif
#define D2L_DEFINE_CPU_DISPATCH(Table, getter)                                  \
  const Table& getter() {                                                       \
    return pick<Table>(&DEFAULT::getter, D2L_AVX2(getter), D2L_AVX512(getter)); \
  }

D2L_DEFINE_CPU_DISPATCH(MaskedSoftmaxKernels, masked_softmax_kernels)
D2L_DEFINE_CPU_DISPATCH(AdditiveAttentionKernels, additive_attention_kernels)
D2L_DEFINE_CPU_DISPATCH(DotProductAttentionKernels, dot_product_attention_kernels)
D2L_DEFINE_CPU_DISPATCH(MultiHeadAttentionKernels, multi_head_attention_kernels)
D2L_DEFINE_CPU_DISPATCH(FewRowsLinearKernels, few_rows_linear_kernels)
D2L_DEFINE_CPU_DISPATCH(PackedLinearKernels, packed_linear_kernels)

std::string amx_unused_reason() {
  if (cpu_isa() == CpuIsa::kAmxBf16) return {};
#if defined(D2L_HAVE_AMX_BF16_KERNELS) && defined(D2L_AMX_SOFTWARE_TILES)
  const bool cpu_has = avx512_bf16_runnable();  // the model stands for the tiles
#else
  const bool cpu_has = cpu_has_amx_bf16();
#endif
  if (!cpu_has) return {};
#if !defined(D2L_HAVE_AMX_BF16_KERNELS)
  return "this build of the library has no AMX kernel (the compiler did not take -mamx-tile "
         "-mamx-bf16)";
#else
  if (amx_permission_asked.load(std::memory_order_acquire) && !amx_permission().granted) {
    return amx_permission().refusal;
  }
#if defined(D2L_AMX_SOFTWARE_TILES)
  return fmt::format(
      "the kernels' instruction set is {} (this test build models the tiles in software and "
      "runs them when asked for: D2L_CPU_ISA=amx_bf16 or "
      "d2l::set_cpu_isa(d2l::CpuIsa::kAmxBf16))",
      to_string(cpu_isa()));
#else
  return fmt::format(
      "the kernels' instruction set is {} (D2L_CPU_ISA or d2l::set_cpu_isa chose it; at "
      "amx_bf16 the products run on the tiles)",
      to_string(cpu_isa()));
#endif
#endif
}

const DotProductAttentionBf16Kernels* dot_product_attention_bf16_kernels() {
#ifdef D2L_HAVE_AMX_BF16_KERNELS
  if (cpu_isa() >= CpuIsa::kAmxBf16) return &AMX_BF16::dot_product_attention_bf16_kernels();
#endif
#ifdef D2L_HAVE_AVX512_BF16_KERNELS
  if (cpu_isa() >= CpuIsa::kAvx512Bf16) return &AVX512_BF16::dot_product_attention_bf16_kernels();
#endif
  return nullptr;
}

}  // namespace cpu
}  // namespace d2l
