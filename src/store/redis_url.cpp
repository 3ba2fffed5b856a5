#include "store/redis_url.hpp"

#include "core/ascii.hpp"

#include <charconv>
#include <cstdlib>
#include <fstream>

namespace moat {
namespace {

error bad_url(const std::string& why) {
    // Never the URL itself: its user part may hold a password.
    return make_error(errc::invalid_argument, "store URL: " + why);
}

bool parse_number(std::string_view text, unsigned long max, unsigned long& out) {
    if (text.empty() || text.size() > 10) return false;
    const auto* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, out);
    return ec == std::errc{} && ptr == end && out <= max;
}

// The bytes a key prefix may hold: printable ASCII without spaces (it is part of every key).
bool is_valid_prefix(std::string_view prefix) {
    if (prefix.size() > 128) return false;
    for (const char c : prefix) {
        if (c <= 0x20 || c >= 0x7f) return false;
    }
    return true;
}

result<void> apply_query(std::string_view query, redis_config& config) {
    while (!query.empty()) {
        const auto amp = query.find('&');
        const auto pair = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
        if (pair.empty()) continue;
        const auto eq = pair.find('=');
        if (eq == std::string_view::npos) return bad_url("query parameter without a value");
        const auto name = pair.substr(0, eq);
        std::string value;
        if (!store::percent_decode(pair.substr(eq + 1), value)) {
            return bad_url("a malformed %-escape in the query");
        }
        if (name == "db") {
            unsigned long db = 0;
            if (!parse_number(value, 65535, db)) return bad_url("db is not a number 0-65535");
            config.database = static_cast<int>(db);
        } else if (name == "prefix") {
            if (!is_valid_prefix(value)) {
                return bad_url("prefix must be printable ASCII without spaces, at most 128 bytes");
            }
            config.key_prefix = value;
        } else {
            return bad_url("unknown query parameter (known: db, prefix)");
        }
    }
    return {};
}

}  // namespace

namespace store {

bool percent_decode(std::string_view in, std::string& out) {
    auto decoded = detail::percent_decoded(in, false);
    if (!decoded) return false;
    out = std::move(*decoded);
    return true;
}

}  // namespace store

std::string redis_config::to_string() const {
    std::string out;
    if (kind == transport::unix_socket) {
        out = "unix://" + socket_path;
    } else {
        out = kind == transport::tls ? "rediss://" : "redis://";
        if (host.find(':') != std::string::npos) {
            out += "[" + host + "]";
        } else {
            out += host;
        }
        out += ":" + std::to_string(port);
    }
    if (database != 0)
        out += (kind == transport::unix_socket ? "?db=" : "/") + std::to_string(database);
    return out;
}

result<redis_config> parse_redis_url(std::string_view url) {
    redis_config config;
    if (url.size() > 4096) return bad_url("longer than 4096 bytes");
    std::string_view rest;
    if (url.starts_with("redis://")) {
        config.kind = redis_config::transport::tcp;
        rest = url.substr(8);
    } else if (url.starts_with("rediss://")) {
        config.kind = redis_config::transport::tls;
        rest = url.substr(9);
    } else if (url.starts_with("unix://")) {
        config.kind = redis_config::transport::unix_socket;
        rest = url.substr(7);
    } else {
        return bad_url("the scheme must be redis://, rediss:// or unix://");
    }
    std::string_view query;
    if (const auto q = rest.find('?'); q != std::string_view::npos) {
        query = rest.substr(q + 1);
        rest = rest.substr(0, q);
    }
    if (rest.find('#') != std::string_view::npos) return bad_url("a fragment (#) is not allowed");

    if (config.kind == redis_config::transport::unix_socket) {
        std::string path;
        if (!store::percent_decode(rest, path)) return bad_url("a malformed %-escape in the path");
        if (path.empty() || path.front() != '/') {
            return bad_url("unix:// needs an absolute socket path (unix:///path/redis.sock)");
        }
        if (path.size() > 107) return bad_url("the socket path is longer than 107 bytes");
        if (path.find('\0') != std::string::npos) return bad_url("the socket path holds a NUL");
        config.socket_path = path;
        config.host.clear();
        config.port = 0;
        if (auto applied = apply_query(query, config); !applied) return applied.error();
        return config;
    }

    // authority [/db]
    std::string_view authority = rest;
    std::string_view path;
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
        authority = rest.substr(0, slash);
        path = rest.substr(slash + 1);
    }
    if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
        const auto userinfo = authority.substr(0, at);
        authority = authority.substr(at + 1);
        const auto colon = userinfo.find(':');
        std::string user;
        std::string password;
        if (!store::percent_decode(userinfo.substr(0, colon), user)) {
            return bad_url("a malformed %-escape in the user name");
        }
        if (colon != std::string_view::npos &&
            !store::percent_decode(userinfo.substr(colon + 1), password)) {
            return bad_url("a malformed %-escape in the password");
        }
        if (colon == std::string_view::npos) {
            // redis://secret@host: a lone user part is the password, as redis-cli reads it.
            password = std::move(user);
            user.clear();
        }
        config.username = std::move(user);
        config.password = std::move(password);
    }
    std::string_view host = authority;
    std::string_view port;
    if (authority.starts_with('[')) {
        const auto close = authority.find(']');
        if (close == std::string_view::npos) return bad_url("an unclosed [ in the host");
        host = authority.substr(1, close - 1);
        const auto after = authority.substr(close + 1);
        if (!after.empty()) {
            if (after.front() != ':') return bad_url("bytes after the ] of the host");
            port = after.substr(1);
            if (port.empty()) return bad_url("an empty port");
        }
    } else if (const auto colon = authority.rfind(':'); colon != std::string_view::npos) {
        host = authority.substr(0, colon);
        port = authority.substr(colon + 1);
        if (port.empty()) return bad_url("an empty port");
    }
    if (host.empty()) return bad_url("no host");
    if (host.size() > 253) return bad_url("the host is longer than 253 bytes");
    for (const char c : host) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                        (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_' || c == ':';
        if (!ok) return bad_url("the host holds a byte that is not a name or an address");
    }
    config.host = std::string(host);
    if (!port.empty()) {
        unsigned long number = 0;
        if (!parse_number(port, 65535, number) || number == 0) {
            return bad_url("the port is not a number 1-65535");
        }
        config.port = static_cast<std::uint16_t>(number);
    }
    if (!path.empty()) {
        unsigned long db = 0;
        if (!parse_number(path, 65535, db))
            return bad_url("the database (/N) is not a number 0-65535");
        config.database = static_cast<int>(db);
    }
    if (auto applied = apply_query(query, config); !applied) return applied.error();
    return config;
}

result<void> load_redis_password(redis_config& config, const std::string& password_file) {
    if (!config.password.empty()) return {};
    if (!password_file.empty()) {
        std::ifstream in(password_file);
        if (!in) {
            return make_error(errc::invalid_argument,
                              "store password file " + password_file + ": cannot be read");
        }
        std::string line;
        std::getline(in, line);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) {
            return make_error(errc::invalid_argument,
                              "store password file " + password_file + ": its first line is empty");
        }
        config.password = std::move(line);
        return {};
    }
    if (const char* env = std::getenv("MOAT_STORE_PASSWORD"); env != nullptr && *env != '\0') {
        config.password = env;
    }
    return {};
}

}  // namespace moat
