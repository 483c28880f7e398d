# ctest driver: CTest's BUILD_TESTING switch, as packagers pass it, decides
# whether the suite and the examples are built, and D2L_BUILD_TESTS still
# decides alone. Configures PROJECT_DIR into WORK_DIR three times:
#   -DBUILD_TESTING=OFF                  no d2l_tests, no example targets
#   then -DBUILD_TESTING=ON              both back
#   then -DD2L_BUILD_TESTS=OFF           no d2l_tests, examples kept
foreach(var PROJECT_DIR WORK_DIR GENERATOR PREFIX_PATH)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "build_testing_switch.cmake needs -D${var}=...")
  endif()
endforeach()
if(NOT TORCH_CPU_ONLY)
  set(TORCH_CPU_ONLY OFF)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")

# Configures with ARGN; `tests` and `examples` say whether d2l_tests and the
# attention_scoring example must be targets of the result.
function(configure_and_expect tests examples)
  execute_process(COMMAND ${CMAKE_COMMAND} -S "${PROJECT_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
                          "-DCMAKE_PREFIX_PATH=${PREFIX_PATH}" -DD2L_BUILD_DISTRIBUTED=OFF
                          -DD2L_TORCH_CPU_ONLY=${TORCH_CPU_ONLY} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configure with ${ARGN} failed (${rc})")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}" --target help
                  OUTPUT_VARIABLE targets RESULT_VARIABLE rc)
  foreach(pair IN ITEMS "d2l_tests:${tests}" "attention_scoring:${examples}")
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 target)
    list(GET pair 1 wanted)
    string(REGEX MATCH "(^|\n)${target}[: ]" found "${targets}")
    if(wanted AND NOT found)
      message(FATAL_ERROR "after configuring with ${ARGN}: no ${target} target")
    elseif(NOT wanted AND found)
      message(FATAL_ERROR "after configuring with ${ARGN}: ${target} is still a target")
    endif()
  endforeach()
  message(STATUS "${ARGN}: d2l_tests ${tests}, examples ${examples}")
endfunction()

configure_and_expect(OFF OFF -DBUILD_TESTING=OFF)
configure_and_expect(ON ON -DBUILD_TESTING=ON)
configure_and_expect(OFF ON -DD2L_BUILD_TESTS=OFF)
file(REMOVE_RECURSE "${WORK_DIR}")
