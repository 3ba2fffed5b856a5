// What the benches that time downloads with curl share (moat bench egress, moat bench ports): a
// python3 http.server on the host's 127.0.0.1 over a temporary directory holding big.bin and
// small.bin, a shell loop of curl fetches that prints curl's own timing, its parser, running such
// a loop on the host without blocking the executor, and the bench's frame and report.
#pragma once

#include "cli/bench/helper_process.hpp"
#include "cli/bench/latency_summary.hpp"

#include <moat/backend.hpp>

#include <asio/awaitable.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

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

// Runs `script` with /bin/sh on the host and returns its stdout, read on the calling coroutine's
// executor (the process goes on serving, a forwarded port say, while the script runs).
asio::awaitable<std::string> async_run_on_host(std::string script);

// A fetch bench's four series: big.bin downloads and small.bin fetches from the host's server (the
// baseline) and the measured way; named host_download, <measured>_download, host_<small>,
// <measured>_<small> (their JSON keys).
struct fetch_results {
    fetch_results(const std::string& measured, const std::string& small)
        : measured_download{measured + "_download", {}, 0},
          host_small{"host_" + small, {}, 0},
          measured_small{measured + "_" + small, {}, 0} {}
    latency_samples host_download{"host_download", {}, 0};
    latency_samples measured_download;
    latency_samples host_small;
    latency_samples measured_small;

    std::array<const latency_samples*, 4> all() const {
        return {&host_download, &measured_download, &host_small, &measured_small};
    }
    // MB/s at the downloads' p50s (of `bytes` each), and measured over host; 0s without samples.
    struct rates {
        double host = 0;
        double measured = 0;
        double ratio = 0;
    };
    rates download_rates(std::size_t bytes) const;
};

// A fetch bench's frame: starts a file_server with big.bin of `big_bytes`, runs `measure` with its
// port on the selected backend (run_with_backend), stops the server. The exit code: measure's, or
// the error's (printed for `command`) when the server cannot start.
int with_file_server(
    std::string_view command, std::size_t big_bytes,
    const std::function<asio::awaitable<int>(backend&, std::uint16_t port)>& measure);

// `text` on stdout and, with `json_path`, the series' summaries and `more`'s members as JSON
// (publish_report); then the exit code: `code` if not 0, else exit_failure when a fetch failed
// (one line on stderr says how many) or the report could not be written, else 0.
int publish_fetch_report(std::string_view command, int code, std::string_view text,
                         const std::string& json_path, const fetch_results& series,
                         const std::function<void(json_writer&)>& more);

}  // namespace moat::cli
