#pragma once

// Included by every file of the library that opens parallel regions (calls
// at::parallel_for, or parallel_runs-inl.h's helpers). at::parallel_for is a
// template whose threads come from the including file's own compilation:
// in a file compiled without OpenMP (no _OPENMP, so no INTRA_OP_PARALLEL in
// ATen's headers) every call runs on the calling thread, silently. A beam's
// cache reorders ran so on one thread for that reason. src/CMakeLists.txt
// gives OpenMP to the files it lists, and defines D2L_OPENMP wherever it
// builds the library with OpenMP: there a file that includes this header
// and is not listed does not compile.

#include <ATen/Parallel.h>

#if defined(D2L_OPENMP) && !defined(_OPENMP)
#error "this file opens parallel regions: list it among src/CMakeLists.txt's OpenMP files"
#endif
