# d2l_add_gtest_suites(<target> [FILTER <gtest filter>] [SLOW <regex>] [TIMEOUT <s>]
#                      [ENVIRONMENT <VAR=value>...]):
# one ctest test per GoogleTest suite of <target>, rather than one per test
# case as gtest_discover_tests makes them. Each test is a process, and each
# process of a LibTorch program spends about a second loading LibTorch before
# its first test: the suite's 480 cases cost 4 minutes of that alone.
#
# The suites are listed when ctest starts (the binary's --gtest_list_tests,
# narrowed by FILTER), so a rebuilt binary's suites are always the ones run.
# Every ctest test names its cases exactly in --gtest_filter and writes
# gtest's XML report to <build>/gtest-reports/<name>.xml, which
# tests/gtest_summary.py adds up case by case (passed, failed, skipped).
#
# Labels: `slow` where the suite's name matches SLOW, `fast` otherwise;
# `distributed` for the Distributed suites; a suite's cases with Cuda or CUDA
# in their names form a test of their own, `<suite>.cuda`, labelled `cuda`.
# COST is the number of cases, so that ctest starts the big suites first;
# a suite of more than MAX_CASES (16) cases runs in parts, round robin.
function(d2l_add_gtest_suites target)
  cmake_parse_arguments(arg "" "FILTER;SLOW;TIMEOUT;MAX_CASES" "ENVIRONMENT" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 900)
  endif()
  if(NOT arg_MAX_CASES)
    set(arg_MAX_CASES 16)
  endif()
  set(script "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  file(GENERATE OUTPUT "${script}" CONTENT
"set(D2L_GTEST_TARGET [[${target}]])
set(D2L_GTEST_EXE [[$<TARGET_FILE:${target}>]])
set(D2L_GTEST_FILTER [[${arg_FILTER}]])
set(D2L_GTEST_SLOW [[${arg_SLOW}]])
set(D2L_GTEST_TIMEOUT [[${arg_TIMEOUT}]])
set(D2L_GTEST_MAX_CASES [[${arg_MAX_CASES}]])
set(D2L_GTEST_ENVIRONMENT [[${arg_ENVIRONMENT}]])
set(D2L_GTEST_REPORTS [[${PROJECT_BINARY_DIR}/gtest-reports]])
set(D2L_GTEST_WORKING_DIRECTORY [[${CMAKE_CURRENT_BINARY_DIR}]])
include([[${PROJECT_SOURCE_DIR}/cmake/D2LGTestSuitesAtTestTime.cmake]])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
endfunction()
