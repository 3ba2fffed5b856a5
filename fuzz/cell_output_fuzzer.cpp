// libFuzzer target for cell_output: arbitrary bytes on the driver's results channel (a sandboxed
// program can write there), fed in chunks whose sizes come from the input.
// Checks: every byte fed is accounted for (as output, a header, an end record or leftover),
// memory stays bounded, and an end record never exceeds its limit.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_cell_output_fuzzer &&
//   build/fuzz/fuzz/moat_cell_output_fuzzer -max_total_time=60 fuzz/corpus/cell_output
#include "tools/cell_output.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    const std::size_t chunk = 1 + data[0] % 17;
    const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
    const moat::output_limits limits{4096, 4096};
    moat::cell_output reader(limits);
    std::uint64_t streamed = 0;
    reader.on_output([&](moat::output_channel, std::string_view d) { streamed += d.size(); });
    for (std::size_t at = 0; at < input.size(); at += chunk) reader.feed(input.substr(at, chunk));
    const auto status = moat::parse_marker_line(reader.status_line());
    (void)status;
    const auto leftover = reader.take_leftover();
    const auto out = reader.finish_out();
    const auto err = reader.finish_err();
    if (out.total_bytes + err.total_bytes != streamed) std::abort();
    if (streamed + leftover.size() > input.size()) std::abort();
    if (reader.is_broken() && reader.is_done()) std::abort();
    if (!reader.is_done() && !leftover.empty()) std::abort();
    if (reader.status_line().size() > moat::cell_output::max_status_line) std::abort();
    if (out.head.size() > limits.head_bytes || out.tail.size() > limits.tail_bytes) std::abort();
    return 0;
}
