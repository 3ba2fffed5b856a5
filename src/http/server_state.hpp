// What the server and its connections share (private to src/http/server*.cpp). Confined to the
// server's executor.
#pragma once

#include "http/router.hpp"
#include "http/server.hpp"

#include <moat/task_group.hpp>

#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <cstddef>
#include <list>
#include <string>
#include <vector>

namespace moat::http {

struct server::state {
    state(asio::any_io_executor ex, server_options o)
        : executor(ex),
          options(std::move(o)),
          acceptor(ex),
          tasks(ex, "http server"),
          drained(ex) {}

    struct route_entry {
        handler run;
        std::uint64_t max_body_bytes = 0;
    };

    asio::any_io_executor executor;
    server_options options;
    route_table routes;
    std::vector<route_entry> handlers;  // by route index
    std::vector<std::string> hosts;     // the Host values served; empty: any
    asio::ip::tcp::acceptor acceptor;
    task_group tasks;  // the accept loop and one task per connection

    std::size_t open_connections = 0;           // accepted and not yet closed
    std::list<server_connection*> connections;  // those past the stream factory, for stop
    bool stopping = false;
    asio::steady_timer drained;  // async_stop sleeps on it; cancelled when the last one closes
    server_stats counters;

    bool is_host_allowed(std::string_view host) const noexcept;
};

}  // namespace moat::http
