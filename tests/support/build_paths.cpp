#include "support/build_paths.hpp"

namespace moat::test {

const char* moat_cli_path() {
    return MOAT_CLI_PATH;
}

const char* session_worker_path() {
    return MOAT_SESSION_WORKER_PATH;
}

const std::string& source_dir() {
    static const std::string dir = MOAT_SOURCE_DIR;
    return dir;
}

}  // namespace moat::test
