#include "local/spec_validation.hpp"

#include <string>
#include <string_view>

namespace moat {
namespace {

constexpr std::uint64_t min_memory_bytes = 16ull << 20;

bool is_printable(std::string_view s) {
    for (const char c : s) {
        if (c < 0x20 || c == 0x7f) return false;
    }
    return true;
}

result<void> validate_env(const std::map<std::string, std::string>& env, const char* field) {
    for (const auto& [key, value] : env) {
        if (key.empty() || key.find('=') != std::string::npos ||
            key.find('\0') != std::string::npos || value.find('\0') != std::string::npos) {
            return make_error(errc::invalid_argument,
                              std::string(field) + ": invalid variable name '" + key + "'");
        }
    }
    return {};
}

}  // namespace

result<void> validate_spec(const sandbox_spec& spec) {
    const auto& l = spec.limits;
    if (!spec.template_name.empty()) {
        return make_error(errc::invalid_argument,
                          "template_name: the local backend has only the default root ('')");
    }
    if (l.memory_bytes != 0 && l.memory_bytes < min_memory_bytes) {
        return make_error(errc::invalid_argument, "limits.memory_bytes: at least 16 MiB");
    }
    if (l.workspace_bytes == 0 || l.tmp_bytes == 0) {
        return make_error(errc::invalid_argument,
                          "limits: workspace_bytes and tmp_bytes must be > 0");
    }
    if (l.cpu_millicores > 1'000'000) {
        return make_error(errc::invalid_argument, "limits.cpu_millicores: at most 1000000");
    }
    if (auto ttl = validate_ttl(spec.ttl); !ttl) return ttl;
    if (spec.workdir.empty() || spec.workdir.front() != '/' ||
        spec.workdir.find('\0') != std::string::npos) {
        return make_error(errc::invalid_argument, "workdir: must be an absolute path");
    }
    for (const auto& [key, value] : spec.labels) {
        if (key.empty() || !is_printable(key) || !is_printable(value)) {
            return make_error(errc::invalid_argument, "labels: keys and values must be printable");
        }
    }
    return validate_env(spec.env, "env");
}

result<void> validate_exec(const exec_request& request, std::chrono::milliseconds ceiling) {
    if (request.argv.empty() && request.shell.empty()) {
        return make_error(errc::invalid_argument, "exec: no command (argv and shell are empty)");
    }
    if (!request.argv.empty() && request.argv.front().empty()) {
        return make_error(errc::invalid_argument, "exec: argv[0] is empty");
    }
    if (request.wall_limit.count() <= 0 || request.wall_limit > ceiling) {
        return make_error(errc::invalid_argument, "wall_limit: must be between 1 ms and " +
                                                      std::to_string(ceiling.count() / 1000) +
                                                      " s");
    }
    if (!request.cwd.empty() && request.cwd.front() != '/') {
        return make_error(errc::invalid_argument, "cwd: must be an absolute path");
    }
    return validate_env(request.env, "exec env");
}

result<void> validate_ttl(std::chrono::milliseconds ttl) {
    if (ttl.count() <= 0 || ttl > sandbox_spec::max_ttl) {
        return make_error(errc::invalid_argument,
                          "ttl: must be between 1 ms and " +
                              std::to_string(sandbox_spec::max_ttl.count()) + " hours");
    }
    return {};
}

std::uint64_t effective_workspace_bytes(const resource_limits& limits) noexcept {
    if (limits.memory_bytes != 0 && limits.workspace_bytes >= limits.memory_bytes) {
        return limits.memory_bytes / 2;
    }
    return limits.workspace_bytes;
}

}  // namespace moat
