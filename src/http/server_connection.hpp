// One server connection: reads request heads, routes them, runs the handler and writes its
// response, over and over while keep-alive holds (private to src/http/server*.cpp).
//
// One coroutine drives it (async_run) and everything it does is sequential: the handler's body
// reads and response writes are made from that same coroutine, one at a time. A single deadline
// (a timer that closes the stream when it fires) bounds whichever read or write is in progress:
// head_timeout for a head, idle_timeout between requests, body_read_timeout per body read,
// write_timeout per write. While the handler computes, no deadline runs.
#pragma once

#include "http/message_parser.hpp"
#include "http/router.hpp"
#include "http/server.hpp"
#include "http/server_state.hpp"
#include "http/stream.hpp"

#include <moat/result.hpp>

#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moat::http {

class server_connection {
  public:
    using clock = std::chrono::steady_clock;

    // `first_deadline`: when the first head must be complete (head_timeout after the accept).
    // `record`: the connection's entry in the server's caps, which must outlive it.
    server_connection(std::shared_ptr<server::state> state, std::unique_ptr<stream> s,
                      clock::time_point first_deadline, server::state::admitted& record);
    ~server_connection();
    server_connection(const server_connection&) = delete;
    server_connection& operator=(const server_connection&) = delete;

    // Serves requests until the connection closes; then the stream is closed. Cancellation: the
    // stream is closed and the handler in progress is cancelled.
    asio::awaitable<void> async_run();

    // The server is stopping: a connection waiting for a request closes now; one in a request
    // closes after its response.
    void on_stop() noexcept;
    // Closes the stream at once (stop past its grace, or an eviction).
    void close_now() noexcept;
    // Between requests (or inside a head still arriving), with nothing unread waiting.
    bool is_idle() const noexcept;
    // A handler vouched for a request on this connection (server_request::mark_authenticated).
    void mark_authenticated() noexcept;

    // For server_request and server_response (see server.hpp).
    asio::awaitable<result<std::string_view>> async_read_some();
    asio::awaitable<result<std::string>> async_read_body();
    asio::awaitable<result<void>> async_send(int status, header_list headers, std::string body);
    asio::awaitable<result<void>> async_begin(int status, header_list headers);
    asio::awaitable<result<void>> async_write_frame(std::string_view frame);
    asio::awaitable<result<void>> async_end();
    bool is_response_started() const noexcept { return response_started_; }
    void abort_response() noexcept { aborted_ = true; }
    result<taken_connection> take_over();
    bool has_body() const noexcept { return parser_.has_body(); }
    std::optional<std::uint64_t> content_length() const noexcept {
        return parser_.content_length();
    }

    struct watchdog;  // the deadline's timer, shared with its handler (server_connection.cpp)

  private:
    enum class phase { waiting, in_request, closing };
    enum class head_outcome { head, closed, failed };

    asio::awaitable<head_outcome> async_read_head(bool idle);
    // Resets the per-request state for the next head (or for the answer to a failed one).
    void begin_request() noexcept;
    asio::awaitable<void> async_handle_request();
    asio::awaitable<void> async_run_handler(const server::state::route_entry& route,
                                            const path_params& params);
    // Answers with a JSON error body and marks the connection to close.
    asio::awaitable<void> async_answer_error(int status, std::string_view message);
    asio::awaitable<void> async_answer_parse_error();
    asio::awaitable<std::error_code> async_read_more();
    asio::awaitable<result<void>> async_write_buffers(std::span<const asio::const_buffer> buffers);
    asio::awaitable<result<void>> async_send_continue_if_asked();
    // Shuts down the sending side and reads what the peer still sends for a short while, so that
    // closing does not reset the connection before the peer has read our last response.
    asio::awaitable<void> async_linger_close();

    // The head of a response, with the framing headers the server owns.
    result<std::string> make_head(int status, header_list& headers, bool chunked,
                                  std::uint64_t length);
    void arm(clock::time_point deadline);
    void disarm() noexcept;

    std::shared_ptr<server::state> state_;
    server::state::admitted* record_;
    std::unique_ptr<stream> stream_;
    std::shared_ptr<watchdog> watchdog_;
    std::list<server_connection*>::iterator registration_;
    message_parser parser_;
    std::vector<char> buffer_;
    std::string_view pending_;  // read, not yet fed to the parser (a view into buffer_)
    clock::time_point first_deadline_;
    phase phase_ = phase::waiting;
    clock::time_point waiting_since_ = clock::now();  // when phase_ last became waiting

    // The current request.
    bool close_after_ = false;  // this response is the connection's last
    bool response_started_ = false;
    bool streaming_ = false;
    bool stream_ended_ = false;
    bool chunked_ = false;
    bool head_only_ = false;  // a HEAD request or a status without a body: no body bytes go out
    bool body_done_ = false;
    bool continue_sent_ = false;
    bool write_failed_ = false;
    bool taken_over_ = false;         // a handler took the connection over (take_over)
    bool aborted_ = false;            // the handler aborted its response (server_response::abort)
    bool body_read_started_ = false;  // the handler asked for the body
    int body_error_status_ = 0;       // what the server answers when a body read failed (413, 400)
};

}  // namespace moat::http
