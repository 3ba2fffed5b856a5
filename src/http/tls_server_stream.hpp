// The server side of TLS for http::server: a stream_factory that performs the TLS handshake on
// each accepted socket (with a context from tls.hpp's make_server_context) and hands the
// connection a TLS stream.
//
//     auto context = http::make_server_context("cert.pem", "key.pem");
//     options.make_stream = http::make_tls_stream_factory(*context);
//
// The handshake is bounded by the deadline the server passes (its head deadline); a failed or
// late handshake closes the connection, and its one-line reason (tls.hpp) is logged at debug.
// The stream's shutdown sends close_notify; the connection bounds it with its own deadline.
#pragma once

#include "http/server.hpp"

#include <asio/ssl/context.hpp>

#include <memory>
#include <string>

namespace moat::http {

stream_factory make_tls_stream_factory(std::shared_ptr<asio::ssl::context> context);

// The same from a PEM certificate chain and key (make_server_context's errors).
result<stream_factory> make_tls_stream_factory(const std::string& certificate_file,
                                               const std::string& key_file);

}  // namespace moat::http
