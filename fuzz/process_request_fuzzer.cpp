// libFuzzer target for the envd process service's request parsers, which moat serve runs
// (src/e2b_protocol/process_messages.hpp): Start, the selector of Connect and CloseStdin,
// SendInput, SendSignal and Update. The first byte picks the parser; the rest is its input. What
// parses must hold together and read back the same once the client's writer wrote it; what does
// not is an invalid_argument naming the field.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_process_request_fuzzer &&
//   build/fuzz/fuzz/moat_process_request_fuzzer -max_total_time=60 fuzz/corpus/process_request
#include "e2b_protocol/process_messages.hpp"

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace protocol = moat::e2b_protocol;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

template <class R>
bool parsed(const R& r) {
    if (!r) require(r.error().code == moat::errc::invalid_argument && !r.error().detail.empty());
    return static_cast<bool>(r);
}

void check_selector(const protocol::process_selector& s) {
    require(s.pid.has_value() || s.tag.has_value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 5) {
        case 0: {
            auto r = protocol::parse_start_request(input);
            if (parsed(r)) {
                require(!r->process.cmd.empty());
                for (const auto& [k, v] : r->process.envs) {
                    require(!k.empty() && k.find('=') == std::string_view::npos);
                }
                protocol::listed_process info;
                info.config = r->process;
                info.tag = r->tag;
                require(!protocol::encode_list_response({info}).empty());
                auto again = protocol::parse_start_request(protocol::encode_start_request(*r));
                require(again.has_value() && again->process.args == r->process.args &&
                        again->process.envs == r->process.envs && again->tag == r->tag);
            }
            break;
        }
        case 1: {
            auto r = protocol::parse_selector_request(input);
            if (parsed(r)) check_selector(*r);
            break;
        }
        case 2: {
            auto r = protocol::parse_send_input_request(input);
            if (parsed(r)) {
                check_selector(r->process);
                require(r->bytes.size() <= input.size());
                auto again =
                    protocol::parse_send_input_request(protocol::encode_send_input_request(*r));
                require(again.has_value() && again->bytes == r->bytes);
                require(!protocol::encode_data_event(moat::output_channel::out, r->bytes).empty());
            }
            break;
        }
        case 3: {
            auto r = protocol::parse_send_signal_request(input);
            if (parsed(r)) {
                check_selector(r->process);
                require(r->signal == 0 || r->signal == SIGKILL || r->signal == SIGTERM);
            }
            break;
        }
        default: {
            auto r = protocol::parse_update_request(input);
            if (parsed(r)) check_selector(r->process);
            break;
        }
    }
    return 0;
}
