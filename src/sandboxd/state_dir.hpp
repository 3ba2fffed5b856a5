// The host state directory (/run/moat by default) that the helper and the raw isolation baseline
// (bench/raw_isolation.cpp) keep their template root in: made with its parents, mode 0711
// (searchable, not listable: each sandbox's setup runs as its own unprivileged host uid and must
// reach the read-only template inside), and reachable by others through every ancestor.
#pragma once

#include <string>

namespace moat::sandboxd {

// Makes `path` (absolute) and its missing parents (0700), then sets `path` to 0711. Returns 0,
// or an errno value with `detail` naming the step that failed; EACCES when an ancestor is not
// searchable by others (`detail` names it and the chmod that fixes it).
int prepare_state_dir(const std::string& path, std::string& detail);

}  // namespace moat::sandboxd
