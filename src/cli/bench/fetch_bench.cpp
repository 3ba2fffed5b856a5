#include "cli/bench/fetch_bench.hpp"

#include "cli/arguments.hpp"
#include "cli/cli_runtime.hpp"
#include "core/asio_compat.hpp"

#include <asio/posix/stream_descriptor.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace moat::cli {
namespace {

std::uint16_t free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    std::uint16_t port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
        port = ntohs(address.sin_port);
    }
    ::close(fd);
    return port;
}

bool accepts(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    return ok;
}

// Forks /bin/sh -c `script` with its stdout on a pipe; the pid and the pipe's read end, or -1s.
std::pair<pid_t, int> start_script(const std::string& script) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return {-1, -1};
    const pid_t pid = ::fork();
    if (pid < 0) {
        ::close(out[0]);
        ::close(out[1]);
        return {-1, -1};
    }
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(out[1]);
    return {pid, out[0]};
}

}  // namespace

bool fill_file(const std::string& path, std::size_t bytes) {
    std::ofstream out(path, std::ios::binary);
    std::string block(1 << 20, '\0');
    unsigned state = 12345;
    for (auto& c : block) {
        state = state * 1103515245u + 12345u;
        c = static_cast<char>(state >> 24);
    }
    while (bytes > 0 && out) {
        const std::size_t n = std::min(bytes, block.size());
        out.write(block.data(), static_cast<std::streamsize>(n));
        bytes -= n;
    }
    return static_cast<bool>(out);
}

bool file_server::start(std::size_t big_bytes, std::string& why) {
    if (!make_directory("moat-bench-files", why)) return false;
    const std::string& dir = directory();
    if (!fill_file(dir + "/big.bin", big_bytes) ||
        !fill_file(dir + "/small.bin", small_file_bytes)) {
        why = "cannot write the files to serve under " + dir;
        return false;
    }
    port = free_port();
    if (port == 0) {
        why = "no free loopback port";
        return false;
    }
    const std::uint16_t listening = port;
    if (!launch(
            {"python3", "-m", "http.server", std::to_string(port), "--bind", "127.0.0.1",
             "--directory", dir},
            true, [listening] { return accepts(listening); }, "python3 -m http.server", why)) {
        why += " (is python3 installed?)";
        return false;
    }
    return true;
}

std::string fetch_loop(const std::string& url, std::size_t count, const std::string& timing) {
    return "i=0; while [ $i -lt " + std::to_string(count) + " ]; do curl -s -o /dev/null -w '%{" +
           timing + "} %{size_download}\\n' '" + url + "' || echo 'failed 0'; i=$((i+1)); done";
}

void read_fetches(const std::string& text, std::size_t expected, std::size_t count,
                  latency_samples& into) {
    std::istringstream lines(text);
    std::string seconds;
    std::string bytes;
    std::size_t seen = 0;
    while (lines >> seconds >> bytes) {
        ++seen;
        char* end = nullptr;
        const double s = std::strtod(seconds.c_str(), &end);
        if (end == seconds.c_str() || *end != '\0' || bytes != std::to_string(expected)) {
            ++into.failures;
            continue;
        }
        into.ms.push_back(s * 1000.0);
    }
    if (seen < count) into.failures += count - seen;
}

asio::awaitable<std::string> async_run_on_host(std::string script) {
    const auto started = start_script(script);
    const pid_t pid = started.first;
    if (pid < 0) co_return "";
    const auto executor = co_await asio::this_coro::executor;
    asio::posix::stream_descriptor pipe(executor, started.second);
    std::string text;
    std::array<char, 4096> buffer{};
    for (;;) {
        auto [error, n] =
            co_await pipe.async_read_some(asio::buffer(buffer), as_tuple(asio::use_awaitable));
        text.append(buffer.data(), n);
        if (error) break;
    }
    pipe.close();
    // The script closed its stdout: it has ended, or is about to.
    int status = 0;
    ::waitpid(pid, &status, 0);
    co_return text;
}

int with_file_server(
    std::string_view command, std::size_t big_bytes,
    const std::function<asio::awaitable<int>(backend&, std::uint16_t port)>& measure) {
    file_server server;
    std::string why;
    if (!server.start(big_bytes, why)) {
        return report_error(command, make_error(errc::backend_failure, why));
    }
    const std::uint16_t port = server.port;
    const int code = run_with_backend([&measure, port](backend& b) { return measure(b, port); });
    server.stop();
    return code;
}

fetch_results::rates fetch_results::download_rates(std::size_t bytes) const {
    const auto rate = [bytes](const latency_samples& s) {
        const double p50 = s.percentile(0.5);
        return p50 > 0 ? static_cast<double>(bytes) / 1e6 / (p50 / 1000.0) : 0.0;
    };
    rates r{rate(host_download), rate(measured_download), 0};
    if (r.host > 0) r.ratio = r.measured / r.host;
    return r;
}

int publish_fetch_report(std::string_view command, int code, std::string_view text,
                         const std::string& json_path, const fetch_results& series,
                         const std::function<void(json_writer&)>& more) {
    const bool published = publish_report(command, text, json_path, [&](json_writer& w) {
        for (const auto* s : series.all()) {
            w.key(s->name);
            write_summary(w, *s);
        }
        more(w);
    });
    std::size_t failures = 0;
    for (const auto* s : series.all()) failures += s->failures;
    if (failures > 0) {
        write_all(STDERR_FILENO, "moat " + std::string(command) + ": " + std::to_string(failures) +
                                     " fetches failed\n");
        return code != 0 ? code : exit_failure;
    }
    return published ? code : exit_failure;
}

}  // namespace moat::cli
