// libFuzzer target for a tool call's arguments (JSON from a model or an MCP client). The first
// byte picks the tool; the rest is the arguments. The same bytes also go through base64_decode
// (write_file's encoding "base64"), which must agree with base64_encode both ways.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_tool_arguments_fuzzer &&
//   build/fuzz/fuzz/moat_tool_arguments_fuzzer -max_total_time=60 fuzz/corpus/tool_arguments
#include "tools/tool_arguments.hpp"

#include "core/base64.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

bool is_blank(std::string_view s) {
    return s.find_first_not_of(" \t\n\r\f\v") == s.npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    constexpr std::string_view tools[] = {"run_python", "run_shell",  "write_file",
                                          "read_file",  "list_files", "run_java"};
    const std::string_view tool = tools[data[0] % std::size(tools)];
    const std::string_view json(reinterpret_cast<const char*>(data) + 1, size - 1);
    constexpr double max_timeout = 600;

    // Whatever decodes re-encodes to text that decodes to the same bytes, and any bytes survive
    // an encode and decode exactly.
    if (const auto decoded = moat::base64_decode(json)) {
        require(moat::base64_decode(moat::base64_encode(*decoded)) == decoded);
    }
    require(moat::base64_decode(moat::base64_encode(json)) == std::string(json));

    const auto r = moat::parse_tool_arguments(tool, json, max_timeout);
    if (!r) {
        require(r.error().code == moat::errc::invalid_argument);
        require(!r.error().detail.empty());
        require(r.error().detail.find('\n') == std::string::npos);
        return 0;
    }
    require(tool != "run_java");
    if (tool == "run_python") require(!is_blank(r->code));
    if (tool == "run_shell") require(!is_blank(r->command));
    if (r->timeout_seconds) require(*r->timeout_seconds > 0 && *r->timeout_seconds <= max_timeout);
    return 0;
}
