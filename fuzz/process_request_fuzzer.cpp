// libFuzzer target for the envd process service's request parsers (src/serve/process_requests.hpp):
// Start, the selector of Connect and CloseStdin, SendInput, SendSignal and Update. The first byte
// picks the parser; the rest is its input. What parses must hold together; what does not is an
// invalid_argument naming the field.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_process_request_fuzzer &&
//   build/fuzz/fuzz/moat_process_request_fuzzer -max_total_time=60 fuzz/corpus/process_request
#include "serve/process_requests.hpp"

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace serve = moat::serve;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

template <class R>
bool parsed(const R& r) {
    if (!r) require(r.error().code == moat::errc::invalid_argument && !r.error().detail.empty());
    return static_cast<bool>(r);
}

void check_selector(const serve::process_selector& s) {
    require(s.pid.has_value() || s.tag.has_value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 5) {
        case 0: {
            auto r = serve::parse_start_request(input);
            if (parsed(r)) {
                require(!r->process.cmd.empty());
                for (const auto& [k, v] : r->process.envs) {
                    require(!k.empty() && k.find('=') == std::string_view::npos);
                }
                serve::process_info info;
                info.config = r->process;
                info.tag = r->tag;
                require(!serve::encode_list_response({info}).empty());
            }
            break;
        }
        case 1: {
            auto r = serve::parse_selector_request(input);
            if (parsed(r)) check_selector(*r);
            break;
        }
        case 2: {
            auto r = serve::parse_send_input_request(input);
            if (parsed(r)) {
                check_selector(r->process);
                require(r->bytes.size() <= input.size());
                require(!serve::encode_data_event(moat::output_channel::out, r->bytes).empty());
            }
            break;
        }
        case 3: {
            auto r = serve::parse_send_signal_request(input);
            if (parsed(r)) {
                check_selector(r->process);
                require(r->signal == 0 || r->signal == SIGKILL || r->signal == SIGTERM);
            }
            break;
        }
        default: {
            auto r = serve::parse_update_request(input);
            if (parsed(r)) check_selector(r->process);
            break;
        }
    }
    return 0;
}
