# Run after a doctest suite links (tests/CMakeLists.txt, moat_discover_tests): lists the test
# cases that declared how they share the host, through doctest test suites, and writes a ctest
# script that gives each its ctest property. ctest runs the suite with as many jobs as cores; a
# test case that reads or disturbs host-wide state declares it (tests/support/host_sharing.hpp):
#   runs_alone  -> RUN_SERIAL: nothing else runs beside it (it depends on host-wide state that any
#                  other moat changes: records in the shared state directory, a janitor's sweep)
#   shares_host -> RESOURCE_LOCK host: never beside another such test (heavy load, a measured
#                  duration or throughput, a host-wide scan for something a peer also makes)
# Inputs: -D TEST_EXECUTABLE=... -D CTEST_FILE=...
set(script "")
foreach(suite_and_property "runs_alone;RUN_SERIAL;TRUE" "shares_host;RESOURCE_LOCK;host")
    list(GET suite_and_property 0 suite)
    list(GET suite_and_property 1 property)
    list(GET suite_and_property 2 value)
    execute_process(
        COMMAND "${TEST_EXECUTABLE}" --list-test-cases --test-suite=${suite} --no-version
        OUTPUT_VARIABLE output
        RESULT_VARIABLE result)
    if(NOT result EQUAL 0)
        message(FATAL_ERROR "${TEST_EXECUTABLE} --list-test-cases failed (${result}):\n${output}")
    endif()
    string(REPLACE "\n" ";" lines "${output}")
    foreach(line IN LISTS lines)
        if(line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^\\[doctest\\] ")
            continue()
        endif()
        if(line MATCHES "]==]")
            message(FATAL_ERROR "test name cannot be quoted for ctest: ${line}")
        endif()
        string(APPEND script
            "set_tests_properties([==[${line}]==] PROPERTIES ${property} ${value})\n")
    endforeach()
endforeach()
file(WRITE "${CTEST_FILE}" "${script}")
