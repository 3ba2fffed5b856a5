// moat serve: an E2B-compatible sandbox host on this machine (control plane + envd), driven by
// the official E2B SDKs (docs/serve.md). One line per listener on stdout; logs on stderr.
#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "cli/commands.hpp"
#include "cli/stderr_log.hpp"
#include "serve/serve_host.hpp"

#include <asio/ip/address.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace moat::cli {
namespace {

asio::ip::tcp::endpoint parse_listen(std::string_view flag, const std::string& text) {
    // HOST:PORT, with [v6]:PORT for IPv6.
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
        throw usage_error(std::string(flag) + ": '" + text + "' is not HOST:PORT");
    }
    std::string host = text.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    if (host == "localhost") host = "127.0.0.1";
    const auto port = parse_unsigned(text.substr(colon + 1));
    std::error_code ec;
    const auto address = asio::ip::make_address(host, ec);
    if (ec || !port || *port > 65535) {
        throw usage_error(std::string(flag) + ": '" + text +
                          "' is not HOST:PORT (an IP address or localhost, a port 0-65535)");
    }
    return {address, static_cast<unsigned short>(*port)};
}

std::string read_key_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw usage_error("--api-key-file: cannot read " + path);
    std::ostringstream text;
    text << in.rdbuf();
    std::string key = text.str();
    while (!key.empty() &&
           (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) {
        key.pop_back();
    }
    if (key.empty()) throw usage_error("--api-key-file: " + path + " is empty");
    if (key.size() > 4096) throw usage_error("--api-key-file: " + path + " is over 4096 bytes");
    return key;
}

// --domain: a DNS name (labels of letters, digits and '-', not at a label's ends), stored lower
// case without its trailing dot.
std::string parse_domain(const std::string& text) {
    std::string name = text;
    if (name.ends_with('.')) name.pop_back();
    bool valid = !name.empty() && name.size() <= 253;
    std::size_t label = 0;
    for (std::size_t i = 0; valid && i <= name.size(); ++i) {
        const char c = i < name.size() ? name[i] : '.';
        if (c == '.') {
            valid = label > 0 && label <= 63 && name[i - 1] != '-';
            label = 0;
        } else if (std::isalnum(static_cast<unsigned char>(c)) != 0 || (c == '-' && label > 0)) {
            name[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            ++label;
        } else {
            valid = false;
        }
    }
    if (!valid) {
        throw usage_error("--domain: '" + text +
                          "' is not a DNS name (labels of letters, digits and '-', separated by "
                          "dots)");
    }
    return name;
}

serve::serve_options parse_serve_options(int argc, char** argv) {
    serve::serve_options o;
    std::string key_file;
    network_flags network;
    for (int i = 0; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (auto listen = flag_value("--listen", argc, argv, i)) {
            o.api_listen = parse_listen("--listen", *listen);
        } else if (auto envd = flag_value("--envd-listen", argc, argv, i)) {
            o.envd_listen = parse_listen("--envd-listen", *envd);
        } else if (auto file = flag_value("--api-key-file", argc, argv, i)) {
            key_file = *file;
        } else if (auto cert = flag_value("--tls-cert", argc, argv, i)) {
            o.tls_certificate_file = *cert;
        } else if (auto tls_key = flag_value("--tls-key", argc, argv, i)) {
            o.tls_key_file = *tls_key;
        } else if (auto max = flag_value("--max-sandboxes", argc, argv, i)) {
            const auto n = parse_unsigned(*max);
            if (!n || *n < 1 || *n > 100000) {
                throw usage_error("--max-sandboxes: '" + *max +
                                  "' must be a number from 1 to 100000");
            }
            o.max_sandboxes = static_cast<std::size_t>(*n);
        } else if (auto mb = flag_value("--paused-memory-mb", argc, argv, i)) {
            const auto n = parse_unsigned(*mb);
            if (!n || *n > (std::uint64_t{1} << 30)) {
                throw usage_error("--paused-memory-mb: '" + *mb + "' must be a number of MiB");
            }
            o.paused_memory_bytes = *n << 20;
        } else if (auto bytes = flag_value("--max-file-bytes", argc, argv, i)) {
            const auto n = parse_unsigned(*bytes);
            if (!n || *n < 1 || *n > (std::uint64_t{1} << 36)) {
                throw usage_error("--max-file-bytes: '" + *bytes +
                                  "' must be a number of bytes from 1 to 64 GiB");
            }
            o.max_file_bytes = *n;
        } else if (auto domain = flag_value("--domain", argc, argv, i)) {
            o.domain = parse_domain(*domain);
        } else if (auto dir = flag_value("--state-dir", argc, argv, i)) {
            o.state_dir = parse_absolute_path("--state-dir", *dir);
        } else if (arg == "--destroy-on-exit") {
            o.destroy_on_exit = true;
        } else if (arg == "--private-ports") {
            o.private_ports = true;
        } else if (network_flag(argc, argv, i, network)) {
            continue;
        } else {
            throw usage_error("unknown option '" + std::string(arg) + "'");
        }
    }
    o.network = finish_network(network);
    if (o.tls_certificate_file.empty() != o.tls_key_file.empty()) {
        throw usage_error("--tls-cert and --tls-key go together");
    }
    const bool tls = !o.tls_certificate_file.empty();
    for (const auto* e : {&o.api_listen, &o.envd_listen}) {
        if (!tls && !e->address().is_loopback()) {
            throw usage_error("refusing to listen on " + e->address().to_string() +
                              " without TLS: pass --tls-cert and --tls-key, or listen on "
                              "127.0.0.1");
        }
    }
    if (!key_file.empty()) {
        o.api_key = read_key_file(key_file);
    } else if (const char* env = std::getenv("MOAT_API_KEY"); env && *env) {
        o.api_key = env;
    } else {
        throw usage_error("no API key: pass --api-key-file FILE or set MOAT_API_KEY");
    }
    return o;
}

}  // namespace

int serve_command(int argc, char** argv) {
    serve::serve_options options = parse_serve_options(argc, argv);
    install_stderr_log("serve");
    limit_local_network(options.network);
    serve::serve_hooks hooks;
    hooks.announce = [](std::string_view line) {
        std::fprintf(stdout, "%.*s\n", static_cast<int>(line.size()), line.data());
        std::fflush(stdout);
    };
    hooks.report = [](std::string_view line) {
        std::fprintf(stderr, "moat serve: %.*s\n", static_cast<int>(line.size()), line.data());
    };
    return run_with_backend(
        [&options, &hooks](backend& b) { return serve::async_run_serve(b, options, hooks); });
}

}  // namespace moat::cli
