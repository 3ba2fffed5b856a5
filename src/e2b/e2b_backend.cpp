#include <moat/e2b_backend.hpp>
#include <moat/log.hpp>
#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"
#include "core/async_event.hpp"
#include "core/exception_boundary.hpp"
#include "e2b/backend_state.hpp"
#include "e2b/control_plane_client.hpp"
#include "e2b/envd_client.hpp"
#include "e2b/sandbox_mapping.hpp"
#include "http/client.hpp"
#include "local/spec_validation.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <map>

namespace moat {
namespace {

using system_clock = std::chrono::system_clock;
using e2b::e2b_layout;
using e2b::owner_label;
using e2b::seconds_up;
using e2b::survive_label;
using std::chrono::milliseconds;

std::string env_or(const char* name, std::string fallback) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') return value;
    return fallback;
}

}  // namespace

namespace e2b {

sandbox_info info_from(const backend_state& s, const e2b::sandbox_detail& d) {
    sandbox_info info;
    info.id = d.sandbox_id;
    info.state = d.state == "running"  ? sandbox_state::running
                 : d.state == "paused" ? sandbox_state::paused
                                       : sandbox_state::exited;
    info.created_at = d.started_at;
    info.expires_at = d.end_at;
    for (const auto& [k, v] : d.metadata) {
        if (k == owner_label) {
            info.owner_instance = v;
        } else if (k == survive_label) {
            info.survive_owner = v == "true";
        } else {
            info.labels[k] = v;
        }
    }
    if (d.memory_mb > 0) {
        info.limits.memory_bytes = static_cast<std::uint64_t>(d.memory_mb) * 1024 * 1024;
    }
    if (d.cpu_count > 0 && d.cpu_count <= 1000) {
        info.limits.cpu_millicores = static_cast<std::uint32_t>(d.cpu_count * 1000);
    }
    info.layout = e2b_layout();
    info.owned = false;
    const auto held = s.held.find(d.sandbox_id);
    // A SandboxDetail tells the provider's view of the egress; a list entry tells none, and
    // then a sandbox this backend holds keeps what it was created or attached with.
    if (d.network_reported) {
        info.network = e2b::network_from(d);
    } else if (held != s.held.end()) {
        info.network = held->second->info.network;
    }
    if (held != s.held.end()) {
        info.owned = held->second->info.owned;
        if (held->second->heartbeat) info.expires_at = held->second->ttl_end;
    }
    return info;
}

std::string envd_url_for(const backend_state& s, const std::string& id, const std::string& domain) {
    if (!s.config.sandbox_url.empty()) return s.config.sandbox_url;
    const std::string& d = domain.empty() ? s.config.domain : domain;
    return "https://49983-" + id + "." + d;
}

std::shared_ptr<e2b::envd_client> envd_client_for(const backend_state& s, const std::string& id,
                                                  const std::string& domain,
                                                  std::string access_token) {
    e2b::envd_endpoint endpoint;
    endpoint.base_url = envd_url_for(s, id, domain);
    endpoint.sandbox_id = id;
    endpoint.access_token = std::move(access_token);
    endpoint.user = "user";
    e2b::envd_options options;
    options.request_timeout = s.config.request_timeout;
    options.kill_grace = s.config.kill_grace;
    return std::make_shared<e2b::envd_client>(s.http, std::move(endpoint), options);
}

error gone_error(const std::string& id, const held_sandbox& h) {
    return make_error(errc::sandbox_unavailable, "sandbox " + id + ": " + *h.gone_reason);
}

// The sandbox's envd is gone for good: its client goes, and so does the HTTP client's state for
// its own origin (49983-<id>.<domain>), idle connections included. A shared E2B_SANDBOX_URL
// stays: other sandboxes use it.
void forget_envd(backend_state& s, held_sandbox& h) {
    if (!h.envd) return;
    if (const auto& url = h.envd->endpoint().base_url; url != s.config.sandbox_url) {
        s.http->drop_origin(url);
    }
    h.envd.reset();
}

void mark_gone(backend_state& s, held_sandbox& h, std::string reason) {
    h.gone_reason = std::move(reason);
    h.info.state = sandbox_state::exited;
    forget_envd(s, h);
}

}  // namespace e2b

namespace {

using e2b::backend_state;
using e2b::envd_client_for;
using e2b::forget_envd;
using e2b::gone_error;
using e2b::heartbeat_loop;
using e2b::held_sandbox;
using e2b::info_from;
using e2b::mark_gone;

class e2b_backend final : public backend {
  public:
    e2b_backend(asio::any_io_executor executor, e2b_config config)
        : state_(std::make_shared<backend_state>()), tasks_(executor, "e2b") {
        auto& s = *state_;
        s.executor = executor;
        if (config.owner_instance.empty()) config.owner_instance = e2b::default_owner_instance();
        s.config = e2b_config_from_environment(std::move(config));
        auto parsed = http::parse_url(s.config.api_url);
        if (!parsed) s.config_error = "E2B_API_URL (e2b_config::api_url): " + parsed.error().detail;
        http::client_options options;
        options.plain_http_hosts = s.config.plain_http_hosts;
        options.use_system_ca_store = s.config.use_system_ca_store;
        options.ca_file = s.config.ca_file;
        s.http = std::make_shared<http::client>(executor, options);
        s.renewals_in_flight = std::max<std::size_t>(1, options.max_connections_per_origin / 2);
        e2b::control_plane_options control;
        control.api_url = s.config.api_url;
        control.api_key = s.config.api_key;
        control.request_timeout = s.config.request_timeout;
        control.max_retry_after = s.config.max_retry_after;
        s.control = std::make_unique<e2b::control_plane_client>(s.http, control);
    }

    ~e2b_backend() override {
        // Held sandboxes are left to their E2B timeout: the heartbeat's for non-survivors.
        state_->stopping = true;
        tasks_.cancel_all();
    }

    asio::any_io_executor get_executor() const override { return state_->executor; }
    std::string name() const override { return "e2b"; }
    milliseconds stop_grace() const override {
        return state_->config.kill_grace + state_->config.network_grace;
    }

    asio::awaitable<result<sandbox_info>> async_create(sandbox_spec spec) override {
        return guarded(create(state_, std::move(spec), this));
    }
    asio::awaitable<result<sandbox_info>> async_attach(std::string id) override {
        return guarded(attach(state_, std::move(id)));
    }
    asio::awaitable<result<sandbox_info>> async_inspect(std::string id) override {
        return guarded(inspect(state_, std::move(id)));
    }
    asio::awaitable<result<std::vector<sandbox_info>>> async_list(label_filter filter) override {
        return guarded(list(state_, std::move(filter)));
    }
    asio::awaitable<result<sandbox_info>> async_extend_ttl(std::string id,
                                                           milliseconds ttl) override {
        return guarded(extend_ttl(state_, std::move(id), ttl));
    }
    asio::awaitable<result<sandbox_info>> async_update_network(std::string id,
                                                               sandbox_network network) override {
        return guarded(update_network(state_, std::move(id), std::move(network)));
    }
    asio::awaitable<result<sandbox_info>> async_pause(std::string id) override {
        return guarded(pause(state_, std::move(id)));
    }
    asio::awaitable<result<sandbox_info>> async_resume(std::string id) override {
        return guarded(resume(state_, std::move(id)));
    }
    bool is_paused(const std::string& id) const override {
        const auto it = state_->held.find(id);
        return it != state_->held.end() && it->second->paused;
    }
    asio::awaitable<result<void>> async_destroy(std::string id) override {
        return guarded(destroy(state_, std::move(id)));
    }
    asio::awaitable<result<host_report>> async_host_report() override {
        return guarded(report(state_));
    }
    asio::awaitable<result<std::vector<janitor_action>>> async_janitor(bool dry_run) override {
        return guarded(janitor(state_, dry_run));
    }
    asio::awaitable<result<exec_stream>> async_exec_stream(std::string id,
                                                           exec_request request) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_exec_stream,
                                    std::move(request)));
    }
    sandbox_layout layout_for(const sandbox_layout& requested) const override {
        return requested == sandbox_layout{} ? e2b_layout() : requested;
    }

    asio::awaitable<result<process>> async_spawn(std::string id, exec_request request) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_spawn,
                                    std::move(request)));
    }
    asio::awaitable<result<void>> async_signal(std::string id, std::uint64_t process_id,
                                               int signal) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_signal,
                                    process_id, signal));
    }
    asio::awaitable<result<std::vector<file_write_result>>> async_write_files(
        std::string id, std::vector<file_write> files) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_write_files,
                                    std::move(files)));
    }
    asio::awaitable<result<std::vector<file_read_result>>> async_read_files(
        std::string id, std::vector<std::string> paths) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_read_files,
                                    std::move(paths)));
    }
    asio::awaitable<result<file_write_result>> async_write_file_stream(
        std::string id, file_write_target target, byte_source source) override {
        return guarded(through_envd(state_, std::move(id),
                                    &e2b::envd_client::async_write_file_stream, std::move(target),
                                    std::move(source)));
    }
    asio::awaitable<result<file_read_stream>> async_read_file_stream(std::string id,
                                                                     std::string path) override {
        return guarded(through_envd(state_, std::move(id),
                                    &e2b::envd_client::async_read_file_stream, std::move(path)));
    }
    asio::awaitable<result<std::vector<file_metadata_result>>> async_read_metadata(
        std::string id, std::vector<std::string> paths) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_read_metadata,
                                    std::move(paths)));
    }
    asio::awaitable<result<file_stat>> async_stat(std::string id, std::string path) override {
        return guarded(
            through_envd(state_, std::move(id), &e2b::envd_client::async_stat, std::move(path)));
    }
    asio::awaitable<result<std::vector<dir_entry>>> async_list_dir(std::string id,
                                                                   std::string path) override {
        return guarded(through_envd(state_, std::move(id), &e2b::envd_client::async_list_dir,
                                    std::move(path)));
    }

    // E2B reaches a sandbox's ports only through its proxy, by name: "<port>-<id>.<domain>".
    result<std::string> port_host(const std::string& id, std::uint16_t port) const override {
        if (port == 0) return make_error(errc::invalid_argument, "port 0: a port is 1-65535");
        const auto held = state_->held.find(id);
        const std::string& domain =
            held != state_->held.end() ? held->second->domain : state_->config.domain;
        return std::to_string(port) + "-" + id + "." + domain;
    }

    // The heartbeat task, started with the first sandbox that needs one.
    void ensure_heartbeat() {
        if (state_->heartbeat_running || state_->stopping) return;
        state_->heartbeat_running = true;
        tasks_.spawn(heartbeat_loop(state_));
    }

  private:
    static result<void> usable(const backend_state& s) {
        if (!s.config_error.empty()) return make_error(errc::invalid_argument, s.config_error);
        return {};
    }

    // none: E2B's internet switch off; all: on; an allow-list: on, everything denied but the
    // listed names (E2B allows the names in allowOut, HTTP and HTTPS, past the denyOut range).
    static void map_network(const sandbox_network& n, e2b::create_body& body) {
        body.allow_internet_access = n.mode != network_mode::none;
        if (n.mode == network_mode::allow_list) {
            body.allow_out = n.allow_hosts;
            body.deny_out = {"0.0.0.0/0"};
        }
    }

    static asio::awaitable<result<sandbox_info>> create(std::shared_ptr<backend_state> s,
                                                        sandbox_spec spec, e2b_backend* self) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        if (auto ok = e2b::validate_spec(spec); !ok) co_return std::move(ok).error();
        e2b::create_body body;
        body.template_id =
            spec.template_name.empty() ? s->config.default_template : spec.template_name;
        const bool heartbeat = !spec.survive_owner;
        milliseconds first = spec.ttl;
        if (heartbeat) first = std::min(first, s->config.heartbeat_timeout);
        body.timeout_s = seconds_up(first);
        body.metadata = spec.labels;
        body.metadata[std::string(owner_label)] = s->config.owner_instance;
        body.metadata[std::string(survive_label)] = spec.survive_owner ? "true" : "false";
        body.env_vars = spec.env;
        map_network(spec.network, body);
        const auto started = system_clock::now();
        auto created = co_await s->control->async_create(std::move(body));
        if (!created) co_return std::move(created).error();
        auto h = std::make_shared<held_sandbox>();
        h->ttl_end = started + spec.ttl;
        h->heartbeat = heartbeat;
        h->envd = envd_client_for(*s, created->sandbox_id, created->domain,
                                  std::move(created->envd_access_token));
        h->domain = created->domain.empty() ? s->config.domain : created->domain;
        auto& info = h->info;
        info.id = created->sandbox_id;
        info.state = sandbox_state::running;
        info.labels = spec.labels;
        info.created_at = started;
        info.expires_at = h->ttl_end;
        info.layout = e2b_layout();
        info.owner_instance = s->config.owner_instance;
        info.survive_owner = spec.survive_owner;
        info.owned = true;
        info.network = spec.network;
        s->held[info.id] = h;
        if (heartbeat && !s->stopping) self->ensure_heartbeat();
        detail::log(log_level::debug, "e2b", "created", info.id);
        co_return info;
    }

    static asio::awaitable<result<sandbox_info>> attach(std::shared_ptr<backend_state> s,
                                                        std::string id) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        if (auto it = s->held.find(id); it != s->held.end()) {
            if (it->second->gone_reason) co_return gone_error(id, *it->second);
            co_return it->second->info;
        }
        auto detail = co_await s->control->async_get(id);
        if (!detail) co_return std::move(detail).error();
        auto info = info_from(*s, *detail);
        if (info.state != sandbox_state::running) {
            co_return make_error(errc::sandbox_unavailable,
                                 "sandbox " + id + " is " + detail->state + ", not running");
        }
        const bool moat_owned = detail->metadata.contains(std::string(owner_label));
        if (moat_owned && !info.survive_owner && info.owner_instance != s->config.owner_instance) {
            co_return make_error(errc::sandbox_unavailable,
                                 "sandbox " + id + " was not created to survive its owner (" +
                                     info.owner_instance + ")");
        }
        // A timeout of 1 s only extends an end that is about to pass: the sandbox keeps its own.
        auto connected = co_await s->control->async_connect(id, 1);
        if (!connected) co_return std::move(connected).error();
        auto h = std::make_shared<held_sandbox>();
        h->ttl_end = detail->end_at;
        h->heartbeat = false;
        h->envd =
            envd_client_for(*s, id, connected->domain, std::move(connected->envd_access_token));
        h->domain = connected->domain.empty() ? s->config.domain : connected->domain;
        info.owned = false;
        h->info = info;
        s->held[id] = h;
        co_return info;
    }

    static asio::awaitable<result<sandbox_info>> inspect(std::shared_ptr<backend_state> s,
                                                         std::string id) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        auto it = s->held.find(id);
        if (it != s->held.end() && it->second->gone_reason) co_return it->second->info;
        auto detail = co_await s->control->async_get(id);
        if (!detail) {
            it = s->held.find(id);
            if (detail.error().code == errc::sandbox_not_found && it != s->held.end()) {
                mark_gone(*s, *it->second, "it has ended");
                co_return it->second->info;
            }
            co_return std::move(detail).error();
        }
        co_return info_from(*s, *detail);
    }

    static asio::awaitable<result<std::vector<sandbox_info>>> list(std::shared_ptr<backend_state> s,
                                                                   label_filter filter) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        e2b::list_query q;
        q.metadata = filter;
        q.state = "running";
        auto listed = co_await s->control->async_list(std::move(q));
        if (!listed) co_return std::move(listed).error();
        std::vector<sandbox_info> out;
        for (const auto& d : *listed) {
            // The server filters; a server that filters loosely must not widen the answer.
            const bool matches = std::all_of(filter.begin(), filter.end(), [&d](const auto& kv) {
                auto found = d.metadata.find(kv.first);
                return found != d.metadata.end() && found->second == kv.second;
            });
            if (matches) out.push_back(info_from(*s, d));
        }
        std::stable_partition(out.begin(), out.end(),
                              [](const sandbox_info& i) { return i.owned; });
        co_return out;
    }

    // The sandbox this backend holds as `id`, or null when it holds none; gone_error when it
    // holds one that has ended.
    static result<std::shared_ptr<held_sandbox>> held_unless_gone(backend_state& s,
                                                                  const std::string& id) {
        std::shared_ptr<held_sandbox> h;
        if (auto it = s.held.find(id); it != s.held.end()) h = it->second;
        if (h && h->gone_reason) return gone_error(id, *h);
        return h;
    }

    // A control-plane error about `id`: a held sandbox it no longer knows is marked gone.
    static error control_error(backend_state& s, const std::shared_ptr<held_sandbox>& h,
                               const std::string& id, error e) {
        if (!h || e.code != errc::sandbox_not_found) return e;
        mark_gone(s, *h, "it has ended");
        return gone_error(id, *h);
    }

    static asio::awaitable<result<sandbox_info>> extend_ttl(std::shared_ptr<backend_state> s,
                                                            std::string id, milliseconds ttl) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        if (auto valid = validate_ttl(ttl); !valid) co_return std::move(valid).error();
        auto found = held_unless_gone(*s, id);
        if (!found) co_return std::move(found).error();
        const auto h = *found;
        milliseconds timeout = ttl;
        if (h && h->heartbeat) timeout = std::min(ttl, s->config.heartbeat_timeout);
        const auto asked = system_clock::now();
        auto set = co_await s->control->async_set_timeout(id, seconds_up(timeout));
        if (!set) co_return control_error(*s, h, id, std::move(set).error());
        if (h) {
            h->ttl_end = asked + ttl;
            h->info.expires_at = h->ttl_end;
        }
        // Confirmed by the control plane: its end as it now stands.
        auto detail = co_await s->control->async_get(id);
        if (!detail) co_return std::move(detail).error();
        co_return info_from(*s, *detail);
    }

    // E2B's own limit applies (moat's network_limit has no E2B form): as a create maps it.
    static asio::awaitable<result<sandbox_info>> update_network(std::shared_ptr<backend_state> s,
                                                                std::string id,
                                                                sandbox_network network) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        if (auto ok = e2b::validate_network(network); !ok) co_return std::move(ok).error();
        e2b::create_body mapped;
        map_network(network, mapped);
        e2b_protocol::network_update_request body;
        body.allow_internet_access = mapped.allow_internet_access;
        body.network.allow_out = std::move(mapped.allow_out);
        body.network.deny_out = std::move(mapped.deny_out);
        auto updated = co_await s->control->async_update_network(id, std::move(body));
        if (!updated) co_return std::move(updated).error();
        if (auto it = s->held.find(id); it != s->held.end()) it->second->info.network = network;
        auto detail = co_await s->control->async_get(id);
        if (!detail) co_return std::move(detail).error();
        co_return info_from(*s, *detail);
    }

    // E2B's pause (memory kept; its TTL stands still): POST /pause, then the control plane's view.
    // The heartbeat leaves a paused sandbox alone; what was left of its TTL waits for the resume.
    static asio::awaitable<result<sandbox_info>> pause(std::shared_ptr<backend_state> s,
                                                       std::string id) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        auto found = held_unless_gone(*s, id);
        if (!found) co_return std::move(found).error();
        const auto h = *found;
        const auto asked = system_clock::now();
        auto paused = co_await s->control->async_pause(id);
        if (!paused) co_return control_error(*s, h, id, std::move(paused).error());
        if (h && !h->paused) {
            h->paused = true;
            h->ttl_left = std::max(milliseconds(1),
                                   std::chrono::duration_cast<milliseconds>(h->ttl_end - asked));
            h->info.state = sandbox_state::paused;
        }
        auto detail = co_await s->control->async_get(id);
        if (!detail) co_return std::move(detail).error();
        auto info = info_from(*s, *detail);
        if (h) info.ttl_left = h->ttl_left;
        co_return info;
    }

    // E2B resumes a paused sandbox on connect: its end then is now + what was left of its TTL (the
    // heartbeat's timeout for a sandbox the heartbeat keeps, which then renews it as before).
    static asio::awaitable<result<sandbox_info>> resume(std::shared_ptr<backend_state> s,
                                                        std::string id) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        auto found = held_unless_gone(*s, id);
        if (!found) co_return std::move(found).error();
        const auto h = *found;
        // A sandbox paused by another process: E2B's own default timeout.
        milliseconds left = h && h->paused ? h->ttl_left : milliseconds(std::chrono::minutes(5));
        milliseconds timeout = left;
        if (h && h->heartbeat) timeout = std::min(left, s->config.heartbeat_timeout);
        const auto asked = system_clock::now();
        auto connected = co_await s->control->async_connect(id, seconds_up(timeout));
        if (!connected) co_return control_error(*s, h, id, std::move(connected).error());
        if (h && h->paused) {
            h->paused = false;
            h->ttl_end = asked + left;
            h->info.state = sandbox_state::running;
            h->info.expires_at = h->ttl_end;
        }
        auto detail = co_await s->control->async_get(id);
        if (!detail) co_return std::move(detail).error();
        co_return info_from(*s, *detail);
    }

    static asio::awaitable<result<void>> destroy(std::shared_ptr<backend_state> s, std::string id) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        const bool is_held = s->held.contains(id);
        auto killed = co_await s->control->async_kill(id);
        if (!killed) co_return std::move(killed).error();
        if (!*killed && !is_held) {
            co_return make_error(errc::sandbox_not_found, "no sandbox " + id);
        }
        // Gone only once the control plane no longer knows it, within the request bound.
        const auto limit = deadline::after(s->config.request_timeout);
        asio::steady_timer timer(s->executor);
        milliseconds pause(50);
        for (;;) {
            std::string target = id;
            auto detail = co_await s->control->async_get(std::move(target));
            if (!detail && detail.error().code == errc::sandbox_not_found) break;
            if (!detail && detail.error().code == errc::unauthorized) {
                co_return std::move(detail).error();
            }
            if (limit.remaining() <= pause) {
                co_return make_error(errc::backend_failure,
                                     "sandbox " + id +
                                         ": killed, but the control plane still "
                                         "listed it after " +
                                         std::to_string(s->config.request_timeout.count()) + " ms");
            }
            timer.expires_after(pause);
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec) co_return make_error(errc::cancelled, "destroy: cancelled");
            pause = std::min(pause * 2, milliseconds(1000));
        }
        if (const auto it = s->held.find(id); it != s->held.end()) {
            forget_envd(*s, *it->second);
            s->held.erase(it);
        }
        detail::log(log_level::debug, "e2b", "destroyed", id);
        co_return result<void>();
    }

    static asio::awaitable<result<host_report>> report(std::shared_ptr<backend_state> s) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        auto checked = co_await s->control->async_check();
        if (!checked) co_return std::move(checked).error();
        host_report r;
        r.facts["api_url"] = s->config.api_url;
        r.facts["domain"] = s->config.domain;
        if (!s->config.sandbox_url.empty()) r.facts["sandbox_url"] = s->config.sandbox_url;
        r.facts["default_template"] = s->config.default_template;
        r.facts["owner_instance"] = s->config.owner_instance;
        r.facts["heartbeat_timeout_ms"] = std::to_string(s->config.heartbeat_timeout.count());
        co_return r;
    }

    static asio::awaitable<result<std::vector<janitor_action>>> janitor(
        std::shared_ptr<backend_state> s, bool dry_run) {
        if (auto ok = usable(*s); !ok) co_return std::move(ok).error();
        e2b::list_query q;
        auto listed = co_await s->control->async_list(std::move(q));
        if (!listed) co_return std::move(listed).error();
        const std::string host = e2b::this_host_name();
        std::vector<janitor_action> actions;
        for (const auto& d : *listed) {
            const auto owner = d.metadata.find(std::string(owner_label));
            if (owner == d.metadata.end()) continue;  // not moat's
            if (s->held.contains(d.sandbox_id) || owner->second == s->config.owner_instance) {
                continue;
            }
            const auto survive = d.metadata.find(std::string(survive_label));
            if (survive != d.metadata.end() && survive->second == "true") continue;
            if (!e2b::owner_is_gone(owner->second, host)) continue;
            janitor_action a;
            a.action = "destroy";
            a.target = d.sandbox_id;
            a.reason = "its owner " + owner->second + " is no longer running on this host";
            if (!dry_run) {
                auto destroyed = co_await destroy(s, d.sandbox_id);
                if (destroyed || destroyed.error().code == errc::sandbox_not_found) {
                    a.done = true;
                } else {
                    a.error = destroyed.error().to_string();
                }
            }
            actions.push_back(std::move(a));
        }
        co_return actions;
    }

    // The envd client of a sandbox this backend holds: sandbox_not_found for one it does not
    // (create or attach it first), sandbox_unavailable once it is known to have ended.
    static result<std::shared_ptr<e2b::envd_client>> envd_of(const backend_state& s,
                                                             const std::string& id) {
        auto it = s.held.find(id);
        if (it == s.held.end()) {
            return make_error(errc::sandbox_not_found,
                              "sandbox " + id + " is not held by this backend: attach to it first");
        }
        if (it->second->gone_reason) return gone_error(id, *it->second);
        return it->second->envd;
    }

    // One of the envd client's calls on a held sandbox's client (sandbox_not_found when it is
    // not held, the gone error when it is gone), with the call's own arguments.
    template <class T, class... Params, class... Args>
    static asio::awaitable<result<T>> through_envd(
        std::shared_ptr<backend_state> s, std::string id,
        asio::awaitable<result<T>> (e2b::envd_client::*call)(Params...), Args... args) {
        auto envd = envd_of(*s, id);
        if (!envd) co_return std::move(envd).error();
        auto client = *envd;
        co_return co_await ((*client).*call)(std::move(args)...);
    }

    std::shared_ptr<backend_state> state_;
    task_group tasks_;
};

}  // namespace

e2b_config e2b_config_from_environment(e2b_config config) {
    if (config.api_key.empty()) config.api_key = env_or("E2B_API_KEY", "");
    if (config.domain.empty()) config.domain = env_or("E2B_DOMAIN", "e2b.app");
    if (config.api_url.empty())
        config.api_url = env_or("E2B_API_URL", "https://api." + config.domain);
    if (config.sandbox_url.empty()) config.sandbox_url = env_or("E2B_SANDBOX_URL", "");
    if (config.ca_file.empty()) config.ca_file = env_or("MOAT_E2B_CA_FILE", "");
    while (!config.sandbox_url.empty() && config.sandbox_url.back() == '/') {
        config.sandbox_url.pop_back();
    }
    return config;
}

std::unique_ptr<backend> make_e2b_backend(asio::any_io_executor executor, e2b_config config) {
    return std::make_unique<e2b_backend>(std::move(executor), std::move(config));
}

}  // namespace moat
