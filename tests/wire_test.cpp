// The wire format between the library, the helper and the agent: what the library accepts from
// the (untrusted) agent, and the exec record codec.
#include "wire/protocol.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

namespace wire = moat::wire;

TEST_CASE("an exec record round-trips argv, env and cwd") {
    const std::vector<std::string> argv = {"python3", "-c", "print('hi')", ""};
    const std::vector<std::string> env = {"PATH=/usr/bin", "EMPTY="};
    std::vector<std::byte> record;
    REQUIRE(wire::encode_exec(9, 1500, argv, env, "/workspace", record));
    wire::exec_request_view view;
    REQUIRE(wire::decode_exec(record, view));
    CHECK(view.exec_id == 9);
    CHECK(view.wall_limit_ms == 1500);
    REQUIRE(view.argv.size() == 4);
    CHECK(view.argv[2] == "print('hi')");
    CHECK(view.argv[3].empty());
    REQUIRE(view.env.size() == 2);
    CHECK(view.env[1] == "EMPTY=");
    CHECK(view.cwd == "/workspace");
}

TEST_CASE("the exec encoder refuses NUL bytes, empty argv and oversize records") {
    std::vector<std::byte> record;
    const std::vector<std::string> nul = {std::string("a\0b", 3)};
    CHECK_FALSE(wire::encode_exec(1, 0, nul, {}, "/", record));
    CHECK_FALSE(wire::encode_exec(1, 0, {}, {}, "/", record));
    const std::vector<std::string> huge = {std::string(wire::max_message_bytes, 'x')};
    CHECK_FALSE(wire::encode_exec(1, 0, huge, {}, "/", record));
    const std::vector<std::string> argv = {"true"};
    const std::vector<std::string> bad_env = {"NOEQUALS"};
    CHECK_FALSE(wire::encode_exec(1, 0, argv, bad_env, "/", record));
    CHECK(record.empty());
}

TEST_CASE("a terminal's size travels only with exec_terminal, each side 1..1000") {
    const std::vector<std::string> argv = {"bash"};
    std::vector<std::byte> record;
    REQUIRE(wire::encode_exec(3, 0, argv, {}, "/", record, wire::exec_terminal, {40, 1000}));
    wire::exec_request_view view;
    REQUIRE(wire::decode_exec(record, view));
    CHECK(view.flags == wire::exec_terminal);
    CHECK(view.rows == 40);
    CHECK(view.cols == 1000);
    std::vector<std::byte> refused;
    CHECK_FALSE(wire::encode_exec(3, 0, argv, {}, "/", refused, wire::exec_terminal, {0, 80}));
    CHECK_FALSE(wire::encode_exec(3, 0, argv, {}, "/", refused, wire::exec_terminal, {24, 1001}));
    CHECK_FALSE(wire::encode_exec(3, 0, argv, {}, "/", refused, wire::exec_none, {24, 80}));
    CHECK(refused.empty());
    // A record that lies about either is refused by the agent's decoder.
    for (const std::uint32_t flags : {0u, std::uint32_t{wire::exec_terminal}}) {
        auto forged = record;
        wire::exec_message m{};
        std::memcpy(&m, forged.data(), sizeof m);
        m.flags = flags;
        m.rows = flags == 0 ? 40 : 0;
        std::memcpy(forged.data(), &m, sizeof m);
        CHECK_FALSE(wire::decode_exec(forged, view));
    }
}

TEST_CASE("the exec decoder rejects every truncation and a missing terminator") {
    const std::vector<std::string> argv = {"echo", "hello"};
    const std::vector<std::string> env = {"A=1"};
    std::vector<std::byte> record;
    REQUIRE(wire::encode_exec(1, 0, argv, env, "/tmp", record));
    for (std::size_t cut = 0; cut < record.size(); ++cut) {
        std::vector<std::byte> shorter(record.begin(), record.begin() + static_cast<long>(cut));
        wire::exec_request_view view;
        CHECK_FALSE(wire::decode_exec(shorter, view));
    }
    auto unterminated = record;
    unterminated.back() = std::byte{'x'};
    wire::exec_request_view view;
    CHECK_FALSE(wire::decode_exec(unterminated, view));
}

TEST_CASE("fixed messages are accepted only with their exact type and size") {
    auto exited = wire::make_message<wire::exited_message>(wire::message_type::exited);
    exited.exec_id = 5;
    const auto bytes = std::as_bytes(std::span(&exited, 1));
    wire::exited_message out{};
    CHECK(wire::read_fixed(bytes, wire::message_type::exited, out));
    CHECK(out.exec_id == 5);
    CHECK_FALSE(wire::read_fixed(bytes, wire::message_type::started, out));
    CHECK_FALSE(wire::read_fixed(bytes.first(bytes.size() - 1), wire::message_type::exited, out));
    auto lying = exited;
    lying.h.size = 1000;
    CHECK_FALSE(
        wire::read_fixed(std::as_bytes(std::span(&lying, 1)), wire::message_type::exited, out));
}

TEST_CASE("a unix socket path must be absolute, NUL-free and fit sun_path") {
    CHECK(wire::unix_path_problem("/tmp/s") == nullptr);
    CHECK(wire::unix_path_problem("/" + std::string(106, 'x')) == nullptr);
    CHECK(wire::unix_path_problem("/" + std::string(107, 'x')) != nullptr);
    CHECK(wire::unix_path_problem("") != nullptr);
    CHECK(wire::unix_path_problem("tmp/s") != nullptr);
    CHECK(wire::unix_path_problem(std::string_view("/tmp/a\0b", 8)) != nullptr);
    // The longest valid path fills the field with its terminator.
    auto m = wire::make_message<wire::connect_unix_message>(wire::message_type::connect_unix);
    const std::string longest = "/" + std::string(106, 'x');
    wire::copy_field(m.path, longest);
    CHECK(wire::read_field(m.path) == longest);
    wire::connect_unix_message out{};
    CHECK(wire::read_fixed(std::as_bytes(std::span(&m, 1)), wire::message_type::connect_unix, out));
    CHECK(wire::read_field(out.path) == longest);
}

TEST_CASE("a watch_dir record round-trips its paths and refuses bad ones and every truncation") {
    std::vector<std::byte> record;
    REQUIRE(wire::encode_watch_dir(7, 0x2c6, "/workspace/r", "a/b", record));
    wire::watch_dir_view view;
    REQUIRE(wire::decode_watch_dir(record, view));
    CHECK(view.request_id == 7);
    CHECK(view.mask == 0x2c6);
    CHECK(view.base == "/workspace/r");
    CHECK(view.relative == "a/b");
    for (std::size_t cut = 0; cut < record.size(); ++cut) {
        std::vector<std::byte> shorter(record.begin(), record.begin() + cut);
        if (shorter.size() >= sizeof(wire::header)) {
            auto size = static_cast<std::uint32_t>(cut);
            std::memcpy(shorter.data() + offsetof(wire::header, size), &size, sizeof size);
        }
        CHECK_FALSE(wire::decode_watch_dir(shorter, view));
    }
    std::vector<std::byte> refused;
    CHECK_FALSE(wire::encode_watch_dir(1, 0, "relative", "", refused));
    CHECK_FALSE(wire::encode_watch_dir(1, 0, "", "", refused));
    CHECK_FALSE(wire::encode_watch_dir(1, 0, std::string_view("/a\0b", 4), "", refused));
    CHECK_FALSE(wire::encode_watch_dir(1, 0, "/a", std::string_view("b\0", 2), refused));
    CHECK_FALSE(
        wire::encode_watch_dir(1, 0, "/" + std::string(4000, 'x'), std::string(95, 'y'), refused));
    CHECK(refused.empty());
}
