// What `moat serve` is configured with (src/cli/serve_command.cpp parses the command line into
// this; docs/serve.md describes each option).
#pragma once

#include <moat/sandbox_spec.hpp>

#include <asio/ip/tcp.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace moat::serve {

struct serve_options {
    // The control plane (E2B's REST API) and envd (the data plane) listeners. Port 0: any free.
    asio::ip::tcp::endpoint api_listen{asio::ip::make_address("127.0.0.1"), 3000};
    asio::ip::tcp::endpoint envd_listen{asio::ip::make_address("127.0.0.1"), 49983};
    // The key every control-plane request carries in X-API-Key. Never logged.
    std::string api_key;
    // PEM certificate chain and key: both listeners speak TLS when set.
    std::string tls_certificate_file;
    std::string tls_key_file;
    // Live sandboxes at most, paused ones included; a create past it answers 429. 0: the
    // runtime's own cap.
    std::size_t max_sandboxes = 0;
    // The memory paused sandboxes may hold together: past it, the one paused longest ago is
    // ended (sandbox_pause.hpp). 0: no budget.
    std::uint64_t paused_memory_bytes = 0;
    // On SIGINT/SIGTERM, destroy (confirmed) every sandbox this server created instead of
    // leaving them to their E2B timeout.
    bool destroy_on_exit = false;
    // Where the server secret and the sandboxes' sidecar records live (0700). Empty: "serve" in
    // the local backend's state directory.
    std::string state_dir;
    // Where the backend's templates live (templates.hpp); empty: the backend's host report says
    // (the local backend's data directory), else there are none but "base".
    std::string data_dir;
    // E2B's sandbox domain: envd takes a Host `49983-<id>.<domain>` (any port; the CLI stores it
    // lower case without a trailing dot) as naming sandbox <id>, and on a loopback listener serves
    // no other name but the loopback ones. Empty: no Host names a sandbox (clients send
    // E2b-Sandbox-Id, as the SDKs do with E2B_SANDBOX_URL).
    std::string domain;
    // Ports (`<port>-<id>.<domain>`, or E2b-Sandbox-Port): a sandbox whose create does not say
    // (network.allowPublicTraffic) gets private ports, reached only with its trafficAccessToken.
    // E2B's default, and moat's without --private-ports, is public.
    bool private_ports = false;
    // Proxied connections to one sandbox's ports open at once; one more gets 429.
    std::size_t max_port_connections = 64;
    // A proxied port connection is closed after this long without a byte either way.
    std::chrono::milliseconds port_idle_timeout{15 * 60 * 1000};
    // A Code Interpreter cell (port 49999) runs at most this long: then it is interrupted, and
    // killed 2 s later if it has not ended.
    std::chrono::milliseconds code_cell_limit{15 * 60 * 1000};
    // A file uploaded through envd is refused past this (413).
    std::uint64_t max_file_bytes = 100ull * 1024 * 1024;
    // The network of every sandbox this server creates (--allow-host, --resolve,
    // --allow-address, --network): an operator setting that no request can change.
    sandbox_network network;
};

}  // namespace moat::serve
