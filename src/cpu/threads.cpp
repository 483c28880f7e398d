// d2l::cpu_threads and d2l::set_num_threads (backend.h): ATen's intra-op
// pool, and OpenBLAS's own pool where LibTorch's BLAS is OpenBLAS.

#include <d2l/backend.h>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <limits>

namespace d2l {

namespace {

// Which BLAS LibTorch calls is the build's choice (Debian's libtorch, 1.13 as
// 2.6: the libblas.so.3 alternative, OpenBLAS with libopenblas0-pthread;
// PyPI's wheels: MKL, linked in), so OpenBLAS's controls are looked up at run
// time among the libraries this process loaded.
struct OpenBlas {
  void (*set)(int) = nullptr;
  int (*get)() = nullptr;
};

const OpenBlas& openblas() {
  static const OpenBlas found = [] {
    OpenBlas o;
    o.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    o.get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    if (!o.set || !o.get) o = OpenBlas{};
    return o;
  }();
  return found;
}

void check_count(const char* arg, int64_t count) {
  TORCH_CHECK(count >= 1 && count <= std::numeric_limits<int>::max(), "d2l::set_num_threads: ",
              arg, " must be at least 1 (and fit an int), got ", count);
}

}  // namespace

CpuThreads cpu_threads() {
  CpuThreads t;
  t.intra_op = at::get_num_threads();
  if (const auto& blas = openblas(); blas.get) t.openblas = blas.get();
  t.blas = openblas().get ? "openblas" : at::hasMKL() ? "mkl" : "other";
  return t;
}

CpuThreads set_num_threads(int64_t threads, int64_t openblas_threads) {
  check_count("threads", threads);
  check_count("openblas_threads", openblas_threads);
  at::set_num_threads(static_cast<int>(threads));
  if (const auto& blas = openblas(); blas.set) blas.set(static_cast<int>(openblas_threads));
  return cpu_threads();
}

}  // namespace d2l
