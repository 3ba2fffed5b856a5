// The Redis session store: session_store.hpp's contract, one Lua script (EVALSHA, EVAL on
// NOSCRIPT) per step, over redis_client.
#include <moat/redis_session_store.hpp>

#include "core/ascii.hpp"
#include "core/exception_boundary.hpp"
#include "http/tls.hpp"
#include "store/redis_client.hpp"
#include "store/redis_scripts.hpp"

#include <sys/random.h>

#include <algorithm>
#include <charconv>

namespace moat {
namespace {

using store::redis_command;
using store::redis_reply;

error store_error(error e) {
    if (e.code == errc::cancelled) return e;
    return make_error(errc::store_unavailable, std::move(e.detail));
}

error unexpected(const std::string& where, const std::string& step, const redis_reply& reply) {
    return make_error(errc::store_unavailable, "Redis at " + where + ": " + step + " answered " +
                                                   store::describe_reply(reply));
}

std::string milliseconds(std::chrono::milliseconds d) {
    return std::to_string(std::max<std::chrono::milliseconds::rep>(d.count(), 1));
}

// A fencing token no other claim has had: 128 random bits.
std::string new_token() {
    unsigned char bytes[16] = {};
    if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
        // Never reached on Linux ≥ 3.17 with a seeded pool; the time and address still differ
        // between workers.
        const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
        for (std::size_t i = 0; i < sizeof bytes; ++i) {
            bytes[i] = static_cast<unsigned char>((now >> (8 * (i % 8))) ^ (i * 131));
        }
    }
    std::string token = "r";
    detail::append_hex(token, bytes);
    return token;
}

bool to_uint64(const std::string& text, std::uint64_t& out) {
    const auto* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, out);
    return ec == std::errc{} && ptr == end;
}

// {1, sandbox, generation, noticed, unused_ms, claimed, ended} or {0}.
bool parse_record(const redis_reply& reply, std::optional<session_record>& out) {
    if (reply.type != redis_reply::kind::array || reply.elements.empty()) return false;
    const auto& e = reply.elements;
    if (e[0].type != redis_reply::kind::integer) return false;
    if (e[0].integer == 0) {
        out.reset();
        return true;
    }
    if (e.size() != 7 || e[1].type != redis_reply::kind::string ||
        e[2].type != redis_reply::kind::string || e[3].type != redis_reply::kind::string ||
        e[4].type != redis_reply::kind::integer || e[5].type != redis_reply::kind::integer ||
        e[6].type != redis_reply::kind::integer) {
        return false;
    }
    session_record r;
    r.sandbox_id = e[1].text;
    if (!to_uint64(e[2].text, r.generation) || !to_uint64(e[3].text, r.noticed)) return false;
    r.unused_for = std::chrono::milliseconds(std::max<long long>(e[4].integer, 0));
    r.claimed = e[5].integer != 0;
    r.ended = e[6].integer != 0;
    out = std::move(r);
    return true;
}

class redis_session_store final : public session_store {
  public:
    redis_session_store(asio::any_io_executor executor, redis_config config,
                        std::shared_ptr<asio::ssl::context> tls)
        : client_(std::move(executor), std::move(config), std::move(tls)),
          where_(client_.config().to_string()) {}

    asio::awaitable<result<std::optional<session_record>>> async_get(std::string key,
                                                                     deadline limit) override {
        return guarded(get(std::move(key), limit));
    }
    asio::awaitable<result<session_claim>> async_claim(std::string key, std::string expected,
                                                       std::chrono::milliseconds lease,
                                                       deadline limit) override {
        return guarded(claim(std::move(key), std::move(expected), lease, limit));
    }
    asio::awaitable<result<bool>> async_renew(std::string key, std::string token,
                                              std::chrono::milliseconds lease,
                                              deadline limit) override {
        if (token.empty()) return immediately(false);
        std::vector<std::string> args{std::move(token), milliseconds(lease)};
        return guarded(
            boolean(store::renew_script(), std::move(key), std::move(args), "renew", limit));
    }
    asio::awaitable<result<bool>> async_commit(std::string key, std::string token,
                                               std::string sandbox_id, std::uint64_t generation,
                                               std::chrono::milliseconds ttl,
                                               deadline limit) override {
        if (token.empty() || sandbox_id.empty()) return immediately(false);
        std::vector<std::string> args{std::move(token), std::move(sandbox_id),
                                      std::to_string(generation), milliseconds(ttl)};
        return guarded(
            boolean(store::commit_script(), std::move(key), std::move(args), "commit", limit));
    }
    asio::awaitable<result<void>> async_release(std::string key, std::string token,
                                                deadline limit) override {
        return guarded(release(std::move(key), std::move(token), limit));
    }
    asio::awaitable<result<std::optional<session_touch>>> async_touch(std::string key,
                                                                      std::string sandbox_id,
                                                                      std::chrono::milliseconds ttl,
                                                                      bool take_notice,
                                                                      deadline limit) override {
        return guarded(touch(std::move(key), std::move(sandbox_id), ttl, take_notice, limit));
    }
    asio::awaitable<result<bool>> async_erase(
        std::string key, std::string sandbox_id,
        std::optional<std::chrono::milliseconds> unused_at_least,
        std::optional<std::chrono::milliseconds> remember_for, deadline limit) override {
        std::string least = "-1";
        if (unused_at_least) {
            least = std::to_string(std::max<long long>(unused_at_least->count(), 0));
        }
        // PEXPIRE needs a positive time: a marker kept for less than a millisecond is kept for one.
        std::string remember = "-1";
        if (remember_for) remember = std::to_string(std::max<long long>(remember_for->count(), 1));
        std::vector<std::string> args{std::move(sandbox_id), std::move(least), std::move(remember)};
        return guarded(
            boolean(store::erase_script(), std::move(key), std::move(args), "erase", limit));
    }
    bool is_shared() const noexcept override { return true; }

    // For tests and the bench: connections opened so far.
    std::uint64_t connections_opened() const noexcept { return client_.connections_opened(); }

  private:
    static asio::awaitable<result<bool>> immediately(bool value) { co_return value; }

    // An operation's bound: the caller's deadline, and without one, a connect and an exchange
    // (the client also cuts each step to its own timeout).
    deadline operation_limit(deadline callers) const {
        const auto& c = client_.config();
        return earliest(callers, deadline::after(c.connect_timeout + c.command_timeout));
    }

    // Runs `script` on the key's two keys: EVALSHA, and EVAL when Redis does not have it cached
    // (NOSCRIPT: a restart, SCRIPT FLUSH). Every failure, an error reply included, is
    // store_unavailable (cancelled stays cancelled).
    asio::awaitable<result<redis_reply>> run(const store::redis_script& script,
                                             const std::string& key, std::vector<std::string> args,
                                             const char* step, deadline callers) {
        const auto limit = operation_limit(callers);
        const auto& prefix = client_.config().key_prefix;
        redis_command command{"EVALSHA", script.sha1, "2", prefix + "s:" + key,
                              prefix + "c:" + key};
        command.insert(command.end(), args.begin(), args.end());
        auto reply = co_await client_.async_command(command, limit);
        if (!reply) co_return store_error(std::move(reply).error());
        if (reply->is_error() && reply->text.starts_with("NOSCRIPT")) {
            command[0] = "EVAL";
            command[1] = script.source;
            reply = co_await client_.async_command(command, limit);
            if (!reply) co_return store_error(std::move(reply).error());
        }
        if (reply->is_error()) co_return unexpected(where_, step, *reply);
        co_return reply;
    }

    asio::awaitable<result<std::optional<session_record>>> get(std::string key, deadline limit) {
        std::vector<std::string> no_args;
        auto reply = co_await run(store::get_script(), key, std::move(no_args), "get", limit);
        if (!reply) co_return std::move(reply).error();
        std::optional<session_record> record;
        if (!parse_record(*reply, record)) co_return unexpected(where_, "get", *reply);
        co_return record;
    }

    asio::awaitable<result<session_claim>> claim(std::string key, std::string expected,
                                                 std::chrono::milliseconds lease, deadline limit) {
        auto token = new_token();
        std::vector<std::string> args{expected, milliseconds(lease), token};
        auto reply = co_await run(store::claim_script(), key, std::move(args), "claim", limit);
        if (!reply) co_return std::move(reply).error();
        const auto& r = *reply;
        session_claim answer;
        if (r.type != redis_reply::kind::array || r.elements.size() != 2 ||
            r.elements[0].type != redis_reply::kind::integer ||
            !parse_record(r.elements[1], answer.current)) {
            co_return unexpected(where_, "claim", r);
        }
        if (r.elements[0].integer == 1) answer.token = std::move(token);
        co_return answer;
    }

    asio::awaitable<result<bool>> boolean(const store::redis_script& script, std::string key,
                                          std::vector<std::string> args, const char* step,
                                          deadline limit) {
        auto reply = co_await run(script, key, std::move(args), step, limit);
        if (!reply) co_return std::move(reply).error();
        if (reply->type != redis_reply::kind::integer) co_return unexpected(where_, step, *reply);
        co_return reply->integer == 1;
    }

    asio::awaitable<result<void>> release(std::string key, std::string token, deadline limit) {
        if (token.empty()) co_return result<void>{};
        std::vector<std::string> args{std::move(token)};
        auto released = co_await boolean(store::release_script(), std::move(key), std::move(args),
                                         "release", limit);
        if (!released) co_return std::move(released).error();
        co_return result<void>{};
    }

    asio::awaitable<result<std::optional<session_touch>>> touch(std::string key,
                                                                std::string sandbox_id,
                                                                std::chrono::milliseconds ttl,
                                                                bool take_notice, deadline limit) {
        std::string notice_flag = "0";
        if (take_notice) notice_flag = "1";
        std::vector<std::string> args{std::move(sandbox_id), milliseconds(ttl), notice_flag};
        auto reply = co_await run(store::touch_script(), key, std::move(args), "touch", limit);
        if (!reply) co_return std::move(reply).error();
        const auto& r = *reply;
        if (r.type != redis_reply::kind::array || r.elements.empty() ||
            r.elements[0].type != redis_reply::kind::integer) {
            co_return unexpected(where_, "touch", r);
        }
        if (r.elements[0].integer == 0) co_return std::optional<session_touch>();
        std::optional<session_record> record;
        if (r.elements.size() != 3 || r.elements[1].type != redis_reply::kind::integer ||
            !parse_record(r.elements[2], record) || !record) {
            co_return unexpected(where_, "touch", r);
        }
        session_touch answer;
        answer.notice = r.elements[1].integer == 1;
        answer.current = std::move(*record);
        co_return std::optional<session_touch>(std::move(answer));
    }

    store::redis_client client_;
    std::string where_;
};

}  // namespace

result<std::shared_ptr<session_store>> make_redis_session_store(asio::any_io_executor executor,
                                                                redis_config config) {
    std::shared_ptr<asio::ssl::context> tls;
    if (config.kind == redis_config::transport::tls) {
        http::tls_client_options options;
        options.use_system_store = config.tls_use_system_store;
        options.ca_file = config.tls_ca_file;
        auto context = http::make_client_context(options);
        if (!context) return std::move(context).error();
        tls = std::move(*context);
    }
    if (config.kind == redis_config::transport::unix_socket && config.socket_path.empty()) {
        return make_error(errc::invalid_argument, "Redis store: no socket path");
    }
    if (config.kind != redis_config::transport::unix_socket && config.host.empty()) {
        return make_error(errc::invalid_argument, "Redis store: no host");
    }
    if (config.max_connections == 0) {
        return make_error(errc::invalid_argument,
                          "Redis store: max_connections must be at least 1");
    }
    return std::shared_ptr<session_store>(std::make_shared<redis_session_store>(
        std::move(executor), std::move(config), std::move(tls)));
}

}  // namespace moat
