// libFuzzer target for what the envd client parses from a remote envd (src/e2b_protocol):
// process events, process lists, filesystem entries and listings, envd's HTTP error bodies and
// base64 (core/base64.hpp), with round trips through the writers moat serve answers with.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_envd_response_fuzzer &&
//   build/fuzz/fuzz/moat_envd_response_fuzzer -max_total_time=60 fuzz/corpus/envd_response
#include "core/base64.hpp"
#include "e2b_protocol/error_body.hpp"
#include "e2b_protocol/filesystem_messages.hpp"
#include "e2b_protocol/process_messages.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace protocol = moat::e2b_protocol;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);

    auto event = protocol::parse_process_event(text);
    if (!event) {
        require(event.error().code == moat::errc::protocol_error);
    } else if (const auto* end = std::get_if<protocol::end_event>(&*event)) {
        const auto r = protocol::result_from_end(*end);
        require(r.signal >= 0 && r.signal < 65);
        if (!end->exited) require(r.signal > 0 && r.exit_code == 128 + r.signal);
        require(protocol::parse_process_event(protocol::encode_end_event(*end)).has_value());
    } else if (const auto* start = std::get_if<protocol::start_event>(&*event)) {
        require(start->pid != 0);
    } else if (const auto* chunk = std::get_if<protocol::data_event>(&*event)) {
        auto again = protocol::parse_process_event(
            protocol::encode_data_event(chunk->channel, chunk->bytes));
        require(again.has_value() && std::get<protocol::data_event>(*again).bytes == chunk->bytes);
    }

    (void)protocol::parse_list_response(text);
    auto entry = protocol::parse_entry_response(text);
    if (entry) {
        require(entry->mode <= 07777 && entry->size >= 0);
        auto again = protocol::parse_entry_response(protocol::encode_entry_response(*entry));
        require(again.has_value() && again->path == entry->path && again->size == entry->size);
    }
    constexpr std::size_t cap = 16;
    auto listing = protocol::parse_list_dir_response(text, cap);
    if (listing) require(listing->size() <= cap);

    const auto message = protocol::parse_envd_error_message(text);
    require(message.size() <= 200);
    require(message.find('\n') == std::string::npos);

    // base64: what decodes re-encodes to itself (modulo padding), and every byte string
    // round-trips.
    require(moat::base64_decode(moat::base64_encode(text)) == std::string(text));
    if (auto decoded = moat::base64_decode(text)) {
        require(moat::base64_decode(moat::base64_encode(*decoded)) == *decoded);
    }
    return 0;
}
