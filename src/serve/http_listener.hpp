// What the two listeners of `moat serve` (control_plane, envd_server) share: one http::server
// that lives inside its owner's state, next to what the server's handlers point into, started
// once and stopped with a grace period.
#pragma once

#include "http/server.hpp"

#include <moat/result.hpp>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <chrono>
#include <memory>

namespace moat::serve {

class http_listener {
  public:
    // The server's start (listen); the endpoint it listens on.
    result<asio::ip::tcp::endpoint> start() { return server_->start(); }
    // http::server::async_stop. The state stays alive until the stop completes.
    asio::awaitable<void> async_stop(std::chrono::milliseconds grace) {
        auto server = server_;
        co_await server->async_stop(grace);
    }

  protected:
    http_listener() = default;
    ~http_listener() = default;

    // Takes the owner's state, whose `server` member is the listener's.
    template <class State>
    void hold(std::shared_ptr<State> state) {
        auto* server = &state->server;
        server_ = std::shared_ptr<http::server>(std::move(state), server);
    }

  private:
    std::shared_ptr<http::server> server_;  // shares ownership of the whole state
};

}  // namespace moat::serve
