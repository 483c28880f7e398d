# The platforms this project is built and tested on (README, "Platforms"):
# Linux on x86-64, with GCC 12 or newer or clang 14 or newer. Elsewhere the
# configure stops with one line instead of a compiler error deep inside a
# file. D2L_ALLOW_UNTESTED_PLATFORM=ON lets a Linux machine of another
# architecture (aarch64, ...) try: the kernels then build their generic
# copies only.
option(D2L_ALLOW_UNTESTED_PLATFORM
       "Configure on Linux with a processor or compiler this project does not test" OFF)

if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
  message(FATAL_ERROR "d2l_attention builds on Linux only (it uses sys/mman.h and dlfcn.h); "
                      "this is ${CMAKE_SYSTEM_NAME}: see README, \"Platforms\"")
endif()

set(D2L_PLATFORM_PROBLEM "")
if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(D2L_PLATFORM_PROBLEM "the processor is ${CMAKE_SYSTEM_PROCESSOR}, and only x86-64 is tested")
elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12)
  set(D2L_PLATFORM_PROBLEM "GCC ${CMAKE_CXX_COMPILER_VERSION} is older than the oldest tested (12)")
elseif(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
  set(D2L_PLATFORM_PROBLEM "clang ${CMAKE_CXX_COMPILER_VERSION} is older than the oldest tested (14)")
elseif(NOT CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$")
  set(D2L_PLATFORM_PROBLEM "the compiler is ${CMAKE_CXX_COMPILER_ID}, and only GCC and clang are tested")
endif()
if(D2L_PLATFORM_PROBLEM)
  if(D2L_ALLOW_UNTESTED_PLATFORM)
    message(WARNING "d2l_attention: ${D2L_PLATFORM_PROBLEM}; going on (D2L_ALLOW_UNTESTED_PLATFORM)")
  else()
    message(FATAL_ERROR "d2l_attention: ${D2L_PLATFORM_PROBLEM}; configure with "
                        "-DD2L_ALLOW_UNTESTED_PLATFORM=ON to try anyway (README, \"Platforms\")")
  endif()
endif()
