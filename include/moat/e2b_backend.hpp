// The e2b backend: sandboxes in a remote fleet of microVMs that speaks the E2B protocol (E2B's
// cloud, a self-hosted E2B cluster, or `moat serve`). The same code above the backend (the handle,
// the session manager, the tool layer, `moat mcp`) runs on it unchanged. docs/remote.md describes
// what maps onto what, what fails closed, heartbeats, retries and cancellation.
//
// Transport: the control plane (REST, X-API-Key) and each sandbox's envd (HTTP + Connect JSON,
// X-Access-Token) through moat's own HTTP client (keep-alive pools, TLS verified, every step
// bounded by a deadline, every response capped). Plain http:// is used only for loopback unless
// the host is named in e2b_config::plain_http_hosts.
//
// Secrets: the API key and the sandboxes' access tokens never appear in an error detail, a log
// line or an event.
//
// The backend's contract (backend.hpp) with these differences:
// - create: the template is sandbox_spec::template_name, or default_template; labels become E2B
//   metadata plus moat.owner=<owner_instance> and moat.survive_owner=true|false (those two keys
//   are refused in spec.labels); env becomes envVars; the TTL becomes E2B's timeout (whole
//   seconds), kept short by the heartbeat below unless survive_owner. An explicit resource limit
//   (any resource_limits field set) fails with layer_unavailable naming it unless best_effort:
//   a template fixes a sandbox's resources. Unset limits defer to the template. The layout is
//   always user "user", home and workdir /home/user, artifacts /home/user/out (another explicit
//   layout: invalid_argument).
// - attach: connects (the access token comes with the reply); a moat sandbox created by another
//   instance without survive_owner is sandbox_unavailable. exec, spawn, signal, files, stat and
//   list_dir reach only the sandboxes this backend holds (created or attached).
// - destroy: DELETE, then returns once a GET no longer finds the sandbox (within
//   request_timeout; else backend_failure). A 404 from DELETE on a sandbox this backend does not
//   hold is sandbox_not_found.
// - janitor: destroys the sandboxes carrying moat.owner whose owner is gone: an owner on this
//   host (owner_instance "<hostname>/<pid>/...") whose pid no process has. It never touches a
//   survivor, a sandbox this instance created or holds, or one owned on another host (that
//   owner's heartbeat ends it within heartbeat_timeout of its death).
// - host_report: checks that the endpoint answers and takes the key; facts, no layers.
// - read_files and read_file_stream: a Stat, then a GET of the file. A file whose size changed
//   in between (it grew, shrank or was replaced) fails with backend_failure "file <path> changed
//   while it was read (...)" rather than being cut to the Stat's size; the local backend reads
//   one open file and never sees this.
// - A sandbox found gone (by the heartbeat, inspect or extend_ttl) makes later calls on it fail
//   with sandbox_unavailable; inspect reports it exited until destroy releases it.
//
// Confined to its executor, like every backend.
#pragma once

#include <moat/backend.hpp>

#include <asio/any_io_executor.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace moat {

struct e2b_config {
    // X-API-Key of the control plane. Default: $E2B_API_KEY.
    std::string api_key;
    // Control plane base URL. Default: $E2B_API_URL, else https://api.<domain>.
    std::string api_url;
    // Default: $E2B_DOMAIN, else e2b.app.
    std::string domain;
    // One URL for every sandbox's envd (requests carry the E2b-Sandbox-Id header), as the SDKs'
    // E2B_SANDBOX_URL. Default: $E2B_SANDBOX_URL, else https://49983-<id>.<domain> per sandbox.
    std::string sandbox_url;
    // PEM file of CAs to trust (private deployments), in addition to the system store unless
    // use_system_ca_store is false. Default: $MOAT_E2B_CA_FILE.
    std::string ca_file;
    bool use_system_ca_store = true;
    // Non-loopback host names that may be reached over plain http:// (never the default).
    std::vector<std::string> plain_http_hosts;
    // Template used when sandbox_spec::template_name is "". Default: "base".
    std::string default_template = "base";
    // Names this backend instance in the moat.owner label of the sandboxes it creates, for the
    // janitor. Default: "<hostname>/<pid>/<6 random hex digits>".
    std::string owner_instance;
    // While this backend holds a sandbox, its E2B timeout is kept this short and renewed every
    // heartbeat_interval (one task per backend, while such sandboxes are held), so a crashed
    // owner leaves it billed for about this long, not its whole TTL. A renewal never reaches past
    // the sandbox's own TTL end. Sandboxes created with survive_owner, and attached ones, keep
    // their full TTL and get no heartbeat. A round renews 8 sandboxes at a time (half the
    // per-origin connection budget) and the next starts heartbeat_interval after it ended; a
    // round longer than heartbeat_timeout - heartbeat_interval is logged as a warning.
    std::chrono::milliseconds heartbeat_timeout = std::chrono::minutes(2);
    std::chrono::milliseconds heartbeat_interval = std::chrono::seconds(30);
    // Bounds of one control-plane request and of one envd unary call (a stream is bounded by its
    // command's limits instead).
    std::chrono::milliseconds request_timeout = std::chrono::seconds(30);
    // The longest a 429's Retry-After is honoured (longer, or past request_timeout: the call
    // fails with rate_limited). 502, 503 and failed connections are retried on idempotent calls
    // only (get, list, timeout, delete); create and connect never are.
    std::chrono::milliseconds max_retry_after = std::chrono::seconds(10);
    // After a cancel, how long a killed process may take to report its end before the backend
    // stops waiting (and the handle quarantines the sandbox).
    std::chrono::milliseconds kill_grace = std::chrono::seconds(3);
    // The network hop on top of kill_grace in backend::stop_grace(): a kill's confirmation
    // travels back over it.
    std::chrono::milliseconds network_grace = std::chrono::seconds(2);
};

// The fields the caller left empty, filled from the environment as documented above. A missing API
// key is not an error here: the first call fails with unauthorized naming E2B_API_KEY.
e2b_config e2b_config_from_environment(e2b_config config = {});

std::unique_ptr<backend> make_e2b_backend(asio::any_io_executor executor, e2b_config config);

}  // namespace moat
