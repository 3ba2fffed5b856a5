// What the benches that time downloads with curl share (moat bench egress, moat bench ports): a
// python3 http.server on the host's 127.0.0.1 over a temporary directory holding big.bin and
// small.bin, a shell loop of curl fetches that prints curl's own timing, its parser, and running
// such a loop on the host (blocking, or on an executor so the process's own forwards keep
// serving).
#pragma once

#include "cli/bench/helper_process.hpp"
#include "cli/bench/latency_summary.hpp"

#include <asio/awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace moat::cli {

// small.bin's size.
inline constexpr std::size_t small_file_bytes = 1024;

// Writes `bytes` of pseudo-random (incompressible) data to `path`; false if it cannot.
bool fill_file(const std::string& path, std::size_t bytes);

// The python3 http.server; stopped (TERM, then KILL) and its directory removed at the end.
class file_server : public helper_server {
  public:
    // Writes big.bin (`big_bytes`) and small.bin, picks a free loopback port and starts the server;
    // false with `why` set when any step fails.
    bool start(std::size_t big_bytes, std::string& why);

    std::uint16_t port = 0;
};

// A shell loop of `count` curl fetches of `url`, one "<seconds> <bytes>" line each (curl's own
// timing, `timing` one of its -w variables: time_total for the transfer, time_starttransfer for
// the first byte; never the process start). A failed fetch prints "failed 0".
std::string fetch_loop(const std::string& url, std::size_t count,
                       const std::string& timing = "time_total");

// Adds each line's time to `into` when its size is `expected`, else counts a failure (missing
// lines too, up to `count`).
void read_fetches(const std::string& text, std::size_t expected, std::size_t count,
                  latency_samples& into);

// Runs `script` with /bin/sh on the host and returns its stdout: blocking, or on the calling
// coroutine's executor (the process goes on serving while the script runs).
std::string run_on_host(const std::string& script);
asio::awaitable<std::string> async_run_on_host(std::string script);

}  // namespace moat::cli
