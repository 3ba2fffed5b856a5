// moat janitor [--dry-run]: cleans up what crashes left behind on this host
// (backend::async_janitor) and prints one line per action; --dry-run prints what it would do and
// changes nothing. Exits 0 when every action was carried out (or nothing was needed), exit_failure
// otherwise.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"

#include <unistd.h>

namespace moat::cli {
namespace {

asio::awaitable<int> clean_up(backend& b, bool dry_run) {
    auto actions = co_await b.async_janitor(dry_run);
    if (!actions) co_return report_error("janitor", actions.error());
    std::string out;
    int code = 0;
    std::size_t done = 0;
    for (const auto& a : *actions) {
        std::string status;
        if (dry_run) {
            status = a.action == "report" ? "found" : "would " + a.action;
        } else if (a.action == "report") {
            status = "found";
        } else if (a.done) {
            status = a.action + ": done";
            ++done;
        } else {
            status = a.action + ": FAILED (" + a.error + ")";
            code = exit_failure;
        }
        out += status + " " + a.target + ": " + a.reason + "\n";
    }
    if (actions->empty()) {
        out += "nothing to clean up\n";
    } else if (!dry_run) {
        out += std::to_string(done) + " of " + std::to_string(actions->size()) + " done\n";
    }
    write_all(STDOUT_FILENO, out);
    co_return code;
}

}  // namespace

int janitor_command(int argc, char** argv) {
    bool dry_run = false;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg != "--dry-run") throw usage_error("unexpected argument '" + std::string(arg) + "'");
        dry_run = true;
    }
    return run_with_backend([dry_run](backend& b) { return clean_up(b, dry_run); });
}

}  // namespace moat::cli
