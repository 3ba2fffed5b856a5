#include "serve/envd_entry.hpp"

#include <algorithm>
#include <charconv>
#include <ctime>

namespace moat::serve {

namespace {

constexpr std::size_t max_path_bytes = 4095;

// Lexically cleans an absolute path (Go's filepath.Clean).
std::string clean(std::string_view path) {
    std::vector<std::string_view> segments;
    while (!path.empty()) {
        const auto slash = path.find('/');
        const auto segment = path.substr(0, slash);
        path.remove_prefix(slash == std::string_view::npos ? path.size() : slash + 1);
        if (segment.empty() || segment == ".") continue;
        if (segment == "..") {
            if (!segments.empty()) segments.pop_back();
            continue;
        }
        segments.push_back(segment);
    }
    std::string out;
    for (const auto s : segments) {
        out.push_back('/');
        out.append(s);
    }
    if (out.empty()) out = "/";
    return out;
}

template <class Int>
bool parse_int(std::string_view s, Int& out, int base = 10) {
    const auto* last = s.data() + s.size();
    const auto [end, ec] = std::from_chars(s.data(), last, out, base);
    return !s.empty() && ec == std::errc() && end == last;
}

}  // namespace

result<std::string> resolve_envd_path(std::string_view path, std::string_view home) {
    if (path.find('\0') != std::string_view::npos)
        return make_error(errc::invalid_argument, "path has a NUL byte");
    std::string joined;
    if (path.empty()) {
        joined = home;
    } else if (path[0] == '~') {
        if (path.size() > 1 && path[1] != '/')
            return make_error(errc::invalid_argument,
                              "cannot expand another user's home directory in a path");
        joined = std::string(home) + "/" + std::string(path.substr(1));
    } else if (path[0] == '/') {
        joined = path;
    } else {
        joined = std::string(home) + "/" + std::string(path);
    }
    auto out = clean(joined);
    if (out.size() > max_path_bytes)
        return make_error(errc::invalid_argument, "path is longer than 4095 bytes");
    return out;
}

std::string parent_path(std::string_view clean_path) {
    const auto slash = clean_path.rfind('/');
    if (slash == std::string_view::npos || slash == 0) return "/";
    return std::string(clean_path.substr(0, slash));
}

std::string base_name(std::string_view clean_path) {
    if (clean_path == "/") return "/";
    const auto slash = clean_path.rfind('/');
    return std::string(slash == std::string_view::npos ? clean_path : clean_path.substr(slash + 1));
}

std::string go_permissions(char find_type, std::uint32_t mode) {
    std::string out;
    switch (find_type) {
        case 'd':
            out += 'd';
            break;
        case 'l':
            out += 'L';
            break;
        case 'b':
            out += 'D';
            break;
        case 'c':
            out += "Dc";
            break;
        case 'p':
            out += 'p';
            break;
        case 's':
            out += 'S';
            break;
        default:
            break;
    }
    if (mode & 04000) out += 'u';
    if (mode & 02000) out += 'g';
    if (mode & 01000) out += 't';
    if (find_type != 'f' && find_type != 'd' && find_type != 'l' && find_type != 'b' &&
        find_type != 'c' && find_type != 'p' && find_type != 's')
        out += '?';
    if (out.empty()) out += '-';
    constexpr std::string_view rwx = "rwxrwxrwx";
    for (int i = 0; i < 9; ++i) out += (mode & (1u << (8 - i))) ? rwx[i] : '-';
    return out;
}

std::string_view find_format() {
    return "%y\\0%Y\\0%s\\0%m\\0%u\\0%g\\0%T@\\0%l\\0%p\\0";
}

result<std::vector<entry_info>> parse_find_output(std::string_view output) {
    constexpr std::size_t fields = 9;
    std::vector<entry_info> out;
    while (!output.empty()) {
        std::string_view f[fields];
        for (auto& field : f) {
            const auto nul = output.find('\0');
            if (nul == std::string_view::npos)
                return make_error(errc::protocol_error, "file listing ends inside an entry");
            field = output.substr(0, nul);
            output.remove_prefix(nul + 1);
        }
        entry_info e;
        if (f[0].size() != 1 || f[1].size() != 1)
            return make_error(errc::protocol_error, "file listing has a malformed type");
        const char type = f[0][0];
        const char target_type = type == 'l' ? f[1][0] : type;
        switch (target_type) {
            case 'f':
                e.type = entry_type::file;
                break;
            case 'd':
                e.type = entry_type::directory;
                break;
            default:
                e.type = entry_type::unspecified;
                break;
        }
        std::uint32_t mode = 0;
        if (!parse_int(f[2], e.size) || !parse_int(f[3], mode, 8) || mode > 07777)
            return make_error(errc::protocol_error, "file listing has a malformed size or mode");
        e.mode = mode;
        e.permissions = go_permissions(type, mode);
        e.owner = f[4];
        e.group = f[5];
        // %T@: seconds, a point and up to ten fraction digits.
        const auto time = f[6];
        const auto point = time.find('.');
        if (!parse_int(time.substr(0, point), e.modified_seconds))
            return make_error(errc::protocol_error, "file listing has a malformed time");
        if (point != std::string_view::npos) {
            auto fraction = std::string(time.substr(point + 1));
            fraction.resize(9, '0');
            if (!parse_int(std::string_view(fraction), e.modified_nanos))
                return make_error(errc::protocol_error, "file listing has a malformed time");
        }
        if (f[8].empty() || f[8][0] != '/')
            return make_error(errc::protocol_error, "file listing has a relative path");
        e.path = std::string(f[8]);
        e.name = base_name(e.path);
        if (type == 'l') {
            const auto target = f[7];
            if (!target.empty() && target[0] == '/')
                e.symlink_target = clean(target);
            else
                e.symlink_target = clean(parent_path(e.path) + "/" + std::string(target));
        }
        out.push_back(std::move(e));
    }
    return out;
}

namespace {

std::vector<std::string> sh(std::string_view script, std::vector<std::string> args) {
    std::vector<std::string> argv = {"/bin/sh", "-c", std::string(script), "sh"};
    for (auto& a : args) argv.push_back(std::move(a));
    return argv;
}

}  // namespace

std::vector<std::string> stat_command(const std::string& path) {
    return sh(R"([ -e "$1" ] || [ -h "$1" ] || exit 3
exec find -P "$1" -maxdepth 0 -printf "$2")",
              {path, std::string(find_format())});
}

void sort_as_walked(std::vector<entry_info>& entries) {
    // Component by component: "a/x" before "a-b", since "a" < "a-b".
    const auto walked_before = [](const entry_info& left, const entry_info& right) {
        std::string_view a = left.path;
        std::string_view b = right.path;
        while (!a.empty() && !b.empty()) {
            const auto a_end = std::min(a.find('/'), a.size());
            const auto b_end = std::min(b.find('/'), b.size());
            const auto a_part = a.substr(0, a_end);
            const auto b_part = b.substr(0, b_end);
            if (a_part != b_part) return a_part < b_part;
            a.remove_prefix(std::min(a.size(), a_end + 1));
            b.remove_prefix(std::min(b.size(), b_end + 1));
        }
        return a.empty() && !b.empty();  // a parent before its entries
    };
    std::stable_sort(entries.begin(), entries.end(), walked_before);
}

std::vector<std::string> list_command(const std::string& path, std::uint32_t depth) {
    return sh(R"([ -e "$1" ] || exit 3
[ -d "$1" ] || exit 4
exec find -H "$1" -mindepth 1 -maxdepth "$3" -printf "$2")",
              {path, std::string(find_format()), std::to_string(depth)});
}

std::vector<std::string> make_dir_command(const std::string& path) {
    return sh(R"(if [ -d "$1" ]; then exit 5; fi
if [ -e "$1" ] || [ -h "$1" ]; then exit 4; fi
mkdir -p -- "$1" || exit 1
exec find -P "$1" -maxdepth 0 -printf "$2")",
              {path, std::string(find_format())});
}

std::vector<std::string> move_command(const std::string& source, const std::string& destination) {
    return sh(R"([ -e "$1" ] || [ -h "$1" ] || exit 3
mkdir -p -- "$3" || exit 1
mv -T -- "$1" "$2" || exit 1
exec find -P "$2" -maxdepth 0 -printf "$4")",
              {source, destination, parent_path(destination), std::string(find_format())});
}

std::vector<std::string> remove_command(const std::string& path) {
    return {"rm", "-rf", "--", path};
}

std::vector<std::string> make_parents_command(const std::string& directory) {
    return {"mkdir", "-p", "--", directory};
}

}  // namespace moat::serve
