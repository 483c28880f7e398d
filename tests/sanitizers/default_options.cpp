// Default runtime options of the sanitizers, compiled into this project's
// sanitizer-built executables (see cmake/D2LSanitizers.cmake) so that they
// hold however the program starts; ASAN_OPTIONS and the like override them.

#define D2L_SANITIZER_HOOK extern "C" __attribute__((visibility("default"), used))

D2L_SANITIZER_HOOK const char* __asan_default_options() {
  return "check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1";
}

D2L_SANITIZER_HOOK const char* __ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}

D2L_SANITIZER_HOOK const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1";
}

// One suppression, for LibTorch rather than us: LibTorch 2.11's archive reader
// leaks its miniz reader state (152 bytes, allocated in mz_zip_reader_init)
// when torch::load refuses a file that is not a zip archive
// (SerializationErrors.NotAnArchive, ASan on the wheel; 1.13 does not leak).
D2L_SANITIZER_HOOK const char* __lsan_default_suppressions() {
  return "leak:mz_zip_reader_init\n";
}

// One suppression, for LibTorch's autograd rather than us (pytorch/pytorch
// issues 58442 and 67653, open): each autograd node built on a shared leaf
// (a module's weight, with forward called from several threads) marks the
// leaf's one AccumulateGrad node as having a parent in
// Node::topological_nr, a plain bool written without synchronisation. ATen's
// own autograd nodes do the same inside libtorch, which is not built with
// TSan and so goes unseen; an autograd function of ours instantiates that
// header code in our instrumented library, and AdditiveProjectedFunction
// takes the module's weights as inputs
// (ReliabilityConcurrency.SharedAdditiveAttention*).
D2L_SANITIZER_HOOK const char* __tsan_default_suppressions() {
  return "race:topological_nr\n";
}
