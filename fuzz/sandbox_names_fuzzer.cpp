// libFuzzer target for how `moat serve` reads a sandbox and port from a request
// (src/serve/sandbox_names.hpp): a Host `<port>-<id>.<domain>`, E2b-Sandbox-Id and
// E2b-Sandbox-Port. The input is split at NUL bytes into the Host, the domain and the two header
// values. Whatever names a sandbox must name one the domain's form spells: the id non-empty and
// without a dot, the port 1-65535, and the same name written back parses to the same.
//
//   cmake --preset fuzz && cmake --build --preset fuzz --target moat_sandbox_names_fuzzer &&
//   build/fuzz/fuzz/moat_sandbox_names_fuzzer -max_total_time=20 fuzz/corpus/sandbox_names
#include "serve/sandbox_names.hpp"

#include "core/ascii.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace serve = moat::serve;

namespace {

void require(bool condition) {
    if (!condition) __builtin_trap();
}

std::vector<std::string_view> split(std::string_view input) {
    std::vector<std::string_view> parts;
    for (;;) {
        const auto nul = input.find('\0');
        parts.push_back(input.substr(0, nul));
        if (nul == std::string_view::npos) break;
        input.remove_prefix(nul + 1);
    }
    parts.resize(4);
    return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    const auto parts = split(input);
    const std::string_view host = parts[0], domain = parts[1];

    if (const auto named = serve::parse_sandbox_host(host, domain)) {
        require(!domain.empty());
        require(!named->id.empty() && named->id.find('.') == std::string_view::npos);
        require(named->port >= 1);
        const std::string again =
            std::to_string(named->port) + "-" + std::string(named->id) + "." + std::string(domain);
        const auto reparsed = serve::parse_sandbox_host(again, domain);
        require(reparsed && reparsed->id == named->id && reparsed->port == named->port);
        require(serve::sandbox_id_in_host(host, domain) ==
                (named->port == serve::envd_port ? named->id : std::string_view{}));
    } else {
        require(serve::sandbox_id_in_host(host, domain).empty());
    }

    moat::http::request_head head;
    head.headers.add("Host", std::string(host));
    if (!parts[2].empty()) head.headers.add("E2b-Sandbox-Id", std::string(parts[2]));
    if (!parts[3].empty()) head.headers.add("E2b-Sandbox-Port", std::string(parts[3]));
    if (const auto port = serve::requested_port(head, domain)) {
        require(port->port != serve::envd_port);
        if (port->port == 0) require(!moat::detail::parse_port(parts[3]));
    }
    (void)serve::requested_sandbox_id(head, domain);
    return 0;
}
