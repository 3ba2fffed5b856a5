#include "cli/stderr_log.hpp"

#include <moat/log.hpp>

#include "cli/terminal_safe.hpp"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

namespace moat::cli {

namespace {

// The least level MOAT_LOG lets through, as a rank of log_level; past error for "off".
std::optional<int> level_rank(std::string_view name) {
    for (const log_level level :
         {log_level::debug, log_level::info, log_level::warning, log_level::error}) {
        if (name == to_string(level)) return static_cast<int>(level);
    }
    if (name == "off") return static_cast<int>(log_level::error) + 1;
    return std::nullopt;
}

int rank_of(log_level level) {
    return static_cast<int>(level);
}

}  // namespace

void install_stderr_log(std::string_view command) {
    const char* env = std::getenv("MOAT_LOG");
    const std::string_view wanted = env != nullptr && *env != '\0' ? env : "warning";
    const auto least = level_rank(wanted);
    if (!least) {
        std::fprintf(stderr,
                     "moat %.*s: MOAT_LOG must be debug, info, warning, error or off, not '%s'\n",
                     static_cast<int>(command.size()), command.data(),
                     terminal_safe().filter(wanted).c_str());
        std::exit(2);
    }
    if (*least > rank_of(log_level::error)) {
        set_log_sink({});
        return;
    }
    set_log_sink([prefix = "moat " + std::string(command), least = *least](const log_record& r) {
        if (rank_of(r.level) < least) return;
        std::string line =
            prefix + ": " + to_string(r.level) + " [" + std::string(r.component) + "]";
        if (!r.sandbox_id.empty()) line += " sandbox " + std::string(r.sandbox_id) + ":";
        line += ' ';
        line += r.message;
        terminal_safe safe;
        line = safe.filter(line) + safe.finish();
        for (char& c : line) {
            if (c == '\n' || c == '\r') c = ' ';  // one record, one line
        }
        line += '\n';
        static std::mutex write_mutex;
        const std::lock_guard lock(write_mutex);
        std::fwrite(line.data(), 1, line.size(), stderr);
        std::fflush(stderr);
    });
}

}  // namespace moat::cli
