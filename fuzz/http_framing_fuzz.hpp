// The shared body of the HTTP request and response framing fuzzers: the input's first byte picks
// how the rest is sliced and whether caps are small, then the parser is driven exactly as the
// server and the client drive it, checking what must hold whatever the bytes.
#pragma once

#include "http/message.hpp"
#include "http/message_parser.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moat::fuzz {

inline void check(bool ok) {
    if (!ok) __builtin_trap();
}

// A head that parsed and that the writer accepts must parse again to the same head.
inline void check_request_round_trip(const http::request_head& head) {
    std::string wire;
    if (!http::append_request_head(wire, head)) return;
    http::message_parser again(http::message_parser::mode::request);
    const auto e = again.feed(wire);
    check(e.what == http::parse_event::kind::head);
    check(again.request().method == head.method);
    check(again.request().target == head.target);
    check(again.request().headers.size() == head.headers.size());
}

inline void check_response_round_trip(const http::response_head& head) {
    std::string wire;
    if (!http::append_response_head(wire, head)) return;
    http::message_parser again(http::message_parser::mode::response);
    const auto e = again.feed(wire);
    if (head.status < 200) return;  // an interim response ends at once: fine either way
    check(e.what == http::parse_event::kind::head);
    check(again.response().status == head.status);
    check(again.response().headers.size() == head.headers.size());
}

inline void drive(http::message_parser::mode mode, const std::uint8_t* data, std::size_t size) {
    if (size == 0) return;
    const std::uint8_t control = data[0];
    const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
    http::parser_limits limits;
    if ((control & 0x80) != 0) {
        limits.max_head_bytes = 256;
        limits.max_header_count = 4;
        limits.max_trailer_bytes = 64;
    }
    const std::size_t step = (control & 0x0f) == 0 ? input.size() + 1 : (control & 0x0f);
    const bool body_limit = (control & 0x10) != 0;
    http::message_parser p(mode, limits);
    if (mode == http::message_parser::mode::response && (control & 0x20) != 0) p.expect_no_body();

    std::uint64_t body_seen = 0;
    bool failed = false;
    auto act = [&](const http::parse_event& e, std::string_view slice) {
        using kind = http::parse_event::kind;
        check(e.consumed <= slice.size());
        switch (e.what) {
            case kind::head:
                body_seen = 0;
                check(p.is_in_body() || p.is_between_messages());
                if (mode == http::message_parser::mode::request) {
                    check(!p.request().method.empty());
                    check(p.request().headers.find_all("host").size() <= 1);
                    check_request_round_trip(p.request());
                } else {
                    check(p.response().status >= 100 && p.response().status <= 999);
                    check_response_round_trip(p.response());
                }
                if (body_limit) (void)p.set_body_limit(32);
                break;
            case kind::body:
                check(!e.body.empty());
                check(e.body.data() >= slice.data() &&
                      e.body.data() + e.body.size() <= slice.data() + slice.size());
                body_seen += e.body.size();
                check(body_seen == p.body_bytes());
                if (body_limit) check(body_seen <= 32);
                break;
            case kind::end:
                check(p.is_between_messages());
                break;
            case kind::error:
                check(p.error() != http::parse_error::none);
                check(!p.error_detail().empty());
                failed = true;
                break;
            case kind::need_more:
                check(e.consumed == slice.size());
                break;
        }
    };

    std::size_t offset = 0;
    while (offset < input.size() && !failed) {
        std::string_view slice = input.substr(offset, step);
        offset += slice.size();
        const std::size_t bound = 4 * slice.size() + 8;
        // Every event but need_more makes progress or is followed by one that does: bound the
        // events per slice so a parser that stops advancing is a finding, not a hang.
        for (std::size_t events = 0; !failed; ++events) {
            check(events < bound);
            const auto e = p.feed(slice);
            act(e, slice);
            slice.remove_prefix(e.consumed);
            if (e.what == http::parse_event::kind::need_more) break;
        }
    }
    if (!failed) {
        for (int i = 0; i < 3 && !failed; ++i) {
            const auto e = p.finish();
            act(e, {});
            if (e.what == http::parse_event::kind::need_more) break;
        }
    }
}

}  // namespace moat::fuzz
