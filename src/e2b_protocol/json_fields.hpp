// What the E2B protocol's parsers share to read a JSON document with simdjson: the root object,
// a field that is present (not absent, not null), the elements of an array field, and proto3's
// integers (a number or a decimal string). Private to src/e2b_protocol (its .cpp files include
// it; no header does).
#pragma once

#include <moat/result.hpp>

#include <simdjson.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

namespace moat::e2b_protocol::detail {

// A parsed document: the parser and the padded text its elements point into, and its root.
struct document {
    simdjson::dom::parser parser;
    simdjson::padded_string text;
    simdjson::dom::object root;
};

// Parses `json` into `doc`; false when it is not a JSON object.
inline bool parse_document(std::string_view json, document& doc) {
    doc.text = simdjson::padded_string(json);
    return doc.parser.parse(doc.text).get_object().get(doc.root) == simdjson::SUCCESS;
}

// The field, unless it is absent or null.
inline std::optional<simdjson::dom::element> field(const simdjson::dom::object& o,
                                                   std::string_view name) {
    simdjson::dom::element e;
    if (o[name].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    return e;
}

// Calls `each` (returning result<void>) on every element of the array field `name` of `json`'s
// root object; none when the field is absent or null. `not_object` when the document is not an
// object, `not_array` when the field is not an array, or the first error `each` returns.
template <class Each>
result<void> for_each_element(std::string_view json, std::string_view name, const error& not_object,
                              const error& not_array, Each each) {
    document doc;
    if (!parse_document(json, doc)) return not_object;
    const auto e = field(doc.root, name);
    if (!e) return {};
    simdjson::dom::array items;
    if (e->get_array().get(items) != simdjson::SUCCESS) return not_array;
    for (const simdjson::dom::element item : items) {
        if (auto done = each(item); !done) return done;
    }
    return {};
}

// A proto3 integer of type Int: a JSON number or a decimal string, in Int's range.
template <class Int>
std::optional<Int> as_integer(const simdjson::dom::element& e) {
    if constexpr (std::is_signed_v<Int>) {
        std::int64_t n = 0;
        if (e.get_int64().get(n) == simdjson::SUCCESS) {
            if (n < std::numeric_limits<Int>::min() || n > std::numeric_limits<Int>::max())
                return std::nullopt;
            return static_cast<Int>(n);
        }
    } else {
        std::uint64_t n = 0;
        if (e.get_uint64().get(n) == simdjson::SUCCESS) {
            if (n > std::numeric_limits<Int>::max()) return std::nullopt;
            return static_cast<Int>(n);
        }
    }
    std::string_view s;
    if (e.get_string().get(s) != simdjson::SUCCESS || s.empty()) return std::nullopt;
    Int v{};
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
    return v;
}

}  // namespace moat::e2b_protocol::detail
