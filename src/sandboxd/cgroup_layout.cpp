#include "sandboxd/cgroup_layout.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <charconv>

namespace moat::sandboxd {
namespace {

bool has_token(std::string_view list, std::string_view token) {
    while (!list.empty()) {
        const auto comma = list.find(',');
        if (list.substr(0, comma) == token) return true;
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return false;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size()) {
            const int value = (s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0');
            out.push_back(static_cast<char>(value));
            i += 3;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

// Calls f(field index, field) for each `separator`-separated field while f returns true.
template <class F>
void for_each_field(std::string_view line, char separator, F f) {
    std::size_t index = 0;
    while (true) {
        const auto at = line.find(separator);
        if (!f(index++, line.substr(0, at))) return;
        if (at == std::string_view::npos) return;
        line.remove_prefix(at + 1);
    }
}

template <class F>
void for_each_line(std::string_view text, F f) {
    while (!text.empty()) {
        const auto newline = text.find('\n');
        f(text.substr(0, newline));
        if (newline == std::string_view::npos) return;
        text.remove_prefix(newline + 1);
    }
}

struct mount_entry {
    std::string_view root, mount_point, type, options;
};

bool parse_mount(std::string_view line, mount_entry& out) {
    const auto dash = line.find(" - ");
    if (dash == std::string_view::npos) return false;
    std::size_t fields = 0;
    for_each_field(line.substr(0, dash), ' ', [&](std::size_t i, std::string_view f) {
        if (i == 3) out.root = f;
        if (i == 4) out.mount_point = f;
        fields = i + 1;
        return true;
    });
    std::size_t right = 0;
    for_each_field(line.substr(dash + 3), ' ', [&](std::size_t i, std::string_view f) {
        if (i == 0) out.type = f;
        if (i == 2) out.options = f;
        right = i + 1;
        return true;
    });
    return fields >= 5 && right >= 3;
}

std::string relative_to(std::string own, const std::string& root) {
    if (root != "/" && own.starts_with(root)) own.erase(0, root.size());
    if (own.empty()) own = "/";
    return own;
}

}  // namespace

const char* to_string(cgroup_layout_kind kind) {
    switch (kind) {
        case cgroup_layout_kind::none:
            return "none";
        case cgroup_layout_kind::v1:
            return "v1";
        case cgroup_layout_kind::hybrid:
            return "hybrid";
        case cgroup_layout_kind::v2:
            return "v2";
    }
    return "none";
}

bool cgroup_layout::limits_use_v1() const {
    for (const auto& h : v1) {
        if (!h.mount_point.empty()) return true;
    }
    return false;
}

std::string cgroup_layout::v2_own_dir() const {
    if (v2_mount.empty()) return "";
    return v2_own == "/" ? v2_mount : v2_mount + v2_own;
}

cgroup_layout parse_cgroup_layout(std::string_view mountinfo, std::string_view self_cgroup) {
    cgroup_layout layout;
    bool any_v1 = false;
    std::array<std::string, controller_count> v1_roots;
    std::string freezer_root;
    std::string v2_root = "/";
    for_each_line(mountinfo, [&](std::string_view line) {
        mount_entry m;
        if (!parse_mount(line, m)) return;
        if (m.type == "cgroup2") {
            if (layout.v2_mount.empty()) {
                layout.v2_mount = unescape(m.mount_point);
                layout.v2_nsdelegate = has_token(m.options, "nsdelegate");
                v2_root = unescape(m.root);
            }
            return;
        }
        if (m.type != "cgroup") return;
        any_v1 = true;
        if (has_token(m.options, "freezer") && layout.freezer.mount_point.empty()) {
            layout.freezer.mount_point = unescape(m.mount_point);
            freezer_root = unescape(m.root);
        }
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (!has_token(m.options, controller_names[i]) || !layout.v1[i].mount_point.empty())
                continue;
            layout.v1[i].mount_point = unescape(m.mount_point);
            v1_roots[i] = unescape(m.root);
        }
    });
    for_each_line(self_cgroup, [&](std::string_view line) {
        const auto first = line.find(':');
        const auto second = line.find(':', first + 1);
        if (first == std::string_view::npos || second == std::string_view::npos) return;
        const std::string_view controllers = line.substr(first + 1, second - first - 1);
        const std::string path(line.substr(second + 1));
        if (line.substr(0, first) == "0" && controllers.empty()) {
            layout.v2_own = relative_to(path, v2_root);
            return;
        }
        if (has_token(controllers, "freezer")) {
            const std::string own = relative_to(path, freezer_root);
            layout.freezer.own = own == "/" ? "" : own;
            layout.freezer.listed = true;
        }
        for (std::size_t i = 0; i < controller_count; ++i) {
            if (!has_token(controllers, controller_names[i])) continue;
            const std::string own = relative_to(path, v1_roots[i]);
            layout.v1[i].own = own == "/" ? "" : own;
            layout.v1[i].listed = true;
        }
    });
    if (!layout.v2_mount.empty() && layout.v2_own.empty()) layout.v2_own = "/";
    if (any_v1 && !layout.v2_mount.empty()) {
        layout.kind = cgroup_layout_kind::hybrid;
    } else if (any_v1) {
        layout.kind = cgroup_layout_kind::v1;
    } else if (!layout.v2_mount.empty()) {
        layout.kind = cgroup_layout_kind::v2;
    }
    return layout;
}

cgroup_layout read_cgroup_layout() {
    return parse_cgroup_layout(read_small_file("/proc/self/mountinfo"),
                               read_small_file("/proc/self/cgroup"));
}

std::string read_small_file(const std::string& path) {
    std::string text;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return text;
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buffer, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return text;
}

int write_small_file(const std::string& path, std::string_view text) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    const int err =
        ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) ? 0 : errno;
    ::close(fd);
    return err;
}

bool has_word(std::string_view list, std::string_view word) {
    std::size_t at = 0;
    while (at < list.size()) {
        while (at < list.size() && (list[at] == ' ' || list[at] == '\n')) ++at;
        std::size_t end = at;
        while (end < list.size() && list[end] != ' ' && list[end] != '\n') ++end;
        if (list.substr(at, end - at) == word) return true;
        at = end;
    }
    return false;
}

long long keyed_value(std::string_view text, std::string_view key) {
    long long result = -1;
    for_each_line(text, [&](std::string_view line) {
        if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ' ') return;
        const std::string_view number = line.substr(key.size() + 1);
        long long value = 0;
        const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
        if (ec == std::errc()) result = value;
        (void)ptr;
    });
    return result;
}

}  // namespace moat::sandboxd
