// A local TCP listener whose every connection is relayed to a port of a sandbox: what
// `moat port-forward` runs and what sandbox::async_port_host opens on the local backend.
//
// Each accepted connection asks `connect` (a sandbox's async_connect_port) for its other end;
// if that fails the connection is reset at once (the event says why). Many connections run at
// once, at most `max_connections` (one more is reset as it is accepted); each ends when either
// side has closed both ways, fails, or is idle past the relay's limit (stream_relay.hpp).
// close() (or dropping it) stops accepting and ends every connection at once; its tasks belong to
// a task group of its own and hold only the state they share. Confined to its executor.
#pragma once

#include "http/stream_relay.hpp"

#include <moat/result.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace moat {

struct port_forward_options {
    std::size_t max_connections = 256;
    http::relay_options relay;
};

// What happened to one connection, for a log line (never any of its bytes).
struct port_forward_event {
    enum class kind {
        connected,  // accepted and connected to the sandbox's port
        refused,    // accepted, but the sandbox's port could not be reached (detail: why)
        over_cap,   // accepted past max_connections and closed
        closed,     // relayed and ended (bytes each way)
    };
    kind what = kind::connected;
    std::string peer;             // the client's address:port
    std::string detail;           // refused: the error
    std::uint64_t bytes_in = 0;   // closed: from the sandbox to the client
    std::uint64_t bytes_out = 0;  // closed: from the client to the sandbox
    bool idle = false;            // closed by the idle limit
};

class port_forwarder {
  public:
    using connector = std::function<asio::awaitable<result<asio::ip::tcp::socket>>()>;
    using event_sink = std::function<void(const port_forward_event&)>;

    // Binds and listens on `listen` (port 0: any free one) and starts accepting.
    // backend_failure naming the address when it cannot be bound.
    static result<std::unique_ptr<port_forwarder>> start(asio::any_io_executor executor,
                                                         asio::ip::tcp::endpoint listen,
                                                         connector connect,
                                                         port_forward_options options = {},
                                                         event_sink on_event = {});

    // close(); the tasks end when the executor next runs them.
    ~port_forwarder();
    port_forwarder(const port_forwarder&) = delete;
    port_forwarder& operator=(const port_forwarder&) = delete;

    // The bound address (its port, when 0 was asked).
    const asio::ip::tcp::endpoint& local_endpoint() const noexcept;
    std::size_t open_connections() const noexcept;
    // Stops accepting and ends every connection at once (their tasks are cancelled). Idempotent.
    void close() noexcept;
    bool is_closed() const noexcept;
    // close(), then completes once every task of the forwarder (the accept loop, each
    // connection) has ended. Cancellation: none.
    asio::awaitable<void> async_close();

    struct state;  // what its tasks share (port_forwarder.cpp)

  private:
    explicit port_forwarder(std::shared_ptr<state> s) : state_(std::move(s)) {}
    std::shared_ptr<state> state_;
};

}  // namespace moat
