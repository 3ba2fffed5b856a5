#include "e2b_protocol/error_body.hpp"

#include "core/json_writer.hpp"
#include "e2b_protocol/json_fields.hpp"

namespace moat::e2b_protocol {
namespace {

// `message` as one line of at most `max` bytes. `stop_at_newline`: envd's way (the first line,
// control bytes as spaces); otherwise the control plane's (control bytes dropped, "..." past max).
std::string one_line(std::string_view message, bool stop_at_newline) {
    constexpr std::size_t max = 200;
    std::string out;
    for (const char c : message) {
        const auto u = static_cast<unsigned char>(c);
        if (stop_at_newline) {
            if (c == '\n' || c == '\r' || out.size() == max) break;
            out.push_back(u < 0x20 ? ' ' : c);
            continue;
        }
        if (out.size() >= max) {
            out += "...";
            break;
        }
        if (u < 0x20 || u == 0x7f) continue;
        out += c;
    }
    return out;
}

}  // namespace

std::string encode_error_body(const error_body& b) {
    json_writer w;
    w.begin_object().key("code").value(b.code).key("message").value(b.message);
    if (b.sandbox_id) w.key("sandboxId").value(*b.sandbox_id);
    w.end_object();
    return w.take();
}

std::optional<error_body> parse_error_body(std::string_view body) {
    detail::document doc;
    if (!detail::parse_document(body, doc)) return std::nullopt;
    const auto& o = doc.root;
    std::string_view message;
    if (o["message"].get_string().get(message) != simdjson::SUCCESS) return std::nullopt;
    error_body out;
    out.message = std::string(message);
    if (const auto code = detail::field(o, "code"))
        out.code = detail::as_integer<std::int64_t>(*code).value_or(0);
    std::string_view id;
    if (o["sandboxId"].get_string().get(id) == simdjson::SUCCESS) out.sandbox_id = std::string(id);
    return out;
}

std::optional<std::string> parse_error_message(std::string_view body) {
    if (body.size() > max_error_body_bytes) return std::nullopt;
    auto parsed = parse_error_body(body);
    if (!parsed) return std::nullopt;
    return one_line(parsed->message, false);
}

std::string parse_envd_error_message(std::string_view body) {
    auto parsed = parse_error_body(body);
    if (!parsed) return {};
    return one_line(parsed->message, true);
}

}  // namespace moat::e2b_protocol
