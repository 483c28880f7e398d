# One precompiled header per build tree, made once by the object library
# d2l_pch and reused (REUSE_FROM) by every target of the tree: the LibTorch
# headers that our public headers use, and fmt. Not <torch/torch.h>: with
# GCC 12 a precompiled torch.h costs about as much to load as it saves
# parsing (measured: a test file 27.8 s with it, 27.1 s without), while this
# smaller set halves the library's files (masked_softmax.cpp 10.0 -> 5.3 s).
#
# GCC uses a precompiled header only where the compiler options match those
# it was made with, and where every macro it was made with is defined alike:
# so d2l_pch has no definitions of its own and no OpenMP (the few files that
# need -fopenmp skip the header, see src/CMakeLists.txt), and every reuser
# compiles as position-independent code, executables included (-fPIC).
# -Winvalid-pch (CMake's default) says so if a target's header goes unused.
if(D2L_USE_PCH)
  add_library(d2l_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/d2l_pch.cpp)
  set_target_properties(d2l_pch PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(d2l_pch PRIVATE ${TORCH_LIBRARIES} ${D2L_FMT_TARGET})
  # clang refuses a precompiled header made without the fuzzers' coverage
  # instrumentation in a file compiled with it (the fuzz preset).
  if(D2L_BUILD_FUZZERS)
    d2l_sanitize(d2l_pch FUZZ_COVERAGE)
  else()
    d2l_sanitize(d2l_pch)
  endif()
  target_precompile_headers(d2l_pch PRIVATE
    <torch/types.h>
    <torch/autograd.h>
    <torch/nn/module.h>
    <torch/nn/cloneable.h>
    <torch/nn/pimpl.h>
    <torch/nn/modules/linear.h>
    <torch/nn/modules/dropout.h>
    <torch/nn/modules/embedding.h>
    <torch/nn/modules/rnn.h>
    <fmt/format.h>)
endif()

# d2l_use_pch(<target>): <target> compiles with the tree's precompiled header.
function(d2l_use_pch target)
  if(NOT TARGET d2l_pch)
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM d2l_pch)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
endfunction()
