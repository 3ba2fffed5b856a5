// How a test case shares the machine with the tests ctest runs beside it. ctest runs the suites
// with as many jobs as cores (scripts/test), so two test cases, of one executable or of two, may
// run at once. Most tests touch only what they made: their own sandboxes, cgroups, ports (port 0),
// labels and temporary directories. A test case that does not says so with one of these doctest
// decorators, and tests/cmake/host_sharing.cmake turns it into the ctest property:
//
//   TEST_CASE("..." * moat::test::runs_alone)   // RUN_SERIAL: nothing runs beside it
//   TEST_CASE("..." * moat::test::shares_host)  // RESOURCE_LOCK host: never beside another
//
// runs_alone: the test depends on host-wide state that any other moat changes as a matter of
// course: a record of a dead sandbox in the shared state directory (every backend's first create
// or list sweeps those), a janitor run over the whole host.
// shares_host: the test loads the machine (hundreds of sandboxes, a flood, a soak), measures or
// asserts a duration, throughput or RSS, or scans the whole host for something another such test
// also makes (a fixed label, a process name).
#pragma once

#include <doctest/doctest.h>

namespace moat::test {

inline const doctest::test_suite runs_alone("runs_alone");
inline const doctest::test_suite shares_host("shares_host");

}  // namespace moat::test
