# The consumer test: installs an already-built moat into a temporary prefix, then configures,
# builds and runs tests/consumer against it with nothing but CMAKE_PREFIX_PATH. Fails on any
# failure.
#
#     cmake -DMOAT_BUILD_DIR=<moat build tree> -DWORK_DIR=<scratch directory> -P run_consumer_test.cmake
foreach(variable MOAT_BUILD_DIR WORK_DIR)
    if(NOT ${variable})
        message(FATAL_ERROR "run_consumer_test.cmake: -D${variable}=... is required")
    endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step name)
    message(STATUS "consumer test: ${name}")
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE outcome TIMEOUT 240)
    if(NOT outcome STREQUAL "0")
        message(FATAL_ERROR "consumer test: ${name} failed (${outcome})")
    endif()
endfunction()

run_step("install" ${CMAKE_COMMAND} --install ${MOAT_BUILD_DIR} --prefix ${prefix})
run_step("configure" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${build}
         -DCMAKE_PREFIX_PATH=${prefix})
run_step("build" ${CMAKE_COMMAND} --build ${build})
run_step("run" ${build}/moat_consumer)
