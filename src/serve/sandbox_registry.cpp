#include "serve/sandbox_registry.hpp"

#include <moat/log.hpp>

#include "core/json_writer.hpp"

#include <simdjson.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace moat::serve {
namespace {

using system_clock = std::chrono::system_clock;

std::int64_t to_unix_ms(system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::string sidecar_json(const registry_entry& e) {
    json_writer w;
    w.begin_object();
    w.key("template").value(e.template_id);
    w.key("startedAt").value(to_unix_ms(e.started_at));
    w.key("privatePorts").value(e.private_ports);
    w.key("autoPause").value(e.auto_pause);
    if (!e.mask_request_host.empty()) w.key("maskRequestHost").value(e.mask_request_host);
    w.key("autoResume").value(e.auto_resume);
    w.key("autoResumeTimeout").value(static_cast<std::int64_t>(e.auto_resume_ttl.count()));
    w.key("metadata").begin_object();
    for (const auto& [k, v] : e.metadata) w.key(k).value(v);
    w.end_object();
    w.key("envVars").begin_object();
    for (const auto& [k, v] : e.env_vars) w.key(k).value(v);
    w.end_object();
    w.end_object();
    return w.take();
}

void read_string_map(simdjson::dom::object o, const char* name,
                     std::map<std::string, std::string>& out) {
    simdjson::dom::object m;
    if (o[name].get_object().get(m) != simdjson::SUCCESS) return;
    for (auto field : m) {
        std::string_view v;
        if (field.value.get_string().get(v) == simdjson::SUCCESS) {
            out[std::string(field.key)] = std::string(v);
        }
    }
}

// Fills template, metadata, envs, the ports' privacy, the start time and the pause policy from a
// sidecar; false if it is unreadable.
bool read_sidecar(const std::string& path, registry_entry& e) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::ostringstream text;
    text << in.rdbuf();
    const simdjson::padded_string padded(text.str());
    simdjson::dom::parser parser;
    simdjson::dom::object o;
    if (parser.parse(padded).get_object().get(o) != simdjson::SUCCESS) return false;
    std::string_view template_id;
    if (o["template"].get_string().get(template_id) == simdjson::SUCCESS) {
        e.template_id = std::string(template_id);
    }
    std::int64_t started = 0;
    if (o["startedAt"].get_int64().get(started) == simdjson::SUCCESS) {
        e.started_at = system_clock::time_point(std::chrono::milliseconds(started));
    }
    bool auto_pause = false;
    if (o["autoPause"].get_bool().get(auto_pause) == simdjson::SUCCESS) e.auto_pause = auto_pause;
    bool auto_resume = false;
    if (o["autoResume"].get_bool().get(auto_resume) == simdjson::SUCCESS) {
        e.auto_resume = auto_resume;
    }
    std::int64_t resume_ttl = 0;
    if (o["autoResumeTimeout"].get_int64().get(resume_ttl) == simdjson::SUCCESS && resume_ttl > 0) {
        e.auto_resume_ttl = std::chrono::seconds(resume_ttl);
    }
    bool private_ports = false;
    if (o["privatePorts"].get_bool().get(private_ports) == simdjson::SUCCESS) {
        e.private_ports = private_ports;
    }
    std::string_view mask;
    if (o["maskRequestHost"].get_string().get(mask) == simdjson::SUCCESS) {
        e.mask_request_host = std::string(mask);
    }
    read_string_map(o, "metadata", e.metadata);
    read_string_map(o, "envVars", e.env_vars);
    return true;
}

asio::awaitable<void> destroy_quietly(std::shared_ptr<sandbox> handle) {
    auto destroyed = co_await handle->async_destroy();
    if (!destroyed && destroyed.error().code != errc::sandbox_not_found) {
        detail::log(log_level::warning, "serve",
                    "destroying an expired sandbox: " + destroyed.error().to_string(),
                    handle->id());
    }
}

}  // namespace

struct destroy_attempt {
    explicit destroy_attempt(asio::any_io_executor executor) : done(std::move(executor)) {}
    async_event done;
    result<void> outcome;
};

namespace {

// One destroy of `entry`'s sandbox, for every caller that joins it.
asio::awaitable<void> run_destroy(sandbox_registry* registry, std::shared_ptr<registry_entry> entry,
                                  backend* sandboxes, std::shared_ptr<destroy_attempt> attempt) {
    result<void> destroyed;
    if (entry->handle && entry->handle->state() != handle_state::destroy_failed) {
        destroyed = co_await entry->handle->async_destroy();
    } else {
        std::string id = entry->id;
        destroyed = co_await sandboxes->async_destroy(std::move(id));
    }
    if (!destroyed && destroyed.error().code == errc::sandbox_not_found) destroyed = {};
    if (!destroyed) {
        detail::log(log_level::warning, "serve",
                    "destroy not confirmed, the sandbox is kept: " + destroyed.error().to_string(),
                    entry->id);
    }
    attempt->outcome = std::move(destroyed);
    if (entry->destroying == attempt) entry->destroying.reset();
    if (attempt->outcome) registry->remove(entry);
    attempt->done.set();
}

}  // namespace

sandbox_registry::sandbox_registry(asio::any_io_executor executor, std::string state_dir,
                                   server_secret secret)
    : executor_(executor),
      state_dir_(std::move(state_dir)),
      secret_(std::move(secret)),
      cleanup_(executor, "serve-registry") {}

sandbox_registry::~sandbox_registry() = default;

std::map<std::string, std::string> sandbox_registry::scope_labels() const {
    return {{std::string(scope_label), secret_.scope()}};
}

result<void> sandbox_registry::open() {
    const std::string dir = state_dir_ + "/sandboxes";
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return make_error(errc::backend_failure,
                          "cannot make " + dir + ": " + std::string(std::strerror(errno)));
    }
    return {};
}

std::string sandbox_registry::sidecar_path(std::string_view id) const {
    return state_dir_ + "/sandboxes/" + std::string(id) + ".json";
}

result<void> sandbox_registry::save(const registry_entry& entry) const {
    const std::string path = sidecar_path(entry.id);
    const std::string temporary = path + ".tmp";
    const std::string text = sidecar_json(entry);
    const int fd =
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        return make_error(errc::backend_failure,
                          "cannot write " + temporary + ": " + std::string(std::strerror(errno)));
    }
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
        ::unlink(temporary.c_str());
        return make_error(errc::backend_failure, "cannot write " + path);
    }
    return {};
}

result<std::shared_ptr<registry_entry>> sandbox_registry::add(
    std::shared_ptr<registry_entry> entry) {
    entry->access_token = secret_.access_token(entry->id);
    if (entry->private_ports) entry->traffic_token = secret_.traffic_token(entry->id);
    auto saved = save(*entry);
    if (!saved) return std::move(saved).error();
    entries_[entry->id] = entry;
    return entry;
}

void sandbox_registry::prune(system_clock::time_point now) {
    for (auto it = entries_.begin(); it != entries_.end();) {
        auto& e = it->second;
        if (!e->is_past_end(now)) {
            ++it;
            continue;
        }
        e->ended.set();
        ::unlink(sidecar_path(e->id).c_str());
        // Past its end the sandbox has ended itself (its TTL); destroying releases its record.
        if (e->handle) cleanup_.spawn(destroy_quietly(e->handle));
        it = entries_.erase(it);
    }
}

std::shared_ptr<registry_entry> sandbox_registry::find(std::string_view id) {
    prune(system_clock::now());
    const auto it = entries_.find(id);
    if (it == entries_.end()) return nullptr;
    return it->second;
}

std::vector<std::shared_ptr<registry_entry>> sandbox_registry::live() {
    prune(system_clock::now());
    std::vector<std::shared_ptr<registry_entry>> out;
    out.reserve(entries_.size());
    for (const auto& [id, e] : entries_) out.push_back(e);
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
        if (a->started_at != b->started_at) return a->started_at > b->started_at;
        return a->id > b->id;
    });
    return out;
}

std::size_t sandbox_registry::live_count() {
    prune(system_clock::now());
    return entries_.size();
}

void sandbox_registry::remove(const std::shared_ptr<registry_entry>& entry) {
    entry->ended.set();
    ::unlink(sidecar_path(entry->id).c_str());
    const auto it = entries_.find(entry->id);
    if (it != entries_.end() && it->second == entry) entries_.erase(it);
}

asio::awaitable<result<void>> sandbox_registry::async_destroy(std::shared_ptr<registry_entry> entry,
                                                              backend& sandboxes) {
    auto attempt = entry->destroying;
    if (attempt) {
        detail::log(log_level::debug, "serve", "a DELETE joins the destroy in flight", entry->id);
    } else {
        attempt = std::make_shared<destroy_attempt>(executor_);
        entry->destroying = attempt;
        entry->ended.set();  // its streams end now, with "the sandbox <id> ended"
        cleanup_.spawn(run_destroy(this, entry, &sandboxes, attempt));
    }
    const auto forever = deadline::never();
    while (!attempt->done.is_set()) {
        const auto waited = co_await attempt->done.async_wait(forever);
        if (waited == async_event::wait_outcome::cancelled) {
            co_return make_error(errc::cancelled,
                                 "stopped waiting for the destroy of " + entry->id);
        }
    }
    co_return attempt->outcome;
}

asio::awaitable<std::size_t> sandbox_registry::async_adopt(runtime& sandboxes) {
    label_filter filter;
    for (auto& [k, v] : scope_labels()) filter[k] = v;
    auto listed = co_await sandboxes.get_backend().async_list(filter);
    if (!listed) {
        detail::log(log_level::warning, "serve",
                    "cannot list sandboxes to adopt: " + listed.error().to_string());
        co_return 0;
    }
    std::size_t adopted = 0;
    const auto now = system_clock::now();
    for (const auto& info : *listed) {
        if (info.state == sandbox_state::exited || info.expires_at <= now) {
            // Ended while no server ran (its TTL): release its record; its sidecar goes below.
            std::string ended_id = info.id;
            (void)co_await sandboxes.get_backend().async_destroy(std::move(ended_id));
            continue;
        }
        if (entries_.contains(info.id)) continue;
        std::string id = info.id;
        auto attached = co_await sandboxes.async_attach(std::move(id));
        if (!attached) {
            detail::log(log_level::info, "serve", "not adopted: " + attached.error().to_string(),
                        info.id);
            continue;
        }
        auto entry = std::make_shared<registry_entry>(executor_);
        entry->id = info.id;
        entry->handle = *attached;
        entry->started_at = info.created_at;
        entry->end_at = (*attached)->info().expires_at;
        entry->paused = info.state == sandbox_state::paused;
        if (info.paused_at) entry->paused_at = *info.paused_at;
        // A sidecar that cannot be read keeps the sandbox's ports private (fail closed): a client
        // that had its traffic token keeps it (derived), nobody else gets in.
        if (!read_sidecar(sidecar_path(info.id), *entry)) entry->private_ports = true;
        entry->access_token = secret_.access_token(entry->id);
        if (entry->private_ports) entry->traffic_token = secret_.traffic_token(entry->id);
        if (entry->auto_pause && !entry->paused) entry->end_at -= auto_pause_grace;
        entries_[entry->id] = entry;
        ++adopted;
    }
    remove_orphaned_sidecars();
    co_return adopted;
}

void sandbox_registry::remove_orphaned_sidecars() {
    std::error_code ec;
    std::vector<std::string> orphans;
    for (const auto& file : std::filesystem::directory_iterator(state_dir_ + "/sandboxes", ec)) {
        const std::string name = file.path().filename().string();
        const auto dot = name.find('.');
        const std::string id = name.substr(0, dot);
        if (!entries_.contains(id)) orphans.push_back(file.path().string());
    }
    for (const auto& path : orphans) ::unlink(path.c_str());
}

asio::awaitable<std::size_t> sandbox_registry::async_destroy_all(backend& sandboxes) {
    std::size_t unconfirmed = 0;
    auto all = live();
    for (auto& e : all) {
        auto destroyed = co_await async_destroy(e, sandboxes);
        if (!destroyed) ++unconfirmed;  // logged by the destroy
    }
    co_return unconfirmed;
}

asio::awaitable<void> sandbox_registry::async_drain() {
    co_await cleanup_.async_wait_all();
}

}  // namespace moat::serve
