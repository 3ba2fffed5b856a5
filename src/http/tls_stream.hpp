// TLS for the server: a server_options::make_stream factory that completes the server side of
// the TLS handshake on each accepted socket and hands the connection an http::stream over it.
//
//     auto context = http::make_server_context("cert.pem", "key.pem");   // tls.hpp
//     options.make_stream = http::make_tls_stream_factory(*context);
//
// The handshake is bounded by the deadline the server passes (its head deadline): when it passes
// the socket is closed and the factory fails (deadline_exceeded), as does a failed handshake
// (backend_failure, with tls.hpp's one-line reason). async_shutdown() sends no close_notify: HTTP
// framing ends every message, and a close_notify exchange could wait on a peer that never answers.
#pragma once

#include "http/server.hpp"

#include <asio/ssl/context.hpp>

#include <memory>

namespace moat::http {

stream_factory make_tls_stream_factory(std::shared_ptr<asio::ssl::context> context);

}  // namespace moat::http
