// envd's directory watches (package `filesystem`, proto3 JSON): WatchDir's request and its
// stream's messages ({"start":{}}, {"filesystem":FilesystemEvent}, {"keepalive":{}}), and the
// polling variant's CreateWatcher ({"path","recursive","includeEntry"} -> {"watcherId"}),
// GetWatcherEvents ({"watcherId"} -> {"events":[FilesystemEvent]}) and RemoveWatcher
// ({"watcherId"} -> {}). moat serve parses the requests and writes the replies; the e2b backend
// does not watch (so nothing here parses a reply). Unit-tested in tests/e2b_protocol_test.cpp.
//
// A request parser fails with errc::invalid_argument naming the field, never its value.
#pragma once

#include "e2b_protocol/filesystem_messages.hpp"

#include <moat/result.hpp>
#include <moat/watch.hpp>

#include <optional>

#include <string>
#include <string_view>
#include <vector>

namespace moat::e2b_protocol {

// WatchDir and CreateWatcher: the path ("" when absent: the user's home, as envd), whether
// recursive, and includeEntry (each event then carries the entry's EntryInfo when its path
// still exists).
struct watch_dir_request {
    std::string path;
    bool recursive = false;
    bool include_entry = false;
};
result<watch_dir_request> parse_watch_dir_request(std::string_view json);

// "EVENT_TYPE_CREATE", ... (filesystem.EventType).
const char* event_type_name(watch_event_type type) noexcept;

// filesystem.FilesystemEvent: the event, and its entry when the watch asked for entries and the
// path still existed when the event was read (best effort, as envd: none for a removal).
struct filesystem_event {
    watch_event event;
    std::optional<entry_info> entry;
};

// WatchDir's stream messages.
std::string encode_watch_start();
std::string encode_watch_keepalive();
std::string encode_watch_event(const filesystem_event& event);

// {"watcherId"}: GetWatcherEvents, RemoveWatcher (a missing id is "").
result<std::string> parse_watcher_id_request(std::string_view json);
std::string encode_create_watcher_response(std::string_view watcher_id);
std::string encode_watcher_events_response(const std::vector<filesystem_event>& events);

}  // namespace moat::e2b_protocol
