// Go's names for Linux signals, as os.ProcessState.String() prints them ("signal: killed"):
// envd reports a process's end this way, so `moat serve` writes them and the e2b backend reads
// them. One table for both directions.
#pragma once

#include <string>
#include <string_view>

namespace moat::detail {

// "killed", "terminated", "segmentation fault", ...; "signal N" for a number Go has no name for.
std::string go_signal_name(int signal);

// The inverse: the number for a name go_signal_name gives (also "signal N", 1 <= N <= 64); 0 for
// anything else.
int signal_from_go_name(std::string_view name);

}  // namespace moat::detail
