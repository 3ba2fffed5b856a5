# The consumer test: installs an already-built moat into a temporary prefix, then configures,
# builds and runs tests/consumer against it with nothing but CMAKE_PREFIX_PATH (plus, for a
# sanitized moat, the same compiler and -fsanitize flags). Fails on any failure.
#
#     cmake -DMOAT_BUILD_DIR=<moat build tree> -DWORK_DIR=<scratch directory>
#           [-DCXX_COMPILER=<moat's C++ compiler>] [-DSANITIZE=address,undefined]
#           -P run_consumer_test.cmake
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
# Optimised, as an embedder's application usually is: at -O0 every inline Asio function has one
# out-of-line copy, which hides translation units that disagree about Asio's configuration.
set(options -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=RelWithDebInfo)
if(CXX_COMPILER)
    list(APPEND options -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(SANITIZE)
    # A sanitized libmoat.a needs the sanitizer runtime: link it the way an embedder's sanitized
    # build does, by compiling and linking the application with the same -fsanitize flags.
    set(flags "-fsanitize=${SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all")
    list(APPEND options "-DCMAKE_CXX_FLAGS=${flags}" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run_step("configure" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${build} ${options})
run_step("build" ${CMAKE_COMMAND} --build ${build})
run_step("run" ${build}/moat_consumer)
