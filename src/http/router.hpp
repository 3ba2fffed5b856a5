// Routing for the HTTP server: a request's method and path to a handler, with path parameters.
//
// A pattern is a path of literal segments and `{name}` segments: "/sandboxes/{id}/timeout". A
// `{name}` segment matches one non-empty segment of the request's path (no '/'), taken raw (not
// percent-decoded); a literal matches byte for byte. Routes are tried in the order added; the
// first whose pattern and method both match wins. A path that matches some pattern under another
// method is 405 (with the methods that would match, for Allow), any other path 404.
//
// Pure and confined to the server's executor like the server itself (routes are added before
// start()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moat::http {

// Path parameters of a matched route, by name.
class path_params {
  public:
    void add(std::string name, std::string value);
    // The value of `{name}`, or empty when the route has no such parameter.
    std::string_view get(std::string_view name) const noexcept;
    std::size_t size() const noexcept { return items_.size(); }

  private:
    std::vector<std::pair<std::string, std::string>> items_;
};

// One parsed pattern; true when `path` matches it, filling `params`.
class path_pattern {
  public:
    // False (and an unusable pattern) unless `pattern` starts with '/' and every `{...}` is a
    // whole segment with a non-empty name.
    bool parse(std::string_view pattern);
    bool match(std::string_view path, path_params& params) const;
    const std::string& text() const noexcept { return text_; }

  private:
    struct segment {
        std::string text;
        bool is_param = false;
    };
    std::string text_;
    std::vector<segment> segments_;
};

struct route_match {
    enum class outcome { found, not_found, method_not_allowed };
    outcome result = outcome::not_found;
    std::size_t route_index = 0;  // when found
    path_params params;           // when found
    std::string allow;            // when method_not_allowed: "GET, POST"
};

// Ordered (method, pattern) pairs; the server keeps the handlers beside them by index.
class route_table {
  public:
    // False when the pattern does not parse or the method is not a token.
    bool add(std::string method, std::string_view pattern);
    route_match match(std::string_view method, std::string_view path) const;
    std::size_t size() const noexcept { return routes_.size(); }

  private:
    struct entry {
        std::string method;
        path_pattern pattern;
    };
    std::vector<entry> routes_;
};

}  // namespace moat::http
