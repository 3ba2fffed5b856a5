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
#include <map>
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
    // server::intercept: requests it matches go to `interceptor` (max_body_bytes: no cap).
    std::function<bool(const request_head&)> intercepts;
    route_entry interceptor;
    std::vector<std::string> hosts;  // the Host values served; empty: any
    asio::ip::tcp::acceptor acceptor;
    task_group tasks;  // the accept loop and one task per connection

    // One accepted connection, from its accept to its end: what the caps count (server.cpp).
    struct admitted {
        asio::ip::address peer;
        bool authenticated = false;
        bool evicted = false;                     // closed to make room; no longer counted
        server_connection* connection = nullptr;  // once past the stream factory
        std::list<admitted*>::iterator position;  // in `admissions`, oldest first
    };

    std::size_t open_connections = 0;           // accepted and not yet closed
    std::list<server_connection*> connections;  // those past the stream factory, for stop
    std::list<admitted*> admissions;            // every open connection, oldest first
    std::size_t evicting = 0;                   // evicted, not yet ended
    std::size_t unauthenticated = 0;            // not authenticated, not evicted
    std::map<asio::ip::address, std::size_t> unauthenticated_by_peer;

    // An admitted connection stops counting as unauthenticated (authenticated, or evicted).
    void forget_unauthenticated(admitted& a);
    bool stopping = false;
    asio::steady_timer drained;  // async_stop sleeps on it; cancelled when the last one closes
    server_stats counters;

    bool is_host_allowed(std::string_view host) const noexcept;
};

}  // namespace moat::http
