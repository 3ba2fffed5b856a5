// envd's filesystem service (package `filesystem`, proto3 JSON) and its /files routes' query: the
// path, ListDir and Move requests, EntryInfo and the replies that carry it (Stat, MakeDir, Move:
// {"entry"}; ListDir: {"entries"}), and /files?path=&username=&signature=. Each has one struct,
// one writer and one parser; the e2b backend's envd client writes the requests and reads the
// replies, moat serve the other way round. Unit-tested in tests/e2b_protocol_test.cpp and fuzzed
// (fuzz/envd_response_fuzzer.cpp).
//
// A request parser fails with errc::invalid_argument, a reply parser with errc::protocol_error
// ("envd sent ..."); the detail names the field, never its value. Reply parsers follow proto3
// JSON (absent or null fields are their defaults, unknown ones ignored, int64 and uint32 as
// numbers or decimal strings, enums as names or numbers).
#pragma once

#include <moat/files.hpp>
#include <moat/result.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moat {
class json_writer;
}

namespace moat::e2b_protocol {

// filesystem.FileType.
enum class entry_type { unspecified = 0, file = 1, directory = 2, symlink = 3 };
// In moat's terms: unspecified (a FIFO, a device, a dangling link) is file_type::other. An
// entry_type equals the file_type it maps to.
constexpr file_type to_file_type(entry_type type) noexcept {
    constexpr file_type types[] = {file_type::other, file_type::regular, file_type::directory,
                                   file_type::symlink};
    const auto at = static_cast<std::size_t>(type);
    return at < std::size(types) ? types[at] : file_type::other;
}
constexpr bool operator==(entry_type a, file_type b) noexcept {
    return to_file_type(a) == b;
}

// filesystem.EntryInfo. moat serve fills every field as envd does: for a symlink the type is its
// target's (unspecified when dangling) and symlink_target the target made absolute; permissions
// is Go's FileMode string of the entry itself ("drwxr-xr-x", "Lrwxrwxrwx"). The envd client reads
// what it uses.
struct entry_info {
    std::string name;
    entry_type type = entry_type::unspecified;
    std::string path;
    std::int64_t size = 0;   // never negative (the parser refuses one)
    std::uint32_t mode = 0;  // permission bits (07777); the parser also reads Go's FileMode bits
    std::string permissions;
    std::string owner;
    std::string group;
    std::int64_t modified_seconds = 0;  // modifiedTime (absent when both are 0)
    std::int32_t modified_nanos = 0;
    std::optional<std::string> symlink_target;
    // The file's user-defined metadata (envd 0.6.2 and later); written only when not empty. The
    // parser leaves out entries that break moat's metadata rules (files.hpp).
    file_metadata metadata;
};

// The EntryInfo object (int64 size as a string, modifiedTime RFC 3339, symlinkTarget only when
// set, metadata only when there is some).
void write_entry_info(json_writer& out, const entry_info& entry);
// The "metadata" member of an EntryInfo (or of an upload reply's entry); nothing when empty.
void write_metadata(json_writer& out, const file_metadata& metadata);

// {"entry": EntryInfo}: Stat, MakeDir, Move.
std::string encode_entry_response(const entry_info& entry);
result<entry_info> parse_entry_response(std::string_view json);
// {"entries": [EntryInfo]}: ListDir. More than `max_entries` entries is too_large.
std::string encode_list_dir_response(const std::vector<entry_info>& entries);
result<std::vector<entry_info>> parse_list_dir_response(std::string_view json,
                                                        std::size_t max_entries);

// The requests, each a JSON object; a path that is absent or not a string is "" (envd's
// home directory). {"path"}: Stat, MakeDir, Remove.
std::string encode_path_request(std::string_view path);
result<std::string> parse_path_request(std::string_view json);
// {"path","depth"}: ListDir. depth 0 is what the client left unset (envd reads it as 1).
struct list_dir_request {
    std::string path;
    std::uint32_t depth = 0;
};
std::string encode_list_dir_request(const list_dir_request& request);
result<list_dir_request> parse_list_dir_request(std::string_view json);
// {"source","destination"}: Move.
struct move_request {
    std::string source;
    std::string destination;
};
std::string encode_move_request(const move_request& request);
result<move_request> parse_move_request(std::string_view json);

// GET and POST /files' query: each parameter as sent (decoded once), nullopt when absent.
struct files_query {
    std::optional<std::string> path;
    std::optional<std::string> username;
    std::optional<std::string> signature;
    std::optional<std::string> signature_expiration;
};
std::string encode_files_query(const files_query& query);
result<files_query> parse_files_query(std::string_view query);

}  // namespace moat::e2b_protocol
