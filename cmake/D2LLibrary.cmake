# d2l_add_library(<target> <export name> <sources>...): a library of this
# project, set up the one way: alias d2l::<export name>, version, public
# headers from include/ (build and install), private headers from its own
# folder, fmt kept private, warnings, sanitizers (coverage for the fuzzers)
# and the build tree's precompiled header.
# Every 0.x minor version changes the API and ABI, so the SONAME carries it
# (libd2l_attention.so.0.3); from 1.0 on, the major version alone. The
# runtime package's name follows it (cmake/D2LPackaging.cmake).
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(D2L_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
else()
  set(D2L_SOVERSION ${PROJECT_VERSION_MAJOR})
endif()

function(d2l_add_library target export_name)
  if(D2L_BUILD_SHARED)
    add_library(${target} SHARED ${ARGN})
  else()
    add_library(${target} STATIC ${ARGN})
  endif()
  add_library(d2l::${export_name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES
    VERSION ${PROJECT_VERSION} SOVERSION ${D2L_SOVERSION}
    POSITION_INDEPENDENT_CODE ON
    EXPORT_NAME ${export_name})
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:${D2L_FMT_TARGET}>)
  if(NOT D2L_FMT_INCLUDE_DIR AND NOT D2L_BUILD_SHARED)
    target_link_libraries(${target} PRIVATE $<INSTALL_INTERFACE:fmt::fmt>)
  endif()
  # -Wno-psabi: GCC notes that passing 32- and 64-byte vectors by value
  # changed ABI in GCC 4.6; the kernels' inline vector helpers never cross
  # a library boundary, so the note says nothing to a user building us.
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<CXX_COMPILER_ID:GNU>:-Wno-psabi>)
  if(D2L_BUILD_FUZZERS)
    d2l_sanitize(${target} FUZZ_COVERAGE)
  else()
    d2l_sanitize(${target})
  endif()
  d2l_use_pch(${target})
  # Files with options of their own (OpenMP, the kernels' -m flags) stay out
  # of the batches, as CMake leaves them.
  if(D2L_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()
