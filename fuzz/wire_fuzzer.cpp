// libFuzzer target for the wire format parsers: everything the library accepts from a sandbox's
// agent (fixed records) and everything the agent accepts from the library (exec, connect_unix and
// watch_dir records).
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_wire_fuzzer &&
//   build/fuzz/fuzz/moat_wire_fuzzer -max_total_time=60 fuzz/corpus/wire
#include "wire/protocol.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace wire = moat::wire;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto record = std::as_bytes(std::span(data, size));
    wire::header h{};
    (void)wire::read_header(record, h);

    wire::exec_request_view view;
    if (wire::decode_exec(record, view)) {
        // Whatever decodes must re-encode to the same bytes.
        std::vector<std::string> argv(view.argv.begin(), view.argv.end());
        std::vector<std::string> env(view.env.begin(), view.env.end());
        std::vector<std::byte> again;
        // With the same flags and terminal size (encode and decode share their rules), every byte
        // comes back as it was.
        const wire::terminal_size terminal{view.rows, view.cols};
        if (!wire::encode_exec(view.exec_id, view.wall_limit_ms, argv, env, view.cwd, again,
                               view.flags, terminal)) {
            __builtin_trap();
        }
        const std::vector<std::byte> expected(record.begin(), record.end());
        if (again != expected) __builtin_trap();
    }

    wire::ready_message ready{};
    (void)wire::read_fixed(record, wire::message_type::ready, ready);
    wire::started_message started{};
    (void)wire::read_fixed(record, wire::message_type::started, started);
    wire::exited_message exited{};
    (void)wire::read_fixed(record, wire::message_type::exited, exited);
    wire::port_connected_message connected{};
    (void)wire::read_fixed(record, wire::message_type::port_connected, connected);
    // What the agent accepts from the library: a connect_unix path is read only within its field.
    wire::connect_unix_message connect_unix{};
    if (wire::read_fixed(record, wire::message_type::connect_unix, connect_unix)) {
        const auto path = wire::read_field(connect_unix.path);
        if (path.size() > sizeof connect_unix.path) __builtin_trap();
        (void)wire::unix_path_problem(path);
    }
    // A watch_dir record: whatever decodes re-encodes to the same bytes (reserved zeroed).
    wire::watch_dir_view watch;
    if (wire::decode_watch_dir(record, watch)) {
        std::vector<std::byte> again;
        if (!wire::encode_watch_dir(watch.request_id, watch.mask, watch.base, watch.relative,
                                    again)) {
            __builtin_trap();
        }
        std::vector<std::byte> expected(record.begin(), record.end());
        std::memset(expected.data() + offsetof(wire::watch_dir_message, reserved), 0,
                    sizeof(wire::watch_dir_message::reserved));
        if (again != expected) __builtin_trap();
    }
    wire::watch_added_message added{};
    (void)wire::read_fixed(record, wire::message_type::watch_added, added);
    // Pause (wire 11): the agent reads set_paused, the library paused_set.
    wire::set_paused_message set_paused{};
    (void)wire::read_fixed(record, wire::message_type::set_paused, set_paused);
    wire::paused_set_message paused_set{};
    (void)wire::read_fixed(record, wire::message_type::paused_set, paused_set);
    wire::created_message created{};
    if (wire::read_fixed(record, wire::message_type::created, created)) {
        (void)wire::read_field(created.memory_cgroup);
        (void)wire::read_field(created.pids_cgroup);
    }
    return 0;
}
