// Where this build put the programs the tests run, and where the sources are. These are absolute
// paths of one clone: they are compiled into build_paths.cpp alone, so that every other test file
// compiles the same in any clone (and is a compiler-cache hit there;
// cmake/MoatCompilerCache.cmake).
#pragma once

#include <string>

namespace moat::test {

// The built `moat` CLI.
const char* moat_cli_path();

// The built minimal session worker (tests/session_worker.cpp).
const char* session_worker_path();

// The top of the source tree (the clone).
const std::string& source_dir();

}  // namespace moat::test
