#include "local/spec_validation.hpp"

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>

namespace moat {
namespace {

constexpr std::uint64_t min_memory_bytes = 16ull << 20;
constexpr std::uint64_t min_tmpfs_bytes = 1ull << 20;
constexpr std::uint32_t max_pids = 1'000'000;
constexpr std::uint32_t max_millicores = 1'000'000;
constexpr std::uint32_t min_open_files = 64;  // pid 1 keeps a few descriptors per command
constexpr std::uint32_t max_open_files = 65536;

// An explicit value outside [low, high]. 0 is always below `low`: for every limit the kernel
// would read it as "no limit" (memory, pids, cpu quota, a tmpfs size) or as unusable.
template <class Int>
result<void> check_range(const std::optional<Int>& value, Int low, Int high, const char* field,
                         const char* unit) {
    if (!value || (*value >= low && *value <= high)) return {};
    std::string detail = std::string("limits.") + field + ": " + std::to_string(*value) + unit;
    if (high == std::numeric_limits<Int>::max()) {
        detail += ", expected at least " + std::to_string(low) + unit;
    } else {
        detail += ", expected " + std::to_string(low) + " to " + std::to_string(high) + unit;
    }
    if (*value == 0) detail += " (0 would mean unlimited; leave it unset for the default)";
    return make_error(errc::invalid_argument, std::move(detail));
}

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

// An absolute, normal path: no empty, "." or ".." component, no trailing '/', no NUL.
result<void> check_layout_path(const std::string& path, const char* field) {
    const auto bad = [&](const char* why) {
        return make_error(errc::invalid_argument,
                          std::string("layout.") + field + ": '" + path + "' " + why);
    };
    if (path.empty() || path.front() != '/') return bad("must be an absolute path");
    if (path.size() > sandbox_layout::max_path_bytes) {
        return bad(("is longer than " + std::to_string(sandbox_layout::max_path_bytes) + " bytes")
                       .c_str());
    }
    for (const char c : path) {
        if (c < 0x20 || c == 0x7f) return bad("has a control character");
    }
    if (path.size() > 1 && path.back() == '/') return bad("must not end in '/'");
    std::size_t at = 1;
    while (at <= path.size() && path.size() > 1) {
        const std::size_t end = std::min(path.find('/', at), path.size());
        const std::string_view part(path.data() + at, end - at);
        if (part.empty() || part == "." || part == "..") {
            return bad("must be normal (no empty, '.' or '..' component)");
        }
        at = end + 1;
    }
    return {};
}

bool is_user_name(std::string_view name) {
    if (name.empty() || name.size() > sandbox_layout::max_user_bytes) return false;
    if (!(name.front() == '_' || (name.front() >= 'a' && name.front() <= 'z'))) return false;
    for (const char c : name) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

}  // namespace

bool is_within(std::string_view path, std::string_view tree) noexcept {
    return path == tree ||
           (path.size() > tree.size() && path.starts_with(tree) && path[tree.size()] == '/');
}

std::string_view writable_tree(std::string_view path) noexcept {
    for (const std::string_view tree : {"/workspace", "/tmp", "/home"}) {
        if (is_within(path, tree)) return tree;
    }
    return {};
}

result<void> validate_layout(const sandbox_layout& layout) {
    if (!layout.user.empty() && !is_user_name(layout.user)) {
        return make_error(errc::invalid_argument,
                          "layout.user: '" + layout.user +
                              "' is not a plain POSIX user name ([a-z_][a-z0-9_-]*, at most " +
                              std::to_string(sandbox_layout::max_user_bytes) + " bytes)");
    }
    if (layout.user == "root") {
        return make_error(errc::invalid_argument,
                          "layout.user: 'root' is the sandbox's root; commands run unprivileged");
    }
    if (auto r = check_layout_path(layout.home, "home"); !r) return r;
    if (auto r = check_layout_path(layout.workdir, "workdir"); !r) return r;
    if (auto r = check_layout_path(layout.artifacts_dir, "artifacts_dir"); !r) return r;
    // What the local backend can make writable: /workspace, /tmp and (its own tmpfs) /home.
    // /workspace starts empty, so a home below it would not exist.
    const std::string_view home_tree = writable_tree(layout.home);
    if (layout.home != "/workspace" &&
        (home_tree.empty() || home_tree == "/workspace" || layout.home == home_tree)) {
        return make_error(errc::invalid_argument,
                          "layout.home: '" + layout.home +
                              "' must be /workspace or a directory under /tmp or /home (the rest "
                              "of the root is read-only)");
    }
    if (writable_tree(layout.artifacts_dir).empty() || layout.artifacts_dir == "/home") {
        return make_error(errc::invalid_argument,
                          "layout.artifacts_dir: '" + layout.artifacts_dir +
                              "' must be under /workspace, /tmp or /home (the rest of the root is "
                              "read-only)");
    }
    return {};
}

result<void> validate_spec(const sandbox_spec& spec) {
    const auto& l = spec.limits;
    if (auto limits = validate_limits(l); !limits) return limits;
    if (auto ttl = validate_ttl(spec.ttl); !ttl) return ttl;
    if (spec.paused_lifetime.count() < 0 || spec.paused_lifetime > sandbox_spec::max_ttl) {
        return make_error(errc::invalid_argument,
                          "paused_lifetime: must be between 0 (no limit) and " +
                              std::to_string(sandbox_spec::max_ttl.count()) + " hours");
    }
    if (auto layout = validate_layout(spec.layout); !layout) return layout;
    for (const auto& [key, value] : spec.labels) {
        if (key.empty() || !is_printable(key) || !is_printable(value)) {
            return make_error(errc::invalid_argument, "labels: keys and values must be printable");
        }
    }
    return validate_env(spec.env, "env");
}

result<void> validate_limits(const resource_limits& l) {
    constexpr std::uint64_t no_max = ~std::uint64_t{0};
    if (auto r = check_range(l.memory_bytes, min_memory_bytes, no_max, "memory_bytes", " bytes");
        !r)
        return r;
    if (auto r = check_range<std::uint32_t>(l.pids, 1, max_pids, "pids", ""); !r) return r;
    if (auto r = check_range<std::uint32_t>(l.cpu_millicores, 1, max_millicores, "cpu_millicores",
                                            " millicores");
        !r)
        return r;
    if (auto r =
            check_range(l.workspace_bytes, min_tmpfs_bytes, no_max, "workspace_bytes", " bytes");
        !r)
        return r;
    if (auto r = check_range(l.tmp_bytes, min_tmpfs_bytes, no_max, "tmp_bytes", " bytes"); !r)
        return r;
    return check_range(l.open_files, min_open_files, max_open_files, "open_files", "");
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
    const resource_limits l = limits.with_defaults();
    if (*l.workspace_bytes >= *l.memory_bytes) return *l.memory_bytes / 2;
    return *l.workspace_bytes;
}

}  // namespace moat
