#include "wire/protocol.hpp"

#include <algorithm>

namespace moat::wire {

bool read_header(std::span<const std::byte> record, header& out) noexcept {
    if (record.size() < sizeof(header)) return false;
    std::memcpy(&out, record.data(), sizeof(header));
    return out.size == record.size() && out.size <= max_message_bytes;
}

void copy_field(std::span<char> field, std::string_view text) noexcept {
    if (field.empty()) return;
    const std::size_t n = std::min(text.size(), field.size() - 1);
    if (n != 0) std::memcpy(field.data(), text.data(), n);  // an empty view's data may be null
    std::fill(field.begin() + static_cast<std::ptrdiff_t>(n), field.end(), '\0');
}

std::string_view read_field(std::span<const char> field) noexcept {
    const auto end = std::find(field.begin(), field.end(), '\0');
    return {field.data(), static_cast<std::size_t>(end - field.begin())};
}

const char* unix_path_problem(std::string_view path) noexcept {
    if (path.empty()) return "empty";
    if (path.find('\0') != std::string_view::npos) return "contains a NUL byte";
    if (path.front() != '/') return "not absolute";
    if (path.size() >= unix_path_bytes) return "longer than 107 bytes";
    return nullptr;
}

namespace {

bool has_nul(std::string_view s) {
    return s.find('\0') != std::string_view::npos;
}

bool size_fits(std::uint32_t flags, std::uint32_t rows, std::uint32_t cols) {
    if ((flags & exec_terminal) == 0) return rows == 0 && cols == 0;
    return rows >= 1 && rows <= max_terminal_side && cols >= 1 && cols <= max_terminal_side;
}

}  // namespace

bool encode_exec(std::uint64_t exec_id, std::uint64_t wall_limit_ms,
                 std::span<const std::string> argv, std::span<const std::string> env,
                 std::string_view cwd, std::vector<std::byte>& out, std::uint32_t flags,
                 terminal_size terminal) {
    if (argv.empty() || has_nul(cwd) || !size_fits(flags, terminal.rows, terminal.cols)) {
        return false;
    }
    std::size_t size = sizeof(exec_message) + cwd.size() + 1;
    for (const auto& s : argv) {
        if (has_nul(s)) return false;
        size += s.size() + 1;
    }
    for (const auto& s : env) {
        if (has_nul(s) || s.find('=') == std::string::npos) return false;
        size += s.size() + 1;
    }
    if (size > max_message_bytes) return false;

    auto m = make_message<exec_message>(message_type::exec);
    m.h.size = static_cast<std::uint32_t>(size);
    m.exec_id = exec_id;
    m.wall_limit_ms = wall_limit_ms;
    m.argc = static_cast<std::uint32_t>(argv.size());
    m.envc = static_cast<std::uint32_t>(env.size());
    m.flags = flags;
    m.rows = terminal.rows;
    m.cols = terminal.cols;
    const std::size_t start = out.size();
    out.resize(start + size);
    std::byte* p = out.data() + start;
    std::memcpy(p, &m, sizeof m);
    p += sizeof m;
    auto put = [&p](std::string_view s) {
        std::memcpy(p, s.data(), s.size());
        p += s.size();
        *p++ = std::byte{0};
    };
    for (const auto& s : argv) put(s);
    for (const auto& s : env) put(s);
    put(cwd);
    return true;
}

bool decode_exec(std::span<const std::byte> record, exec_request_view& out) {
    header h{};
    if (!read_header(record, h) || h.type != static_cast<std::uint32_t>(message_type::exec) ||
        h.size < sizeof(exec_message)) {
        return false;
    }
    exec_message m{};
    std::memcpy(&m, record.data(), sizeof m);
    const std::size_t strings = std::size_t{m.argc} + m.envc + 1;
    if (m.argc == 0 || strings > record.size() || !size_fits(m.flags, m.rows, m.cols)) {
        return false;
    }

    const char* p = reinterpret_cast<const char*>(record.data()) + sizeof m;
    const char* const end = reinterpret_cast<const char*>(record.data()) + record.size();
    std::vector<std::string_view> all;
    all.reserve(strings);
    while (all.size() < strings) {
        const char* nul = std::find(p, end, '\0');
        if (nul == end) return false;
        all.emplace_back(p, static_cast<std::size_t>(nul - p));
        p = nul + 1;
    }
    if (p != end) return false;
    for (std::size_t i = m.argc; i < m.argc + m.envc; ++i) {
        if (all[i].find('=') == std::string_view::npos) return false;
    }
    out.exec_id = m.exec_id;
    out.wall_limit_ms = m.wall_limit_ms;
    out.flags = m.flags;
    out.rows = m.rows;
    out.cols = m.cols;
    out.argv.assign(all.begin(), all.begin() + m.argc);
    out.env.assign(all.begin() + m.argc, all.begin() + m.argc + m.envc);
    out.cwd = all.back();
    return true;
}

bool encode_watch_dir(std::uint64_t request_id, std::uint32_t mask, std::string_view base,
                      std::string_view relative, std::vector<std::byte>& out) {
    if (has_nul(base) || has_nul(relative) || base.empty() || base.front() != '/' ||
        base.size() + relative.size() > max_watch_path_bytes) {
        return false;
    }
    const std::size_t size = sizeof(watch_dir_message) + base.size() + relative.size();
    auto m = make_message<watch_dir_message>(message_type::watch_dir);
    m.h.size = static_cast<std::uint32_t>(size);
    m.request_id = request_id;
    m.mask = mask;
    m.base_bytes = static_cast<std::uint32_t>(base.size());
    m.relative_bytes = static_cast<std::uint32_t>(relative.size());
    const std::size_t start = out.size();
    out.resize(start + size);
    std::byte* p = out.data() + start;
    std::memcpy(p, &m, sizeof m);
    std::memcpy(p + sizeof m, base.data(), base.size());
    // An empty view may hold a null pointer, which memcpy must never get (even for 0 bytes).
    if (!relative.empty())
        std::memcpy(p + sizeof m + base.size(), relative.data(), relative.size());
    return true;
}

bool decode_watch_dir(std::span<const std::byte> record, watch_dir_view& out) {
    header h{};
    if (!read_header(record, h) || h.type != static_cast<std::uint32_t>(message_type::watch_dir) ||
        h.size < sizeof(watch_dir_message)) {
        return false;
    }
    watch_dir_message m{};
    std::memcpy(&m, record.data(), sizeof m);
    const std::size_t paths = std::size_t{m.base_bytes} + m.relative_bytes;
    if (paths > max_watch_path_bytes || sizeof m + paths != record.size()) return false;
    const char* p = reinterpret_cast<const char*>(record.data()) + sizeof m;
    const std::string_view base(p, m.base_bytes);
    const std::string_view relative(p + m.base_bytes, m.relative_bytes);
    if (base.empty() || base.front() != '/' || has_nul(base) || has_nul(relative)) return false;
    out.request_id = m.request_id;
    out.mask = m.mask;
    out.base = base;
    out.relative = relative;
    return true;
}

}  // namespace moat::wire
