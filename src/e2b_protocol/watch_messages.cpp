#include "e2b_protocol/watch_messages.hpp"

#include "core/json_writer.hpp"
#include "e2b_protocol/json_fields.hpp"

namespace moat::e2b_protocol {
namespace {

using detail::field;

error not_request_object() {
    return make_error(errc::invalid_argument, "request body is not a JSON object");
}

result<bool> bool_field(const simdjson::dom::object& o, std::string_view name) {
    auto e = field(o, name);
    if (!e) return false;
    bool b = false;
    if (e->get_bool().get(b) != simdjson::SUCCESS) {
        return make_error(errc::invalid_argument, std::string(name) + " must be a boolean");
    }
    return b;
}

result<std::string> string_field(const simdjson::dom::object& o, std::string_view name) {
    auto e = field(o, name);
    if (!e) return std::string();
    std::string_view s;
    if (e->get_string().get(s) != simdjson::SUCCESS) {
        return make_error(errc::invalid_argument, std::string(name) + " must be a string");
    }
    return std::string(s);
}

void write_event(json_writer& w, const filesystem_event& e) {
    w.begin_object().key("name").value(e.event.name);
    w.key("type").value(event_type_name(e.event.type));
    if (e.entry) {
        w.key("entry");
        write_entry_info(w, *e.entry);
    }
    w.end_object();
}

}  // namespace

result<watch_dir_request> parse_watch_dir_request(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc)) return not_request_object();
    watch_dir_request out;
    auto path = string_field(doc.root, "path");
    if (!path) return path.error();
    out.path = std::move(*path);
    auto recursive = bool_field(doc.root, "recursive");
    if (!recursive) return recursive.error();
    out.recursive = *recursive;
    auto include_entry = bool_field(doc.root, "includeEntry");
    if (!include_entry) return include_entry.error();
    out.include_entry = *include_entry;
    return out;
}

const char* event_type_name(watch_event_type type) noexcept {
    switch (type) {
        case watch_event_type::create:
            return "EVENT_TYPE_CREATE";
        case watch_event_type::write:
            return "EVENT_TYPE_WRITE";
        case watch_event_type::remove:
            return "EVENT_TYPE_REMOVE";
        case watch_event_type::rename:
            return "EVENT_TYPE_RENAME";
        case watch_event_type::chmod:
            return "EVENT_TYPE_CHMOD";
    }
    return "EVENT_TYPE_UNSPECIFIED";
}

std::string encode_watch_start() {
    return R"({"start":{}})";
}

std::string encode_watch_keepalive() {
    return R"({"keepalive":{}})";
}

std::string encode_watch_event(const filesystem_event& event) {
    json_writer w;
    w.begin_object().key("filesystem");
    write_event(w, event);
    w.end_object();
    return w.take();
}

result<std::string> parse_watcher_id_request(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc)) return not_request_object();
    return string_field(doc.root, "watcherId");
}

std::string encode_create_watcher_response(std::string_view watcher_id) {
    json_writer w;
    w.begin_object().key("watcherId").value(watcher_id).end_object();
    return w.take();
}

std::string encode_watcher_events_response(const std::vector<filesystem_event>& events) {
    json_writer w;
    w.begin_object().key("events").begin_array();
    for (const auto& event : events) write_event(w, event);
    w.end_array().end_object();
    return w.take();
}

}  // namespace moat::e2b_protocol
