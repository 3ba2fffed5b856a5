// A TCP proxy on loopback in front of a real server (a `moat serve` listener, an http::server),
// which a test tells to misbehave in the ways a network and a broken server do, on demand:
//
//     moat::test::tcp_fault_proxy proxy("127.0.0.1", serve.envd_port());
//     config.sandbox_url = proxy.url();                 // the client talks to the proxy
//     proxy.arm(tcp_fault_proxy::reset_after(200, "Process/Start"));
//
// Faults are armed for the response to the next request whose request line contains `match`
// ("" matches any): the proxy recognises a request when a chunk from the client begins with a
// request line (`METHOD /target HTTP/1.1`), binds the first matching armed fault to that
// connection and counts the response bytes from there (from the end of the response head when
// `from_body`). Kinds:
//
//   reset_after(n)        forward n bytes of the response, then reset the client connection (RST)
//   truncate_after(n)     forward n bytes, then close it cleanly (FIN): a truncated frame or body
//   stall_after(n)        forward n bytes, then forward nothing more on it until resume()
//   inject_after(n, b)    forward n bytes, insert the bytes b, forward the rest
//   delay_after(n, d)     forward n bytes, hold the rest for d, then forward it: a slow server
//                         (arm it for many requests; peak_delayed() tells how many responses it
//                         held at once, i.e. how many of those requests the client had in flight)
//   answer(raw)           do not forward the request: answer it with the raw bytes (a canned
//                         `HTTP/1.1 429 ...` from status_response()) and close the connection
//
// arm(f, times) serves `times` matching requests (retries see the fault again). stall() stops
// forwarding on every connection (both ways, new ones too) until resume(): a stalled server.
//
// The proxy also rewrites the request's Host header to the upstream's host:port (when the head is
// in the chunk that starts the request), because moat's loopback servers refuse a Host naming a
// port they do not listen on (DNS-rebinding defence). TLS passes through untouched, but then no
// request is recognised: only stall() and the byte-count faults with match "" apply.
//
// It runs on a thread of its own (its own io_context), so it works beside a test that blocks as
// well as one that runs coroutines; every member is thread-safe. Buffers are 16 KiB per
// direction per connection. The destructor closes every connection and joins the thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace moat::test {

class tcp_fault_proxy {
  public:
    enum class fault_kind { reset, truncate, stall, inject, answer, delay };

    struct fault {
        fault_kind kind = fault_kind::reset;
        std::size_t after_bytes = 0;
        bool from_body = false;  // count after_bytes from the end of the response head
        std::string bytes;       // inject: inserted; answer: the whole raw response
        std::string match;       // a substring of the request line; "" matches any request
        std::chrono::milliseconds delay{0};  // delay: how long the rest is held
    };

    static fault reset_after(std::size_t bytes, std::string match = "", bool from_body = false);
    static fault truncate_after(std::size_t bytes, std::string match = "", bool from_body = false);
    static fault stall_after(std::size_t bytes, std::string match = "", bool from_body = false);
    static fault inject_after(std::size_t bytes, std::string garbage, std::string match = "",
                              bool from_body = false);
    static fault answer(std::string raw_response, std::string match = "");
    static fault delay_after(std::size_t bytes, std::chrono::milliseconds delay,
                             std::string match = "", bool from_body = false);

    // "HTTP/1.1 <status> <reason>\r\n" + extra_headers (each ending in \r\n) + a JSON body
    // {"code":<status>,"message":"injected by the test proxy"}, Content-Length, Connection: close.
    static std::string status_response(int status, std::string extra_headers = "");
    // One HTTP/1.1 chunk carrying `data` (size line, data, CRLF): to inject a well-framed piece
    // into a chunked body at a chunk boundary (from_body with 0 bytes is one).
    static std::string chunk(const std::string& data);
    // A Connect streaming envelope header: flags, then the 4-byte big-endian length (the length
    // may be a lie: an oversized or truncated frame).
    static std::string envelope_header(std::uint8_t flags, std::uint32_t length);

    tcp_fault_proxy(std::string upstream_host, unsigned short upstream_port);
    ~tcp_fault_proxy();
    tcp_fault_proxy(const tcp_fault_proxy&) = delete;
    tcp_fault_proxy& operator=(const tcp_fault_proxy&) = delete;

    unsigned short port() const { return port_; }
    // "http://127.0.0.1:<port>" (or another scheme: "https").
    std::string url(const std::string& scheme = "http") const;

    void arm(fault f, int times = 1);
    // Drops the faults not yet used (those already bound to a connection stay bound).
    void disarm();
    void stall();
    // Ends stall() and every stall_after() in force.
    void resume();
    // Closes every open connection now (both sides, RST to the client).
    void reset_all();

    // Faults armed and not yet used.
    std::size_t armed() const;
    // Faults that have fired (their condition was reached on a connection, or a canned answer
    // was sent).
    std::uint64_t fired() const;
    std::uint64_t connections_accepted() const;
    std::size_t open_connections() const;
    // Requests recognised (the request-line heuristic above).
    std::uint64_t requests_seen() const;
    // The most responses delay_after() faults held at the same time, since the proxy started or
    // reset_peak_delayed() (which starts it over from those held now).
    std::size_t peak_delayed() const;
    void reset_peak_delayed();

    struct state;  // implementation detail

  private:
    std::unique_ptr<state> state_;
    unsigned short port_ = 0;
    std::thread thread_;
};

}  // namespace moat::test
