#include "serve/serve_host.hpp"

#include <moat/log.hpp>
#include <moat/runtime.hpp>
#include <moat/task_group.hpp>

#include "core/asio_compat.hpp"
#include "http/tls_server_stream.hpp"
#include "serve/control_plane.hpp"
#include "serve/envd_server.hpp"
#include "serve/sandbox_metrics.hpp"
#include "serve/sandbox_pause.hpp"
#include "serve/sandbox_registry.hpp"
#include "serve/serve_context.hpp"
#include "serve/server_secret.hpp"

#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace moat::serve {
namespace {

constexpr int exit_usage = 2;
constexpr int exit_failure = 3;

std::string url_of(const asio::ip::tcp::endpoint& e, bool tls) {
    std::string host = e.address().to_string();
    if (e.address().is_v6()) host = "[" + host + "]";
    return std::string(tls ? "https://" : "http://") + host + ":" + std::to_string(e.port());
}

result<void> make_private_dir(const std::string& dir) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return make_error(errc::backend_failure,
                          "cannot make the state directory " + dir + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return make_error(errc::backend_failure,
                          "the state directory " + dir + " is not a directory");
    }
    // Refused, not repaired: whoever else could write there may already have replaced the
    // secret (every sandbox's token derives from it) or planted sidecar records.
    if (st.st_uid != ::geteuid()) {
        return make_error(errc::backend_failure,
                          "the state directory " + dir + " is owned by uid " +
                              std::to_string(st.st_uid) + ", not by this user (uid " +
                              std::to_string(::geteuid()) +
                              "): refusing it; use a directory of this user's, writable by no "
                              "one else");
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
        const char* who = (st.st_mode & S_IWOTH) != 0 ? "others" : "its group";
        return make_error(errc::backend_failure, "the state directory " + dir + " is writable by " +
                                                     who + " (mode " + mode +
                                                     "): refusing it; make it 0700 (chmod 700)");
    }
    if ((st.st_mode & 077) != 0 && ::chmod(dir.c_str(), 0700) != 0) {
        return make_error(errc::backend_failure,
                          "cannot make the state directory " + dir + " private (0700)");
    }
    return {};
}

asio::awaitable<void> wait_for_stop() {
    const auto executor = co_await asio::this_coro::executor;
    asio::steady_timer forever(executor, asio::steady_timer::time_point::max());
    auto token = as_tuple(asio::use_awaitable);
    auto [ec] = co_await forever.async_wait(token);
    (void)ec;  // cancelled: the stop
}

// Raises the soft descriptor limit to the hard one (a server holds a descriptor per connection
// and several per sandbox); returns the soft limit in force.
std::uint64_t raise_descriptor_limit() {
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 1024;
    if (files.rlim_cur < files.rlim_max) {
        const auto before = files.rlim_cur;
        files.rlim_cur = files.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &files) == 0) {
            detail::log(log_level::info, "serve",
                        "descriptor limit raised from " + std::to_string(before) + " to " +
                            std::to_string(files.rlim_cur));
        } else {
            files.rlim_cur = before;
        }
    }
    if (files.rlim_cur == RLIM_INFINITY) return std::numeric_limits<std::uint32_t>::max();
    return files.rlim_cur;
}

// The connection caps of both listeners within `descriptors`: half of them are kept for the
// sandboxes, files and the state directory, the rest go to connections (at most the server's
// default of 1024 per listener), a quarter to the control plane and three quarters to envd. Each
// listener gives a quarter of its connections to clients that have not authenticated, and a
// sixteenth to one such peer address.
void set_connection_caps(std::uint64_t descriptors, http::server_options& api,
                         http::server_options& envd) {
    const std::uint64_t spare = descriptors / 2;
    const std::size_t envd_max = static_cast<std::size_t>(
        std::clamp<std::uint64_t>(spare * 3 / 4, 16, http::server_options{}.max_connections));
    const std::size_t api_max = static_cast<std::size_t>(
        std::clamp<std::uint64_t>(spare / 4, 8, http::server_options{}.max_connections));
    for (auto [options, cap] : {std::pair{&api, api_max}, std::pair{&envd, envd_max}}) {
        options->max_connections = cap;
        options->max_unauthenticated = std::max<std::size_t>(cap / 4, 2);
        options->max_unauthenticated_per_peer = std::max<std::size_t>(cap / 16, 1);
    }
}

}  // namespace

asio::awaitable<int> async_run_serve(backend& sandboxes, serve_options options, serve_hooks hooks) {
    const auto report = [&hooks](const std::string& line) {
        if (hooks.report) hooks.report(line);
    };
    auto host = co_await sandboxes.async_host_report();
    if (!host) {
        report("cannot start the sandbox backend: " + host.error().to_string());
        co_return exit_failure;
    }
    std::string state_dir = options.state_dir;
    if (state_dir.empty()) state_dir = host->facts["state_dir"] + "/serve";
    if (options.data_dir.empty()) options.data_dir = host->facts["data_dir"];
    if (auto made = make_private_dir(state_dir); !made) {
        report(made.error().detail);
        co_return exit_failure;
    }
    auto secret = server_secret::load_or_create(state_dir + "/secret");
    if (!secret) {
        report(secret.error().detail);
        co_return exit_failure;
    }

    http::server_options api_options;
    api_options.listen = options.api_listen;
    api_options.default_max_body_bytes = 256 * 1024;
    http::server_options envd_options;
    envd_options.listen = options.envd_listen;
    const bool tls = !options.tls_certificate_file.empty();
    if (tls) {
        auto factory =
            http::make_tls_stream_factory(options.tls_certificate_file, options.tls_key_file);
        if (!factory) {
            report("TLS: " + factory.error().detail);
            co_return exit_usage;
        }
        api_options.make_stream = *factory;
        envd_options.make_stream = *factory;
    }

    set_connection_caps(raise_descriptor_limit(), api_options, envd_options);

    runtime_options runtime_config;
    // A paused sandbox stays paused until connect, resume or (autoResume) traffic, each of which
    // resumes it through sandbox_pause.hpp, which keeps the entry's state: nothing else may thaw
    // it unseen.
    runtime_config.handle.on_paused = paused_policy::fail;
    if (options.max_sandboxes > 0) {
        // The control plane answers 429 itself; the runtime's cap only backs it up.
        runtime_config.admission.max_live_sandboxes =
            std::max(runtime_config.admission.max_live_sandboxes, options.max_sandboxes);
    }
    const auto executor = co_await asio::this_coro::executor;
    runtime box_runtime(sandboxes, runtime_config);
    sandbox_registry registry(executor, state_dir, std::move(*secret));
    if (auto opened = registry.open(); !opened) {
        report(opened.error().detail);
        co_return exit_failure;
    }
    const std::size_t adopted = co_await registry.async_adopt(box_runtime);
    if (adopted > 0) {
        detail::log(log_level::info, "serve",
                    "adopted " + std::to_string(adopted) + " sandboxes of an earlier run");
    }
    task_group background(executor, "serve");
    serve_context context{executor, box_runtime, registry, options, background};
    background.spawn(run_metrics_sampler(context));
    background.spawn(run_auto_pauser(context));

    int code = 0;
    {
        control_plane api(context, api_options);
        envd_server envd(context, envd_options);
        auto api_endpoint = api.start();
        if (!api_endpoint) {
            report(api_endpoint.error().detail);
            code = exit_usage;
        }
        result<asio::ip::tcp::endpoint> envd_endpoint =
            make_error(errc::invalid_argument, "not started");
        if (code == 0) {
            envd_endpoint = envd.start();
            if (!envd_endpoint) {
                report(envd_endpoint.error().detail);
                code = exit_usage;
            }
        }
        if (code == 0) {
            if (hooks.announce) {
                hooks.announce("api " + url_of(*api_endpoint, tls));
                hooks.announce("envd " + url_of(*envd_endpoint, tls));
            }
            co_await wait_for_stop();
            co_await asio::this_coro::reset_cancellation_state();
        }
        co_await api.async_stop(hooks.stop_grace);
        co_await envd.async_stop(hooks.stop_grace);
    }
    background.cancel_all();
    co_await background.async_wait_all();
    if (options.destroy_on_exit) {
        const std::size_t unconfirmed = co_await registry.async_destroy_all(sandboxes);
        if (unconfirmed > 0) {
            report(std::to_string(unconfirmed) + " sandboxes were not confirmed destroyed");
            code = exit_failure;
        }
    }
    co_await registry.async_drain();
    co_return code;
}

}  // namespace moat::serve
