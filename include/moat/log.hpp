// The logging hook. moat is silent unless the application installs a sink; moat never writes to
// stdout, stderr or syslog on its own. Records never contain secrets.
//
// set_log_sink may be called from any thread; the sink is called on whichever thread the logging
// moat object runs on (its executor), so a sink shared by several executors must be thread-safe.
#pragma once

#include <functional>
#include <string_view>

namespace moat {

enum class log_level { debug, info, warning, error };

struct log_record {
    log_level level;
    std::string_view component;   // "local", "helper", "task_group", ...
    std::string_view message;     // one line
    std::string_view sandbox_id;  // empty when the record is not about one sandbox
};

using log_sink = std::function<void(const log_record&)>;

// Installs the sink (an empty function restores silence). Thread-safe.
void set_log_sink(log_sink sink);

// "debug", "info", "warning", "error".
const char* to_string(log_level level) noexcept;

namespace detail {
bool log_enabled() noexcept;
void log(log_level level, std::string_view component, std::string_view message,
         std::string_view sandbox_id = {});
}  // namespace detail

}  // namespace moat
