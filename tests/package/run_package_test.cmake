# ctest driver for tests/package, the project outside this tree:
#   MODE=package       install the built library into a prefix, move the
#                      prefix elsewhere (a relocated install), check that no
#                      installed CMake or pkg-config file names this build's
#                      or source's folders, then find_package it, build the
#                      consumer and train_only (a program linking d2l::train
#                      alone) and run them;
#   MODE=subdirectory  add_subdirectory this source tree, check the parent's
#                      settings, build the consumer and train_only and run
#                      them; then install that build (static: the parent's
#                      untyped libraries are) and consume the installed
#                      static package the same way;
#   MODE=fetchcontent  FetchContent of a release tarball of this repository's
#                      HEAD (git archive, as make dist writes it: uncommitted
#                      changes are not in it) by URL and URL_HASH; check the
#                      parent's settings and build the parent's own library
#                      (the library's build is the subdirectory test's).
# The subproject builds use a build type of the parent's own (no optimisation
# flags: the point is the set-up, and the library compiles twice as fast) and
# leave d2l::viz and d2l::distributed out.
foreach(var MODE BUILD_DIR SOURCE_DIR PROJECT_DIR WORK_DIR GENERATOR PREFIX_PATH)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_package_test.cmake needs -D${var}=...")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

# An installed package must not name the folders it was built in.
function(check_no_build_paths prefix)
  file(GLOB_RECURSE files "${prefix}/*.cmake" "${prefix}/*.pc")
  foreach(file IN LISTS files)
    file(READ "${file}" text)
    # LibTorch's own folder is where LibTorch is (a wheel in the checkout's .venv/).
    if(TORCH_PREFIX)
      string(REPLACE "${TORCH_PREFIX}" "<LibTorch>" text "${text}")
    endif()
    foreach(path IN ITEMS "${BUILD_DIR}" "${PROJECT_DIR}" "${WORK_DIR}")
      string(FIND "${text}" "${path}" at)
      if(NOT at EQUAL -1)
        message(FATAL_ERROR "${file} names ${path}, a folder of the machine that built it")
      endif()
    endforeach()
  endforeach()
  list(LENGTH files count)
  if(count LESS 4)
    message(FATAL_ERROR "${prefix} holds ${count} CMake and pkg-config files; expected the package's")
  endif()
endfunction()

# Build and run the consumer and train_only in <dir>, configured with <args>.
function(build_and_run_consumer dir prefix_path)
  file(WRITE "${dir}-initial-cache.cmake"
       "set(CMAKE_PREFIX_PATH [[${prefix_path}]] CACHE STRING \"\")\n")
  run(${CMAKE_COMMAND} -C "${dir}-initial-cache.cmake" -S "${SOURCE_DIR}"
      -B "${dir}" -G "${GENERATOR}" ${ARGN})
  run(${CMAKE_COMMAND} --build "${dir}" --target consumer train_only)
  run("${dir}/consumer")
  run("${dir}/train_only" "${SOURCE_DIR}/../data/fra-eng-sample")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix_path "${PREFIX_PATH}")
set(args -DD2L_CONSUMER_MODE=${MODE})
# The library built from source (subdirectory, FetchContent) links the LibTorch
# libraries this build does (D2L_TORCH_CPU_ONLY: a CUDA wheel without its
# CUDA packages); the installed package's config says so itself.
if(TORCH_CPU_ONLY)
  list(APPEND args -DD2L_TORCH_CPU_ONLY=ON)
endif()
set(target consumer)
if(MODE STREQUAL "package")
  run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/installed")
  file(RENAME "${WORK_DIR}/installed" "${WORK_DIR}/moved")
  check_no_build_paths("${WORK_DIR}/moved")
  set(prefix_path "${WORK_DIR}/moved;${PREFIX_PATH}")
  list(APPEND args -DCMAKE_BUILD_TYPE=Release)
elseif(MODE STREQUAL "subdirectory")
  # The generic kernels only: the point is the set-up, and the vector copies
  # of the kernels are two thirds of the library's files.
  list(APPEND args -DD2L_ATTENTION_SOURCE=${PROJECT_DIR} -DCMAKE_BUILD_TYPE=Consumer
       -DD2L_BUILD_VIZ=OFF -DD2L_BUILD_DISTRIBUTED=OFF -DD2L_VECTOR_KERNELS=OFF)
  # A build without the vector kernels runs `default` only, and a D2L_CPU_ISA
  # naming a level it lacks is refused (docs/kernels.md): a leg that pins the
  # suite to avx2 (tests/debian13.sh) pins these programs to what they have.
  if(DEFINED ENV{D2L_CPU_ISA})
    set(ENV{D2L_CPU_ISA} default)
  endif()
elseif(MODE STREQUAL "fetchcontent")
  execute_process(COMMAND git -C "${PROJECT_DIR}" rev-parse --git-dir
                  RESULT_VARIABLE not_git OUTPUT_QUIET ERROR_QUIET)
  if(not_git)
    message(STATUS "SKIP: ${PROJECT_DIR} is not a git repository (a release tarball); "
                   "there is no HEAD to make a tarball of")
    return()
  endif()
  file(MAKE_DIRECTORY "${WORK_DIR}")
  run(git -C "${PROJECT_DIR}" archive --format=tar.gz --prefix=d2l_attention/
      -o "${WORK_DIR}/d2l_attention.tar.gz" HEAD)
  file(SHA256 "${WORK_DIR}/d2l_attention.tar.gz" tarball_sha256)
  # No build type at all: the case where a library that forces Release into
  # the cache is noticed.
  list(APPEND args -DD2L_ATTENTION_SOURCE=file://${WORK_DIR}/d2l_attention.tar.gz
       -DD2L_ATTENTION_SHA256=${tarball_sha256}
       -DD2L_BUILD_VIZ=OFF -DD2L_BUILD_DISTRIBUTED=OFF)
  set(target parent_untyped)
else()
  message(FATAL_ERROR "MODE must be package, subdirectory or fetchcontent, got '${MODE}'")
endif()
if(target STREQUAL "consumer")
  build_and_run_consumer("${WORK_DIR}/build" "${prefix_path}" ${args})
else()
  file(WRITE "${WORK_DIR}/initial-cache.cmake"
       "set(CMAKE_PREFIX_PATH [[${prefix_path}]] CACHE STRING \"\")\n")
  run(${CMAKE_COMMAND} -C "${WORK_DIR}/initial-cache.cmake" -S "${SOURCE_DIR}"
      -B "${WORK_DIR}/build" -G "${GENERATOR}" ${args})
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/build" --target ${target})
endif()

# The subproject's build is static (the parent's untyped default): install it
# (d2l's own install rules) and consume the installed static package, whose
# config brings fmt, OpenMP and zlib in.
if(MODE STREQUAL "subdirectory")
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/build" --prefix "${WORK_DIR}/static")
  file(GLOB static_libs "${WORK_DIR}/static/lib*/libd2l_attention.a"
                        "${WORK_DIR}/static/lib/*/libd2l_attention.a")
  file(GLOB shared_libs "${WORK_DIR}/static/lib*/libd2l_attention.so*"
                        "${WORK_DIR}/static/lib/*/libd2l_attention.so*")
  if(NOT static_libs OR shared_libs)
    message(FATAL_ERROR "the subproject's install holds '${static_libs}' and '${shared_libs}'; "
                        "expected libd2l_attention.a alone")
  endif()
  check_no_build_paths("${WORK_DIR}/static")
  build_and_run_consumer("${WORK_DIR}/static-consumer" "${WORK_DIR}/static;${PREFIX_PATH}"
                         -DD2L_CONSUMER_MODE=package -DCMAKE_BUILD_TYPE=Release)
endif()

# Passed: the consumer builds (the subproject's is a whole library build,
# 0.6 GB) are left only where a step failed, to be looked at.
file(REMOVE_RECURSE "${WORK_DIR}")
