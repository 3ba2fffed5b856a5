// The `moat bench` runs beyond single creates (the create bench is in bench_command.cpp):
//
//   sweep     creates in flight 1, 2, 4, 8, 16, 64: throughput and tail at each level
//   memory    N idle sandboxes held at once: host-side and kernel-side memory per sandbox, and
//             the live pid-1 processes counted in /proc
//   pool      warm hand-out latency through session_manager::async_take_warm
//   hostsize  create latency while this process holds 2 GiB resident and 8 extra threads,
//             against the same run without them
//
// Each takes one count flag (--n, or --count for memory) among the arguments after its name.
#pragma once

#include <optional>
#include <string_view>

namespace moat::cli {

// Runs the fleet bench named `what` with the arguments after its name: its exit code, or
// nullopt when `what` names none of them.
std::optional<int> bench_fleet(std::string_view what, int argc, char** argv);

}  // namespace moat::cli
