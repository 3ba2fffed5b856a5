// libFuzzer target for what the envd client parses from a remote envd (src/e2b/envd_responses.cpp):
// process events, process lists, filesystem entries and listings, envd's HTTP error bodies and
// base64, with round trips through the encoders where one exists.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_envd_response_fuzzer &&
//   build/fuzz/fuzz/moat_envd_response_fuzzer -max_total_time=60 fuzz/corpus/envd_response
#include "e2b/envd_responses.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace e2b = moat::e2b;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);

    auto event = e2b::parse_process_event(text);
    if (!event) {
        require(event.error().code == moat::errc::protocol_error);
    } else if (const auto* end = std::get_if<e2b::end_event>(&*event)) {
        const auto r = e2b::result_from_end(*end);
        require(r.signal >= 0 && r.signal < 65);
        if (!end->exited) require(r.signal > 0 && r.exit_code == 128 + r.signal);
    } else if (const auto* start = std::get_if<e2b::start_event>(&*event)) {
        require(start->pid != 0);
    }

    (void)e2b::parse_list_response(text);
    auto entry = e2b::parse_entry_response(text);
    if (entry) require(entry->mode <= 07777);
    constexpr std::size_t cap = 16;
    auto listing = e2b::parse_list_dir_response(text, cap);
    if (listing) require(listing->size() <= cap);

    const auto message = e2b::parse_envd_error_message(text);
    require(message.size() <= 200);
    require(message.find('\n') == std::string::npos);

    // base64: what decodes re-encodes to itself (modulo padding), and every byte string
    // round-trips.
    require(e2b::base64_decode(e2b::base64_encode(text)) == std::string(text));
    if (auto decoded = e2b::base64_decode(text)) {
        require(e2b::base64_decode(e2b::base64_encode(*decoded)) == *decoded);
    }
    return 0;
}
