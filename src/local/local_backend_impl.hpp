// The local backend's class, shared by the files that define it: the contract between them.
//
//   local_backend.cpp          lifecycle: construction, create, attach, inspect, list, extend TTL,
//                              the host report, the helper's reports, the egress glue
//   local_backend_destroy.cpp  ending sandboxes: destroy (single flight), a recorded sandbox's
//                              destroy, the kill through a pidfd, the dead sweep and the janitor
//   local_backend_exec.cpp     commands: exec, spawn, signal, the stdio pipes and environment
//   local_backend_files.cpp    file access: the inline batch calls and the streamed read and write
//   local_backend_ports.cpp    ports: a connection to a server in the sandbox, made by its pid 1
//   local_backend_watch.cpp    file watches: inotify, the watches added by the sandbox's pid 1
//   local_backend_pause.cpp    pause and resume: the commands' cgroup frozen, pid 1's clocks
//   local_backend_network.cpp  live network rules: an update, and the proxy seeing another's
//
// Everything here runs on the backend's executor (files' blocking steps on its file threads). A
// sandbox this backend holds is one local_sandbox in sandboxes_, from create or attach until
// destroy releases it; find() is the one way in by id.
#pragma once

#include <moat/local_backend.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "core/unique_fd.hpp"
#include "local/cgroup_stats.hpp"
#include "local/sandbox_files.hpp"
#include "local/sandbox_records.hpp"
#include "wire/protocol.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace asio {
class thread_pool;
}  // namespace asio

namespace moat {

namespace egress {
class egress_proxy;
class network_policy;
}  // namespace egress
namespace wire {
struct reaped_message;
}  // namespace wire
class agent_channel;
class helper_client;

// The library's copy of a sandbox's egress listener (local_backend.cpp).
struct egress_listener;
// A sandbox's root descriptor of a file job's own (local_backend_files.cpp).
struct pinned_root;
// One directory watch (local_backend_watch.cpp), and a record its inotify instance handed out.
struct watch_core;
struct inotify_record;

// One destroy of one sandbox, shared by every caller that asks while it runs.
struct destroy_flight {
    explicit destroy_flight(const asio::any_io_executor& ex) : done(ex) {}
    async_event done;
    std::optional<result<void>> outcome;
};

struct local_sandbox {
    explicit local_sandbox(const asio::any_io_executor& ex) : answered(ex), reaped(ex) {}
    sandbox_info info;
    std::shared_ptr<agent_channel> agent;
    unique_fd pidfd;
    unique_fd root;         // O_PATH of its "/" (/proc/<pid>/root), for host-side file access
    sandbox_record record;  // as written to the state directory: uid base, cgroups, env, layout
    async_event answered;   // the helper reported on this sandbox (reaped, or never knew it)
    async_event reaped;     // pid 1 is confirmed gone
    int cleanup_errno = 0;  // from the helper's reaped report (ESRCH: it did not know the sandbox)
    std::optional<std::string> gone_reason;
    std::shared_ptr<oom_watch> oom = std::make_shared<oom_watch>();
    std::shared_ptr<destroy_flight> destroying;  // set while a destroy runs
    std::shared_ptr<egress_listener> egress;     // its egress listener, if its network is not none
};

class local_backend final : public backend {
  public:
    local_backend(asio::any_io_executor executor, local_options options);
    ~local_backend() override;

    asio::any_io_executor get_executor() const override { return executor_; }
    std::string name() const override { return "local"; }
    std::chrono::milliseconds stop_grace() const override { return options_.kill_grace; }

    // local_backend.cpp
    asio::awaitable<result<sandbox_info>> async_create(sandbox_spec spec) override;
    asio::awaitable<result<sandbox_info>> async_attach(std::string id) override;
    asio::awaitable<result<sandbox_info>> async_inspect(std::string id) override;
    asio::awaitable<result<host_report>> async_host_report() override;
    // This backend's sandboxes, then every other one recorded in the state directory.
    asio::awaitable<result<std::vector<sandbox_info>>> async_list(label_filter filter) override;
    // local_backend_usage.cpp
    asio::awaitable<result<sandbox_usage>> async_usage(std::string id) override;
    asio::awaitable<result<sandbox_info>> async_extend_ttl(std::string id,
                                                           std::chrono::milliseconds ttl) override;
    // local_backend_pause.cpp
    asio::awaitable<result<sandbox_info>> async_pause(std::string id) override;
    asio::awaitable<result<sandbox_info>> async_resume(std::string id) override;
    bool is_paused(const std::string& id) const override;

    // local_backend_network.cpp
    asio::awaitable<result<sandbox_info>> async_update_network(std::string id,
                                                               sandbox_network network) override;

    // local_backend_destroy.cpp
    asio::awaitable<result<void>> async_destroy(std::string id) override;
    asio::awaitable<result<std::vector<janitor_action>>> async_janitor(bool dry_run) override;

    // local_backend_exec.cpp
    asio::awaitable<result<exec_stream>> async_exec_stream(std::string id,
                                                           exec_request request) override;
    asio::awaitable<result<process>> async_spawn(std::string id, exec_request request) override;
    asio::awaitable<result<void>> async_signal(std::string id, std::uint64_t process_id,
                                               int signal) override;
    asio::awaitable<result<terminal>> async_open_terminal(std::string id, exec_request request,
                                                          terminal_size size) override;
    asio::awaitable<result<terminal>> async_attach_terminal(std::string id, int pid) override;

    // local_backend_ports.cpp
    asio::awaitable<result<asio::ip::tcp::socket>> async_connect_port(std::string id,
                                                                      std::uint16_t port) override;
    asio::awaitable<result<asio::local::stream_protocol::socket>> async_connect_unix(
        std::string id, std::string path) override;

    // local_backend_watch.cpp
    asio::awaitable<result<dir_watch>> async_watch_dir(std::string id, std::string path,
                                                       watch_options options) override;

    // local_backend_files.cpp. The batch calls run inline: a few system calls per file, bounded
    // by file_limits. No co_await, so there is nothing to cancel; the boundary only turns
    // bad_alloc into an error.
    asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::string id, std::vector<file_write> files) override;
    asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::string id, std::vector<std::string> paths) override;
    asio::awaitable<result<file_write_result>> async_write_file_stream(std::string id,
                                                                       file_write_target target,
                                                                       byte_source source) override;
    asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string id,
                                                                     std::string path) override;
    asio::awaitable<result<file_stat>> async_stat(std::string id, std::string path) override;
    asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::string id, std::vector<std::string> paths) override;
    asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string id,
                                                                   std::string path) override;

  private:
    // Shared by create (local_backend.cpp) and destroy_recorded (local_backend_destroy.cpp): a
    // record without a pid younger than this may still be being created.
    static constexpr auto create_timeout = std::chrono::seconds(30);

    // local_backend.cpp
    asio::awaitable<result<sandbox_info>> create(sandbox_spec spec);
    asio::awaitable<result<sandbox_info>> attach(std::string id);
    asio::awaitable<result<sandbox_info>> extend_ttl(std::string id, std::chrono::milliseconds ttl);
    // Connects to a survivor's attach socket and checks that its pid 1 is what listens there.
    result<unique_fd> connect_to_agent(const sandbox_record& record);
    // The O_PATH root the file operations resolve under, opened once pid 1 is ready.
    static result<void> open_root(local_sandbox& sandbox);
    // A sandbox whose pid 1 is gone (seen through the pidfd) reports `exited` even before the
    // helper's report or the channel's end arrives.
    // Also takes a pause or resume another process made (sync_pause_state).
    void refresh_state(local_sandbox& sandbox);
    // The sandbox this backend holds; sandbox_not_found naming the owner of one it only records.
    result<std::shared_ptr<local_sandbox>> find(const std::string& id);
    // find(), and sandbox_unavailable (its reason) when the sandbox has ended or has no agent.
    result<std::shared_ptr<local_sandbox>> find_running(const std::string& id);
    // Starts serving the sandbox's egress proxy: registers its policy with the backend's proxy
    // and accepts on the listener its agent handed over with `ready`. Nothing for network none.
    result<void> start_egress(const std::shared_ptr<local_sandbox>& sandbox,
                              const egress::network_policy& policy);
    // Stops serving the sandbox's proxy: our copy of its listener closes (the agent and other
    // attached processes keep theirs) and every connection we proxy for it closes at once.
    void stop_egress(local_sandbox& sandbox);
    void on_reaped(const wire::reaped_message& m);
    // local_backend_pause.cpp
    asio::awaitable<result<sandbox_info>> pause(std::string id);
    asio::awaitable<result<sandbox_info>> resume(std::string id);
    // Where the commands' cgroup.freeze says the sandbox is not what this process last knew
    // (another process paused or resumed it): the record's pause fields, read again.
    void sync_pause_state(local_sandbox& sandbox);
    // A paused sandbox's extend_ttl: the TTL it resumes with, recorded.
    sandbox_info set_ttl_left(local_sandbox& sandbox, std::chrono::milliseconds ttl);
    // Only what depends on the helper ends with it: the sandboxes it made that die with it
    // (PDEATHSIG). An attached sandbox, or a survivor it made, keeps its own control socket to its
    // pid 1 and runs on; its destroy confirms through the pidfd.
    void on_helper_lost(const std::string& reason);

    // local_backend_network.cpp
    asio::awaitable<result<sandbox_info>> update_network(std::string id, sandbox_network network);
    // The proxy's policy_source for a sandbox this process serves: its record, looked at (one
    // stat) before each request and once a second while connections are open, read again when
    // the file changed; a network other than the one in force here is the new policy, and this
    // process's record and info take it too.
    std::function<std::optional<egress::network_policy>()> policy_source_for(
        const std::shared_ptr<local_sandbox>& sandbox);

    // local_backend_destroy.cpp
    asio::awaitable<result<void>> destroy(std::string id);
    error unconfirmed_error(const std::string& id) const;
    asio::awaitable<result<void>> destroy_known(std::shared_ptr<local_sandbox> sandbox,
                                                const std::string& id, deadline limit);
    // A sandbox this backend has not attached: known only from its record. Its pid 1 is killed
    // through a pidfd checked against the recorded start time; a stale record is cleaned up.
    asio::awaitable<result<void>> destroy_recorded(std::string id, deadline limit);
    static error cgroups_left_error(const std::string& id, int err);
    // Removes the record's cgroups, retrying while the kernel still counts the exiting tasks.
    asio::awaitable<int> remove_cgroups_until(const sandbox_record& record, deadline limit);
    // The helper cannot confirm (it is gone, never knew this sandbox, or it was attached): kill
    // pid 1 through our own pidfd and wait for it to report the exit. The kernel ends every
    // process of the pid namespace before pid 1 can exit.
    asio::awaitable<void> kill_without_helper(local_sandbox& sandbox, deadline limit);
    // SIGKILLs the process behind `pidfd` (the caller's, which must stay open meanwhile) and
    // waits until it has exited; false at `limit`. The wait registers a duplicate it owns, so the
    // caller's descriptor is never closed or registered with the reactor here.
    asio::awaitable<bool> kill_and_wait(int pidfd, deadline limit);
    // Out of descriptors for the duplicate: look every 10 ms instead.
    asio::awaitable<bool> poll_until_exited(int pidfd, deadline limit);
    // Once per backend, at its first create or list: what an earlier process left that is proven
    // dead (janitor_rules.hpp's is_sweepable: a survivor that ended at its TTL with no moat
    // process alive) loses its cgroups, socket and record, so it does not wait for a janitor.
    // Bounded in records looked at, in records removed and in time; system calls only (one
    // removal attempt: cgroups the kernel still counts as busy are left for the janitor).
    void sweep_dead_once();
    // The rules are in janitor_rules.hpp; this walks the state directory and the cgroup tree.
    asio::awaitable<result<std::vector<janitor_action>>> janitor(bool dry_run);

    // local_backend_exec.cpp
    struct started_command;
    struct stdio_set;
    asio::awaitable<result<exec_stream>> start_exec(std::string id, exec_request request);
    asio::awaitable<result<process>> spawn(std::string id, exec_request request);
    asio::awaitable<result<terminal>> open_terminal(std::string id, exec_request request,
                                                    terminal_size size);
    asio::awaitable<result<terminal>> attach_terminal(std::string id, int pid);
    // A command on the sandbox's agent; on a terminal of `size` when its rows are not 0.
    asio::awaitable<result<started_command>> start_command(std::string id, exec_request request,
                                                           std::chrono::milliseconds ceiling,
                                                           std::uint32_t exec_flags,
                                                           wire::terminal_size size = {});
    // Out of descriptors is a capacity limit (the caller may retry later), not a broken backend.
    static error stdio_error(const char* call);
    static result<stdio_set> make_stdio();
    // A terminal command's: no stdio of its own, and output pipes that have already ended (the
    // stream reads the terminal's master once it comes).
    static result<stdio_set> make_ended_stdio();
    static std::map<std::string, std::string> base_environment(const sandbox_layout& layout);

    // local_backend_ports.cpp
    asio::awaitable<result<asio::ip::tcp::socket>> connect_port(std::string id, std::uint16_t port);
    asio::awaitable<result<sandbox_usage>> usage(std::string id);
    asio::awaitable<result<asio::local::stream_protocol::socket>> connect_unix(std::string id,
                                                                               std::string path);

    // local_backend_watch.cpp
    asio::awaitable<result<dir_watch>> watch_dir(std::string id, std::string path,
                                                 watch_options options);
    asio::awaitable<void> watch_tree(std::shared_ptr<watch_core> c, std::string start, bool report);
    asio::awaitable<void> pump_watch(std::shared_ptr<watch_core> c);
    asio::awaitable<void> handle_watch_record(std::shared_ptr<watch_core> c, inotify_record record);

    // local_backend_files.cpp
    // What the file functions need, once the sandbox is known to be alive.
    result<sandbox_root> file_root(const std::string& id);
    // file_root() with a descriptor of the job's own.
    result<std::shared_ptr<pinned_root>> pin_root(const std::string& id);
    // file_root(), then `operation` on it with `arguments`; an exception becomes an error (the
    // inline calls).
    template <class T, class... Arguments>
    result<T> on_file_root(const std::string& id,
                           result<T> (*operation)(const sandbox_root&, const Arguments&...),
                           const Arguments&... arguments);
    // Each step of a streamed write (open, every chunk, the rename or the removal) is one job on
    // the file threads; the source is pulled on the executor between them. The caller's
    // cancellation is looked at before every step (a step itself is not interrupted).
    asio::awaitable<result<file_write_result>> write_stream(std::string id,
                                                            file_write_target target,
                                                            byte_source source);
    asio::awaitable<result<file_read_stream>> open_read_stream(std::string id, std::string path);
    asio::thread_pool& file_pool();

    asio::any_io_executor executor_;
    local_options options_;
    task_group tasks_;
    std::shared_ptr<helper_client> helper_;
    sandbox_records records_{""};
    std::map<std::string, std::shared_ptr<local_sandbox>> sandboxes_;
    // The egress proxy of this backend's sandboxes whose network is not none, made by the first.
    std::shared_ptr<egress::egress_proxy> egress_;
    std::uint64_t next_exec_id_ = 1;
    bool swept_ = false;  // sweep_dead_once ran
    // Streamed file I/O, started by the first stream (joined first by the destructor).
    std::unique_ptr<asio::thread_pool> file_pool_;
};

}  // namespace moat
