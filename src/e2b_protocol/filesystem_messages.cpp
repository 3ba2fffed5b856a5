#include "e2b_protocol/filesystem_messages.hpp"

#include "core/ascii.hpp"
#include "core/file_metadata.hpp"
#include "core/json_writer.hpp"
#include "core/rfc3339.hpp"
#include "e2b_protocol/json_fields.hpp"
#include "e2b_protocol/sandbox_requests.hpp"

namespace moat::e2b_protocol {
namespace {

using detail::as_integer;
using detail::field;
using simdjson::dom::element;
using simdjson::dom::object;

constexpr const char* type_names[] = {"FILE_TYPE_UNSPECIFIED", "FILE_TYPE_FILE",
                                      "FILE_TYPE_DIRECTORY", "FILE_TYPE_SYMLINK"};

error bad(std::string what) {
    return make_error(errc::protocol_error, "envd sent " + std::move(what));
}

// A string field of an entry: absent or null gives "".
result<std::string> entry_string(const object& o, std::string_view name) {
    auto e = field(o, name);
    if (!e) return std::string();
    std::string_view s;
    if (e->get_string().get(s) != simdjson::SUCCESS)
        return bad("an entry with a " + std::string(name) + " that is not a string");
    return std::string(s);
}

template <class Int>
result<Int> entry_integer(const object& o, std::string_view name) {
    auto e = field(o, name);
    if (!e) return Int{};
    auto n = as_integer<Int>(*e);
    if (!n) return bad("an entry with a " + std::string(name) + " that is not an integer");
    return *n;
}

result<entry_type> type_of(const object& o) {
    auto type = field(o, "type");
    if (!type) return entry_type::unspecified;
    std::string_view s;
    std::int64_t n = -1;
    if (type->get_string().get(s) == simdjson::SUCCESS) {
        n = 0;
        for (int i = 1; i < 4; ++i)
            if (s == type_names[i]) n = i;
    } else if (type->get_int64().get(n) != simdjson::SUCCESS) {
        return bad("an entry whose type is neither a name nor a number");
    }
    if (n < 1 || n > 3) return entry_type::unspecified;
    return static_cast<entry_type>(n);
}

// modifiedTime, when it reads as RFC 3339 (moat uses no entry's time: one it cannot read, a
// file's from before 1970, is left unset rather than failing the reply).
void read_modified(const object& o, entry_info& info) {
    std::string_view text;
    if (o["modifiedTime"].get_string().get(text) != simdjson::SUCCESS) return;
    const auto point = moat::detail::parse_rfc3339(text);
    if (!point) return;
    const auto since =
        std::chrono::duration_cast<std::chrono::nanoseconds>(point->time_since_epoch());
    info.modified_seconds = since.count() / 1'000'000'000;
    info.modified_nanos = static_cast<std::int32_t>(since.count() % 1'000'000'000);
}

result<entry_info> entry_of(const element& e) {
    object o;
    if (e.get_object().get(o) != simdjson::SUCCESS) return bad("an entry that is not an object");
    entry_info info;
    for (auto [name, target] : {std::pair{"name", &info.name}, std::pair{"path", &info.path},
                                std::pair{"permissions", &info.permissions},
                                std::pair{"owner", &info.owner}, std::pair{"group", &info.group}}) {
        auto v = entry_string(o, name);
        if (!v) return std::move(v).error();
        *target = std::move(*v);
    }
    auto type = type_of(o);
    if (!type) return std::move(type).error();
    info.type = *type;
    auto size = entry_integer<std::int64_t>(o, "size");
    if (!size) return std::move(size).error();
    if (*size < 0) return bad("an entry with a negative size");
    info.size = *size;
    auto mode = entry_integer<std::uint32_t>(o, "mode");
    if (!mode) return std::move(mode).error();
    // Go's FileMode keeps setuid, setgid and sticky far above the permission bits.
    std::uint32_t bits = *mode & 07777;
    if ((*mode & (1u << 23)) != 0) bits |= 04000;
    if ((*mode & (1u << 22)) != 0) bits |= 02000;
    if ((*mode & (1u << 20)) != 0) bits |= 01000;
    info.mode = bits;
    read_modified(o, info);
    if (auto target = field(o, "symlinkTarget")) {
        std::string_view s;
        if (target->get_string().get(s) != simdjson::SUCCESS)
            return bad("an entry whose symlinkTarget is not a string");
        info.symlink_target = std::string(s);
    }
    if (auto metadata = field(o, "metadata")) {
        object m;
        if (metadata->get_object().get(m) != simdjson::SUCCESS)
            return bad("an entry whose metadata is not an object");
        moat::detail::file_metadata_collector kept;
        for (auto [key, value] : m) {
            std::string_view text;
            if (value.get_string().get(text) != simdjson::SUCCESS)
                return bad("an entry whose metadata has a value that is not a string");
            kept.add(key, text);
        }
        info.metadata = kept.take();
    }
    return info;
}

error not_request_object() {
    return make_error(errc::invalid_argument, "request body is not a JSON object");
}

// A request's path field: "" when absent or not a string.
std::string path_of(const object& o, const char* name) {
    std::string_view v;
    if (o[name].get_string().get(v) != simdjson::SUCCESS) return {};
    return std::string(v);
}

}  // namespace

void write_metadata(json_writer& out, const file_metadata& metadata) {
    if (metadata.empty()) return;
    out.key("metadata").begin_object();
    for (const auto& [key, value] : metadata) out.key(key).value(value);
    out.end_object();
}

void write_entry_info(json_writer& out, const entry_info& e) {
    out.begin_object();
    out.key("name").value(e.name);
    out.key("type").value(type_names[static_cast<int>(e.type)]);
    out.key("path").value(e.path);
    out.key("size").value(std::to_string(e.size));
    out.key("mode").value(static_cast<std::uint64_t>(e.mode));
    out.key("permissions").value(e.permissions);
    out.key("owner").value(e.owner);
    out.key("group").value(e.group);
    if (e.modified_seconds != 0 || e.modified_nanos != 0) {
        const auto modified = std::chrono::system_clock::time_point(
            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                std::chrono::seconds(e.modified_seconds) +
                std::chrono::nanoseconds(e.modified_nanos)));
        out.key("modifiedTime")
            .value(moat::detail::format_rfc3339(modified, e.modified_nanos != 0 ? 9 : 0));
    }
    if (e.symlink_target) out.key("symlinkTarget").value(*e.symlink_target);
    write_metadata(out, e.metadata);
    out.end_object();
}

std::string encode_entry_response(const entry_info& entry) {
    json_writer w;
    w.begin_object().key("entry");
    write_entry_info(w, entry);
    w.end_object();
    return w.take();
}

result<entry_info> parse_entry_response(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc))
        return bad("a filesystem reply that is not a JSON object");
    auto entry = field(doc.root, "entry");
    if (!entry) return bad("a filesystem reply without an entry");
    return entry_of(*entry);
}

std::string encode_list_dir_response(const std::vector<entry_info>& entries) {
    json_writer w;
    w.begin_object().key("entries").begin_array();
    for (const auto& e : entries) write_entry_info(w, e);
    w.end_array().end_object();
    return w.take();
}

result<std::vector<entry_info>> parse_list_dir_response(std::string_view json,
                                                        std::size_t max_entries) {
    std::vector<entry_info> out;
    auto read = detail::for_each_element(
        json, "entries", bad("a directory listing that is not a JSON object"),
        bad("a directory listing whose entries are not an array"),
        [&](const element& item) -> result<void> {
            if (out.size() == max_entries) {
                return make_error(errc::too_large, "the directory has more than " +
                                                       std::to_string(max_entries) + " entries");
            }
            auto e = entry_of(item);
            if (!e) return std::move(e).error();
            out.push_back(std::move(*e));
            return {};
        });
    if (!read) return std::move(read).error();
    return out;
}

std::string encode_path_request(std::string_view path) {
    json_writer w;
    w.begin_object().key("path").value(path).end_object();
    return w.take();
}

result<std::string> parse_path_request(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc)) return not_request_object();
    return path_of(doc.root, "path");
}

std::string encode_list_dir_request(const list_dir_request& r) {
    json_writer w;
    w.begin_object().key("path").value(r.path);
    w.key("depth").value(static_cast<std::uint64_t>(r.depth)).end_object();
    return w.take();
}

result<list_dir_request> parse_list_dir_request(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc)) return not_request_object();
    list_dir_request out;
    out.path = path_of(doc.root, "path");
    if (auto d = field(doc.root, "depth")) {
        std::uint64_t depth = 0;
        if (d->get_uint64().get(depth) != simdjson::SUCCESS || depth > 0xffffffffu)
            return make_error(errc::invalid_argument, "depth must be a uint32");
        out.depth = static_cast<std::uint32_t>(depth);
    }
    return out;
}

std::string encode_move_request(const move_request& r) {
    json_writer w;
    w.begin_object().key("source").value(r.source).key("destination").value(r.destination);
    w.end_object();
    return w.take();
}

result<move_request> parse_move_request(std::string_view json) {
    detail::document doc;
    if (!detail::parse_document(json, doc)) return not_request_object();
    return move_request{path_of(doc.root, "source"), path_of(doc.root, "destination")};
}

std::string encode_files_query(const files_query& q) {
    std::string out;
    for (auto [name, value] : {std::pair{"path", &q.path}, std::pair{"username", &q.username},
                               std::pair{"signature", &q.signature},
                               std::pair{"signature_expiration", &q.signature_expiration}}) {
        if (!*value) continue;
        if (!out.empty()) out += '&';
        out.append(name).append("=").append(moat::detail::percent_encoded(**value));
    }
    return out;
}

result<files_query> parse_files_query(std::string_view query) {
    auto parsed = parse_query(query);
    if (!parsed) return std::move(parsed).error();
    files_query out;
    for (auto [name, into] : {std::pair{"path", &out.path}, std::pair{"username", &out.username},
                              std::pair{"signature", &out.signature},
                              std::pair{"signature_expiration", &out.signature_expiration}}) {
        if (auto it = parsed->find(name); it != parsed->end()) *into = std::move(it->second);
    }
    return out;
}

}  // namespace moat::e2b_protocol
