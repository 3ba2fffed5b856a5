// A real `moat serve` started by a test: the built binary (moat::test::moat_cli_path(), as the CLI
// tests find it) on loopback ports 0, with a fresh API key file and state directory in a temporary
// work directory, optionally over TLS and with --max-sandboxes. The constructor returns once the
// server printed its `api ...` and `envd ...` lines (or fails the test at a deadline); stop()
// sends SIGTERM, waits a bounded time, then SIGKILLs, and reports the exit status.
//
// Its stdout and stderr go to files in the work directory (a pipe nobody reads would block the
// server once full). The child gets PR_SET_PDEATHSIG(SIGTERM), so a test process that dies
// without running destructors does not leave a server behind.
//
// Not thread-safe; use it from the test's thread.
#pragma once

#include <sys/types.h>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace moat::test {

struct serve_process_options {
    // Both or neither: PEM chain and key (support/test_ca.hpp makes them). With them, both
    // listeners speak HTTPS and the printed URLs are https://.
    std::string tls_cert_file;
    std::string tls_key_file;
    std::optional<int> max_sandboxes;
    // --destroy-on-exit (default on): a test's sandboxes do not outlive its server, so the
    // host's shared /run/moat is left as it was found.
    bool destroy_on_exit = true;
    std::vector<std::string> extra_args;
    // The server's RLIMIT_NOFILE, soft and hard (a host with a low descriptor limit); none: the
    // test process's own.
    std::optional<unsigned long> open_files_limit;
    // The longest the server may take to print both listener lines.
    std::chrono::milliseconds start_deadline = std::chrono::seconds(30);
};

class serve_process {
  public:
    explicit serve_process(serve_process_options options = {});
    // Stops the server if it still runs (stop() with its defaults) and removes the work directory.
    ~serve_process();
    serve_process(const serve_process&) = delete;
    serve_process& operator=(const serve_process&) = delete;

    // "http://127.0.0.1:<port>" (https with TLS), as printed.
    const std::string& api_url() const { return api_url_; }
    const std::string& envd_url() const { return envd_url_; }
    // host:port parts of the URLs, for a proxy in front of them.
    std::string api_host() const;
    unsigned short api_port() const;
    std::string envd_host() const;
    unsigned short envd_port() const;
    // The key in E2B's format (e2b_ and 40 hex digits), and the file it is in.
    const std::string& api_key() const { return api_key_; }
    const std::string& api_key_file() const { return key_file_; }
    const std::string& state_dir() const { return state_dir_; }
    const std::string& work_dir() const { return work_dir_; }
    pid_t pid() const { return pid_; }
    bool is_running() const;

    // Sends `signal`, waits up to `grace` for the exit, then SIGKILLs and waits (bounded too).
    // Returns the exit code, or 128 + signal if a signal ended it. Calling it again returns the
    // same status.
    int stop(std::chrono::milliseconds grace = std::chrono::seconds(30), int signal = 15);

    // Every live host process below the server right now: its sandbox helper, the sandboxes'
    // pid 1 agents and whatever commands run in them.
    std::vector<pid_t> descendants() const;
    // The host pids of its sandboxes' pid 1 agents (children of its helper), one per live sandbox.
    std::vector<pid_t> sandbox_agents() const;
    // The host processes that belong to its sandboxes' commands: everything below the sandboxes'
    // pid 1 agents (serve -> its helper -> one agent per sandbox -> commands). Empty means nothing
    // a command started is left.
    std::vector<pid_t> sandbox_processes() const;
    // The sandbox_processes() whose command line contains `needle`.
    std::vector<pid_t> sandbox_processes_matching(const std::string& needle) const;
    // One line per sandbox process, "pid: command line", for a failure message.
    std::string describe(const std::vector<pid_t>& pids) const;

    // What it wrote so far.
    std::string stdout_text() const;
    std::string stderr_text() const;

  private:
    std::string work_dir_;
    std::string state_dir_;
    std::string key_file_;
    std::string api_key_;
    std::string api_url_;
    std::string envd_url_;
    pid_t pid_ = -1;
    std::optional<int> exit_status_;
};

}  // namespace moat::test
