// libFuzzer target for HTTP/1.1 request framing: everything the server accepts from a client.
// The first byte picks the slicing and the caps (fuzz/http_framing_fuzz.hpp).
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_http_request_fuzzer &&
//   build/fuzz/fuzz/moat_http_request_fuzzer -max_total_time=60 fuzz/corpus/http_request
#include "http_framing_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    moat::fuzz::drive(moat::http::message_parser::mode::request, data, size);
    return 0;
}
