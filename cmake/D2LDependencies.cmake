# Third-party packages. Each can be pointed elsewhere (see DEVICE notes in README):
#   Torch  - CMAKE_PREFIX_PATH=<libtorch or torch.utils.cmake_prefix_path>
#   fmt    - D2L_FMT_INCLUDE_DIR=<fmt/include> to use it header-only
#   GTest  - D2L_GTEST_SOURCE_DIR=<googletest sources>
find_package(Torch REQUIRED)

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
