// libFuzzer target for HTTP/1.1 response framing: everything the client accepts from a server.
// The first byte picks the slicing, the caps and whether the response answers a HEAD request
// (fuzz/http_framing_fuzz.hpp).
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_http_response_fuzzer &&
//   build/fuzz/fuzz/moat_http_response_fuzzer -max_total_time=60 fuzz/corpus/http_response
#include "http_framing_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    moat::fuzz::drive(moat::http::message_parser::mode::response, data, size);
    return 0;
}
