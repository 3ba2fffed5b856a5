// The sandboxes this `moat serve` created, by id: the handle, what the E2B client asked for
// (template, metadata, envs), start and end times, and the envd access token.
//
// Scope: every sandbox the server creates carries the label `moat.serve=<scope>` (the scope is
// derived from the server secret, server_secret::scope), and the registry only ever holds those,
// so the server never sees, lists, connects to or kills the embedding application's sandboxes or
// another server's. What E2B lets a client choose that moat labels cannot carry (any UTF-8 in
// metadata, the env vars) is kept in a small sidecar record, `<state_dir>/sandboxes/<id>.json`
// (0600, written atomically), removed with the sandbox. On start, async_adopt lists the
// backend's sandboxes with this server's label, attaches each, and reads its sidecar: a
// restarted server serves them again with the same tokens (derived, never stored).
//
// The sandbox's end is its moat TTL (pid 1 enforces it; backend::async_extend_ttl moves it):
// an entry past its end is gone for every lookup, and its handle is destroyed in the background
// so the host's records are released.
//
// Confined to the server's executor.
#pragma once

#include <moat/runtime.hpp>
#include <moat/sandbox.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "serve/server_secret.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <moat/usage.hpp>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace moat::serve {

// How long past an autoPause sandbox's end its moat TTL runs: the server pauses it within this.
inline constexpr std::chrono::seconds auto_pause_grace{30};

// The label key on every sandbox a server creates; its value is the server's scope.
inline constexpr std::string_view scope_label = "moat.serve";

struct destroy_attempt;  // a destroy in flight (sandbox_registry::async_destroy)
struct resume_attempt;   // a resume in flight (sandbox_pause.hpp's resume_entry)

struct registry_entry {
    registry_entry(asio::any_io_executor executor) : ended(std::move(executor)) {}

    std::string id;
    std::shared_ptr<sandbox> handle;
    std::string template_id = "base";
    std::map<std::string, std::string> metadata;
    std::map<std::string, std::string> env_vars;
    std::chrono::system_clock::time_point started_at;
    std::chrono::system_clock::time_point end_at;  // the moat TTL's expiry (paused: its lifetime's)
    // Paused (POST /pause, or autoPause at its timeout): envd answers as for a sandbox that is
    // gone until connect or resume thaws it (or, with auto_resume, its next traffic). auto_pause:
    // pause instead of ending at the timeout (kept in the sidecar); the sandbox's moat TTL then
    // runs auto_pause_grace past end_at, so that the server pauses it before its pid 1 would end
    // it.
    bool paused = false;
    bool auto_pause = false;
    std::chrono::system_clock::time_point paused_at;  // while paused
    // autoResume: traffic to it while paused (a port request, an envd call) resumes it first, its
    // end then auto_resume_ttl from the resume (both kept in the sidecar; sandbox_pause.hpp).
    bool auto_resume = false;
    std::chrono::seconds auto_resume_ttl{300};
    // The resume in flight, which every other resume of the entry joins; null when none runs.
    std::shared_ptr<resume_attempt> resuming;
    std::string access_token;  // never logged
    // Its ports are private (allowPublicTraffic false, or the server's --private-ports): every
    // port request must carry traffic_token (derived from the secret like access_token; "" while
    // the ports are public). Kept in the sidecar.
    bool private_ports = false;
    std::string traffic_token;  // never logged
    // network.maskRequestHost at create: the Host header port requests carry into the sandbox
    // ("${PORT}" replaced by the port); "" keeps the client's. Kept in the sidecar.
    std::string mask_request_host;
    // Set once a destroy of the sandbox starts (it stays set if the destroy fails) or it is found
    // past its end. A service with a live stream waits on it too, so that killing a sandbox ends
    // its streams at once; envd answers for such a sandbox as for one that is gone.
    async_event ended;
    // The destroy in flight, which another async_destroy joins; null when none runs.
    std::shared_ptr<destroy_attempt> destroying;
    // Its usage readings of the last hour (sandbox_metrics.hpp reads them in).
    std::shared_ptr<usage_history> usage = std::make_shared<usage_history>();

    // Past its end (the moat TTL): the registry drops it on its next lookup. Nothing else drops
    // an entry but a confirmed destroy.
    // An autoPause sandbox not paused yet is not: the server pauses it within its grace.
    bool is_past_end(std::chrono::system_clock::time_point now) const noexcept {
        if (auto_pause && !paused) return now >= end_at + auto_pause_grace;
        return now >= end_at;
    }
};

class sandbox_registry {
  public:
    // `state_dir` holds the sidecar records (sandboxes/, made 0700 if missing).
    sandbox_registry(asio::any_io_executor executor, std::string state_dir, server_secret secret);
    ~sandbox_registry();
    sandbox_registry(const sandbox_registry&) = delete;
    sandbox_registry& operator=(const sandbox_registry&) = delete;

    const server_secret& secret() const noexcept { return secret_; }
    // The labels a create adds to its spec (scope_label = scope).
    std::map<std::string, std::string> scope_labels() const;

    // Makes the sidecars directory. backend_failure naming it when it cannot.
    result<void> open();

    // Records a sandbox just created (or adopted): sets its access token, writes its sidecar.
    // The entry is returned live. backend_failure when the sidecar cannot be written (the caller
    // destroys the sandbox: a sandbox without its record could not be adopted faithfully).
    result<std::shared_ptr<registry_entry>> add(std::shared_ptr<registry_entry> entry);

    // The entry of `id` (not past its end, not confirmed destroyed: one being destroyed, or whose
    // destroy failed, is found), or null.
    std::shared_ptr<registry_entry> find(std::string_view id);
    // Every entry find() would find, newest first.
    std::vector<std::shared_ptr<registry_entry>> live();
    std::size_t live_count();

    // Rewrites the entry's sidecar (after its end moved).
    result<void> save(const registry_entry& entry) const;

    // Forgets the entry: marks it ended (its streams end), removes its sidecar. The caller has
    // destroyed its sandbox, or is about to.
    void remove(const std::shared_ptr<registry_entry>& entry);

    // Destroys the entry's sandbox (a DELETE) and forgets it once the destroy is confirmed (its
    // absence counts). Until then the entry stays: found, listed, counted against
    // --max-sandboxes. A destroy that fails keeps it, so that the next call tries again (through
    // `sandboxes` when the handle's own destroy already failed: a handle's failed destroy is
    // final). A call while a destroy of the entry runs joins it and returns its outcome; the
    // registry logs that (debug, "joins the destroy in flight").
    // Cancellation: the caller stops waiting and gets errc::cancelled; the destroy runs on in the
    // registry's task group to its end (bounded by the backend).
    asio::awaitable<result<void>> async_destroy(std::shared_ptr<registry_entry> entry,
                                                backend& sandboxes);

    // Adopts the backend's running sandboxes with this server's scope label: attaches each and
    // reads its sidecar (one without a sidecar is adopted with template "base" and no metadata).
    // Returns how many were adopted; a sandbox that cannot be attached is skipped and logged.
    // What ended while no server ran is released: its host record destroyed, and every sidecar
    // without a live sandbox removed.
    asio::awaitable<std::size_t> async_adopt(runtime& sandboxes);

    // Destroys every live entry's sandbox as async_destroy does (a destroy in flight is joined, a
    // handle whose destroy failed is retried through `sandboxes`); returns how many could not be
    // confirmed gone (logged). For --destroy-on-exit.
    asio::awaitable<std::size_t> async_destroy_all(backend& sandboxes);

    // Waits for the background destroys of expired entries.
    asio::awaitable<void> async_drain();

  private:
    void prune(std::chrono::system_clock::time_point now);
    void remove_orphaned_sidecars();
    std::string sidecar_path(std::string_view id) const;

    asio::any_io_executor executor_;
    std::string state_dir_;
    server_secret secret_;
    std::map<std::string, std::shared_ptr<registry_entry>, std::less<>> entries_;
    task_group cleanup_;
};

}  // namespace moat::serve
