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
