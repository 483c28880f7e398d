# ctest driver: install the built library into a staging prefix, then
# configure, build and run the consumer against it with find_package.
foreach(var BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR PREFIX_PATH)
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
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
# The prefix path is a list; an initial-cache script keeps it one value (on
# the command line execute_process would split it into arguments).
file(WRITE "${WORK_DIR}/initial-cache.cmake"
     "set(CMAKE_PREFIX_PATH [[${WORK_DIR}/prefix;${PREFIX_PATH}]] CACHE STRING \"\")\n")
run(${CMAKE_COMMAND} -C "${WORK_DIR}/initial-cache.cmake" -S "${SOURCE_DIR}"
    -B "${WORK_DIR}/build" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
