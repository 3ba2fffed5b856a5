// libFuzzer target for the JSON-RPC line parser (every line an MCP client sends) and the params
// field readers, with round trips through the writers.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_jsonrpc_fuzzer &&
//   build/fuzz/fuzz/moat_jsonrpc_fuzzer -max_total_time=60 fuzz/corpus/jsonrpc
#include "mcp/jsonrpc.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mcp = moat::mcp;
using kind = mcp::jsonrpc_message::kind;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

bool is_one_line(std::string_view s) {
    return s.find('\n') == std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view line(reinterpret_cast<const char*>(data), size);
    const auto m = mcp::parse_jsonrpc(line, 1 << 20);
    require((m.what == kind::invalid) == (m.error_code != 0));
    require(is_one_line(m.error_message));

    // Whatever id was read is valid JSON: an error reply naming it reads back with the same id.
    const auto reply = mcp::parse_jsonrpc(mcp::jsonrpc_error(m.id, -32600, m.error_message));
    require(reply.what == kind::response);
    require(reply.id == m.id);
    require(is_one_line(mcp::jsonrpc_result(m.id, "{}")));

    if (m.what == kind::request || m.what == kind::notification) {
        // The params text is compact JSON that re-serializes to itself.
        const auto note = mcp::parse_jsonrpc(mcp::jsonrpc_notification(m.method, m.params));
        require(note.what == kind::notification);
        require(note.method == m.method);
        require(note.params == m.params);
        if (!m.params.empty()) {
            require(m.params.front() == '{' || m.params.front() == '[');
            require(is_one_line(m.params));
            // A string field is also a raw field, and a raw field is JSON that parses again.
            if (mcp::string_field(m.params, "name")) {
                require(mcp::raw_field(m.params, "name").has_value());
            }
            if (const auto arguments = mcp::raw_field(m.params, "arguments")) {
                const auto again =
                    mcp::parse_jsonrpc(mcp::jsonrpc_notification("m", "[" + *arguments + "]"));
                require(again.what == kind::notification);
                require(again.params == "[" + *arguments + "]");
            }
        }
    }

    // The readers take any text.
    (void)mcp::string_field(line, "name");
    (void)mcp::raw_field(line, "arguments");
    return 0;
}
