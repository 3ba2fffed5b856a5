// TLS for the HTTP layer: OpenSSL contexts through asio::ssl, and the one-line description of a
// failed handshake.
//
// Client side: TLS 1.2 or later, peer verification on, against the system CA store and/or a CA
// file of the caller's; each connection sends SNI (for a host name, not an IP literal) and checks
// the certificate against the host it dialled (OpenSSL's own host / IP check, wildcards only as a
// whole left-most label). There is no switch that turns verification off.
//
// Server side: TLS 1.2 or later, a certificate chain and private key from PEM files.
//
// Contexts are immutable once made and can be shared by every connection on any thread.
#pragma once

#include <moat/result.hpp>

#include <asio/ip/tcp.hpp>
#include <asio/ssl/context.hpp>
#include <asio/ssl/stream.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <system_error>

namespace moat::http {

using tls_stream = asio::ssl::stream<asio::ip::tcp::socket>;

struct tls_client_options {
    // Trust the system's CA store (OpenSSL's default paths: /etc/ssl/certs on Debian).
    bool use_system_store = true;
    // A PEM file of further CAs to trust ("" for none).
    std::string ca_file;
};

// A client context. invalid_argument when the CA file cannot be read or holds no certificate;
// backend_failure when OpenSSL cannot make a context.
result<std::shared_ptr<asio::ssl::context>> make_client_context(const tls_client_options& options);

// A server context from a PEM certificate chain and a PEM private key that matches it.
// invalid_argument (naming the file) when either cannot be read or they do not match.
result<std::shared_ptr<asio::ssl::context>> make_server_context(const std::string& certificate_file,
                                                                const std::string& key_file);

// Sets up a client stream before its handshake: SNI (unless `host` is an IP literal) and
// verification of the peer's certificate against `host`. invalid_argument for an empty host.
result<void> prepare_client_stream(tls_stream& stream, std::string_view host);

// A handshake failure as one line: "certificate verify failed: unknown CA", "... host name
// mismatch", "... expired", "... not yet valid", "... self-signed certificate", or OpenSSL's reason
// for other failures ("wrong version number", "the peer closed the connection"). Never contains
// anything but what OpenSSL and the certificate check reported.
std::string describe_handshake_failure(tls_stream& stream, const std::error_code& ec);

}  // namespace moat::http
