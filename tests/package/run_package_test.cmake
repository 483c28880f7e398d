# ctest driver for tests/package, the project outside this tree:
#   MODE=package       install the built library into a staging prefix, then
#                      find_package it, build the consumer and train_only (a
#                      program linking d2l::train alone) and run them;
#   MODE=subdirectory  add_subdirectory this source tree, check the parent's
#                      settings, build the consumer and train_only and run them;
#   MODE=fetchcontent  FetchContent from this repository's git URL (a local
#                      one: no network) at its HEAD, so uncommitted changes are
#                      not in it; check the parent's settings and build the
#                      parent's own library (the library's build is the
#                      subdirectory test's).
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

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix_path "${PREFIX_PATH}")
set(args -DD2L_CONSUMER_MODE=${MODE})
set(target consumer)
if(MODE STREQUAL "package")
  run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
  set(prefix_path "${WORK_DIR}/prefix;${PREFIX_PATH}")
  list(APPEND args -DCMAKE_BUILD_TYPE=Release)
elseif(MODE STREQUAL "subdirectory")
  # The generic kernels only: the point is the set-up, and the vector copies
  # of the kernels are two thirds of the library's files.
  list(APPEND args -DD2L_ATTENTION_SOURCE=${PROJECT_DIR} -DCMAKE_BUILD_TYPE=Consumer
       -DD2L_BUILD_VIZ=OFF -DD2L_BUILD_DISTRIBUTED=OFF -DD2L_VECTOR_KERNELS=OFF)
elseif(MODE STREQUAL "fetchcontent")
  execute_process(COMMAND git -C "${PROJECT_DIR}" rev-parse --git-dir
                  RESULT_VARIABLE not_git OUTPUT_QUIET ERROR_QUIET)
  if(not_git)
    message(STATUS "SKIP: ${PROJECT_DIR} is not a git repository; nothing to fetch")
    return()
  endif()
  # No build type at all: the case where a library that forces Release into
  # the cache is noticed.
  list(APPEND args -DD2L_ATTENTION_SOURCE=file://${PROJECT_DIR}
       -DD2L_BUILD_VIZ=OFF -DD2L_BUILD_DISTRIBUTED=OFF)
  set(target parent_untyped)
else()
  message(FATAL_ERROR "MODE must be package, subdirectory or fetchcontent, got '${MODE}'")
endif()
# The prefix path is a list; an initial-cache script keeps it one value (on
# the command line execute_process would split it into arguments).
file(WRITE "${WORK_DIR}/initial-cache.cmake"
     "set(CMAKE_PREFIX_PATH [[${prefix_path}]] CACHE STRING \"\")\n")
run(${CMAKE_COMMAND} -C "${WORK_DIR}/initial-cache.cmake" -S "${SOURCE_DIR}"
    -B "${WORK_DIR}/build" -G "${GENERATOR}" ${args})
if(target STREQUAL "consumer")
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/build" --target consumer train_only)
  run("${WORK_DIR}/build/consumer")
  run("${WORK_DIR}/build/train_only" "${SOURCE_DIR}/../data/fra-eng-sample")
else()
  run(${CMAKE_COMMAND} --build "${WORK_DIR}/build" --target ${target})
endif()
