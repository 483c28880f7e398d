# Sanitizer and fuzzer instrumentation for this project's own targets (the
# library, the tests and the fuzz target); see CMakePresets.json and
# docs/reliability.md. Third-party code (libtorch, gtest, fmt) is used as
# installed: it runs uninstrumented, which ASan and UBSan tolerate and TSan
# mostly does (see tests/sanitizers/).
#
#   D2L_SANITIZE       "address,undefined", "thread", ... (empty: none)
#   D2L_BUILD_FUZZERS  also instrument the library for libFuzzer's coverage
set(D2L_SANITIZE "" CACHE STRING "Sanitizers for our targets, as -fsanitize= takes them")

if(D2L_SANITIZE AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "D2L_SANITIZE is set up for clang (the presets use clang++-14), "
                      "got ${CMAKE_CXX_COMPILER_ID}")
endif()
if(D2L_BUILD_FUZZERS AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "D2L_BUILD_FUZZERS needs clang's libFuzzer (use the fuzz preset)")
endif()

set(D2L_SANITIZE_COMPILE_OPTIONS "")
set(D2L_SANITIZE_LINK_OPTIONS "")
if(D2L_SANITIZE)
  list(APPEND D2L_SANITIZE_COMPILE_OPTIONS -fsanitize=${D2L_SANITIZE} -fno-omit-frame-pointer)
  list(APPEND D2L_SANITIZE_LINK_OPTIONS -fsanitize=${D2L_SANITIZE})
  # A UBSan report must fail the test that caused it, not scroll past.
  if(D2L_SANITIZE MATCHES "undefined")
    list(APPEND D2L_SANITIZE_COMPILE_OPTIONS -fno-sanitize-recover=undefined)
  endif()
endif()

# Instruments `target` with D2L_SANITIZE (and, with `FUZZ_COVERAGE`, the
# coverage libFuzzer steers by).
function(d2l_sanitize target)
  cmake_parse_arguments(arg "FUZZ_COVERAGE" "" "" ${ARGN})
  target_compile_options(${target} PRIVATE ${D2L_SANITIZE_COMPILE_OPTIONS})
  target_link_options(${target} PRIVATE ${D2L_SANITIZE_LINK_OPTIONS})
  if(arg_FUZZ_COVERAGE)
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()

# Executables built with sanitizers get the runtime options and suppression
# files of tests/sanitizers/ compiled in, so that they apply however the
# program is started (ctest, gtest_discover_tests at build time, by hand);
# the *SAN_OPTIONS environment variables still override them.
function(d2l_sanitizer_defaults target)
  if(D2L_SANITIZE)
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/sanitizers/default_options.cpp)
    target_compile_definitions(${target} PRIVATE
      D2L_SANITIZER_DIR="${PROJECT_SOURCE_DIR}/tests/sanitizers")
    set_source_files_properties(${PROJECT_SOURCE_DIR}/tests/sanitizers/default_options.cpp
      TARGET_DIRECTORY ${target} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
endfunction()
