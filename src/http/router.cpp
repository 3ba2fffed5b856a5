#include "http/router.hpp"

#include "http/message.hpp"

namespace moat::http {

namespace {

// Splits "/a/b/" into "a", "b", "" (a trailing slash is a segment of its own: "/a/" is not "/a").
std::vector<std::string_view> segments_of(std::string_view path) {
    std::vector<std::string_view> out;
    if (path.empty() || path.front() != '/') return out;
    path.remove_prefix(1);
    for (;;) {
        const auto slash = path.find('/');
        out.push_back(path.substr(0, slash));
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
    }
    return out;
}

}  // namespace

void path_params::add(std::string name, std::string value) {
    items_.emplace_back(std::move(name), std::move(value));
}

std::string_view path_params::get(std::string_view name) const noexcept {
    for (const auto& [key, value] : items_) {
        if (key == name) return value;
    }
    return {};
}

bool path_pattern::parse(std::string_view pattern) {
    text_.clear();
    segments_.clear();
    if (pattern.empty() || pattern.front() != '/') return false;
    for (const auto part : segments_of(pattern)) {
        segment s;
        if (part.size() >= 2 && part.front() == '{' && part.back() == '}') {
            s.is_param = true;
            s.text = std::string(part.substr(1, part.size() - 2));
            if (s.text.empty()) return false;
        } else {
            s.text = std::string(part);
        }
        if (s.text.find_first_of("{}") != std::string::npos) return false;
        segments_.push_back(std::move(s));
    }
    text_ = std::string(pattern);
    return true;
}

bool path_pattern::match(std::string_view path, path_params& params) const {
    if (text_.empty()) return false;
    const auto parts = segments_of(path);
    if (parts.size() != segments_.size()) return false;
    path_params found;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        const auto& s = segments_[i];
        if (s.is_param) {
            if (parts[i].empty()) return false;
            found.add(s.text, std::string(parts[i]));
        } else if (parts[i] != s.text) {
            return false;
        }
    }
    params = std::move(found);
    return true;
}

bool route_table::add(std::string method, std::string_view pattern) {
    entry e;
    if (!is_token(method) || !e.pattern.parse(pattern)) return false;
    e.method = std::move(method);
    routes_.push_back(std::move(e));
    return true;
}

route_match route_table::match(std::string_view method, std::string_view path) const {
    route_match m;
    for (std::size_t i = 0; i < routes_.size(); ++i) {
        path_params params;
        if (!routes_[i].pattern.match(path, params)) continue;
        if (routes_[i].method == method) {
            m.result = route_match::outcome::found;
            m.route_index = i;
            m.params = std::move(params);
            m.allow.clear();
            return m;
        }
        m.result = route_match::outcome::method_not_allowed;
        if (m.allow.find(routes_[i].method) == std::string::npos) {
            if (!m.allow.empty()) m.allow += ", ";
            m.allow += routes_[i].method;
        }
    }
    return m;
}

}  // namespace moat::http
