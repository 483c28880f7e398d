# Third-party packages. Each can be pointed elsewhere (see DEVICE notes in README):
#   Torch  - CMAKE_PREFIX_PATH=<libtorch or torch.utils.cmake_prefix_path>
#   fmt    - D2L_FMT_INCLUDE_DIR=<fmt/include> to use it header-only
#   GTest  - D2L_GTEST_SOURCE_DIR=<googletest sources>
include(D2LFindTorch)
d2l_find_torch(QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "d2l_attention needs LibTorch 1.13 or newer, and CMake found none (CMAKE_PREFIX_PATH: "
    "'${CMAKE_PREFIX_PATH}', Torch_DIR: '${Torch_DIR}'). Get one of:\n"
    "  1. Debian/Ubuntu: sudo apt install libtorch-dev (or make deps), then configure again;\n"
    "  2. PyPI: pip install torch, then -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch.utils; "
    "print(torch.utils.cmake_prefix_path)');\n"
    "  3. an official LibTorch archive (pytorch.org, C++/LibTorch), unpacked, then "
    "-DCMAKE_PREFIX_PATH=/path/to/libtorch.")
endif()
# Which LibTorch this is, in the configure output: with several on one machine
# (Debian's and a wheel's), the one found is the first question to ask.
if(TARGET torch)
  get_target_property(D2L_TORCH_LOCATION torch IMPORTED_LOCATION_RELEASE)
  if(NOT D2L_TORCH_LOCATION)
    get_target_property(D2L_TORCH_LOCATION torch IMPORTED_LOCATION)
  endif()
endif()
message(STATUS "d2l_attention: LibTorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX}, library ${D2L_TORCH_LOCATION})")
if(Torch_VERSION VERSION_LESS 1.13)
  message(FATAL_ERROR "d2l_attention needs LibTorch 1.13 or newer; found ${Torch_VERSION} at "
                      "${TORCH_INSTALL_PREFIX}")
endif()
# LibTorch 2.14's headers stop with '#error C++20 or later compatible compiler
# is required'; say so here rather than deep in a header.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.14 AND CMAKE_CXX_STANDARD LESS 20)
  message(FATAL_ERROR "LibTorch ${Torch_VERSION} needs C++20 (from 2.14 on), and this build "
                      "uses C++${CMAKE_CXX_STANDARD}: configure with -DCMAKE_CXX_STANDARD=20, or "
                      "use LibTorch 2.13 or older (tested: 1.13 and 2.11)")
endif()

# PyPI's torch wheels (2.x) ship fmt's headers in their include directory,
# which the compiler then finds before any other fmt: linking a system libfmt
# of another version against them fails. Use those headers header-only (which
# costs about 4 s of compile time a file). A LibTorch installed in the
# system's prefix (Debian's) shares the system's fmt headers: link libfmt.
if(NOT D2L_FMT_INCLUDE_DIR AND EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt/format.h"
   AND NOT TORCH_INSTALL_PREFIX MATCHES "^/usr(/local)?/?$")
  set(D2L_FMT_INCLUDE_DIR "${TORCH_INSTALL_PREFIX}/include")
  message(STATUS "d2l_attention: fmt from LibTorch's own headers, header-only")
endif()

if(D2L_FMT_INCLUDE_DIR)
  add_library(d2l_fmt_header_only INTERFACE)
  target_include_directories(d2l_fmt_header_only SYSTEM INTERFACE
                             "$<BUILD_INTERFACE:${D2L_FMT_INCLUDE_DIR}>")
  target_compile_definitions(d2l_fmt_header_only INTERFACE FMT_HEADER_ONLY=1)
  set(D2L_FMT_TARGET d2l_fmt_header_only)
else()
  find_package(fmt REQUIRED)
  set(D2L_FMT_TARGET fmt::fmt)
endif()

# Our own at::parallel_for regions run in parallel only when our files are
# compiled with OpenMP; find_package(Torch) does not add it.
find_package(OpenMP)

# libtorch may be built with the pre-C++11 ABI (Debian's is not, the pip
# wheels of 2.x are); follow whatever Torch says.
string(REGEX MATCH "-D_GLIBCXX_USE_CXX11_ABI=[01]" D2L_TORCH_ABI "${TORCH_CXX_FLAGS}")

# Imported targets are local to the directory that found them; a parent project
# that uses us through add_subdirectory links d2l::attention, whose interface
# names torch's targets, so they must be visible there too.
if(NOT PROJECT_IS_TOP_LEVEL)
  get_directory_property(D2L_IMPORTED_TARGETS IMPORTED_TARGETS)
  foreach(target IN LISTS D2L_IMPORTED_TARGETS)
    get_target_property(already_global ${target} IMPORTED_GLOBAL)
    if(NOT already_global)
      set_target_properties(${target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
