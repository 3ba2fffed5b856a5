// The host-local store (session_store.hpp): one entry file and one lock file per key in a 0700
// directory. Every step takes the key's flock (polled on a timer, never blocking the executor),
// reads the entry, applies the contract's step (store_entry.hpp) and writes the entry back with a
// rename, so a process killed at any point leaves either the old entry or the new one.
#include <moat/session_store.hpp>

#include "core/ascii.hpp"
#include "core/unique_fd.hpp"
#include "manager/store_entry.hpp"

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/asio_compat.hpp"

namespace moat {
namespace {

constexpr std::size_t max_key_bytes = 120;
constexpr std::size_t max_entry_bytes = 4096;

std::string default_directory() {
    if (::geteuid() == 0) return "/run/moat/sessions";
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime == '/') {
        return std::string(runtime) + "/moat/sessions";
    }
    return "/tmp/moat-" + std::to_string(::geteuid()) + "/sessions";
}

std::string hex(std::string_view bytes) {
    return detail::hex_encoded(bytes);
}

// The key a file name spells (hex, as hex() writes it); none for a name that is not.
std::optional<std::string> unhex(std::string_view text) {
    if (text.empty() || text.size() % 2 != 0 || text.size() > 2 * max_key_bytes)
        return std::nullopt;
    auto digit = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    std::string out;
    out.reserve(text.size() / 2);
    for (std::size_t i = 0; i < text.size(); i += 2) {
        const int high = digit(text[i]);
        const int low = digit(text[i + 1]);
        if (high < 0 || low < 0) return std::nullopt;
        out += static_cast<char>(high * 16 + low);
    }
    return out;
}

error unavailable(const std::string& what) {
    return make_error(errc::store_unavailable, "host session store: " + what);
}

error unavailable_errno(const std::string& what, int code) {
    return unavailable(what + ": " + std::strerror(code));
}

std::int64_t ticks(store_detail::time_point t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

store_detail::time_point from_ticks(std::int64_t n) {
    return store_detail::time_point(
        std::chrono::duration_cast<store_detail::clock::duration>(std::chrono::nanoseconds(n)));
}

// "name value\n" lines; values have no newline (ids and tokens are ours, printable).
std::string serialize(const std::string& key, const store_detail::entry& e) {
    std::string out;
    out += "key " + hex(key) + "\n";
    out += "sandbox " + e.sandbox_id + "\n";
    out += "generation " + std::to_string(e.generation) + "\n";
    out += "noticed " + std::to_string(e.noticed) + "\n";
    out += std::string("ended ") + (e.ended ? "1" : "0") + "\n";
    out += "last_used " + std::to_string(ticks(e.last_used)) + "\n";
    out += "expires " + std::to_string(ticks(e.expires)) + "\n";
    out += "token " + e.token + "\n";
    out += "lease_until " + std::to_string(ticks(e.lease_until)) + "\n";
    out += "committed_by " + e.committed_by + "\n";
    return out;
}

template <class Int>
bool parse_int(std::string_view text, Int& out) {
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc() && end == text.data() + text.size();
}

result<store_detail::entry> parse(const std::string& key, std::string_view text) {
    store_detail::entry e;
    bool key_seen = false;
    while (!text.empty()) {
        const auto nl = text.find('\n');
        if (nl == std::string_view::npos) return unavailable("a session entry file is truncated");
        const auto line = text.substr(0, nl);
        text.remove_prefix(nl + 1);
        const auto space = line.find(' ');
        if (space == std::string_view::npos) return unavailable("a session entry file is garbled");
        const auto name = line.substr(0, space);
        const auto value = line.substr(space + 1);
        std::int64_t n = 0;
        bool ok = true;
        if (name == "key") {
            ok = value == hex(key);
            key_seen = true;
        } else if (name == "sandbox") {
            e.sandbox_id = std::string(value);
        } else if (name == "generation") {
            ok = parse_int(value, e.generation);
        } else if (name == "noticed") {
            ok = parse_int(value, e.noticed);
        } else if (name == "ended") {
            ok = value == "0" || value == "1";
            e.ended = value == "1";
        } else if (name == "last_used") {
            ok = parse_int(value, n);
            e.last_used = from_ticks(n);
        } else if (name == "expires") {
            ok = parse_int(value, n);
            e.expires = from_ticks(n);
        } else if (name == "token") {
            e.token = std::string(value);
        } else if (name == "lease_until") {
            ok = parse_int(value, n);
            e.lease_until = from_ticks(n);
        } else if (name == "committed_by") {
            e.committed_by = std::string(value);
        }
        if (!ok) return unavailable("a session entry file is garbled");
    }
    if (!key_seen) return unavailable("a session entry file names no key");
    return e;
}

class host_session_store final : public session_store {
  public:
    host_session_store(asio::any_io_executor executor, host_store_options options)
        : executor_(std::move(executor)), options_(std::move(options)) {
        if (options_.directory.empty()) options_.directory = default_directory();
    }

    asio::awaitable<result<std::optional<session_record>>> async_get(std::string key,
                                                                     deadline limit) override {
        std::optional<session_record> answer;
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            store_detail::expire(e, now());
            answer = store_detail::view(&e, now());
            return false;
        };
        co_return co_await answer_after(key, limit, std::move(step), answer);
    }

    asio::awaitable<result<session_claim>> async_claim(std::string key, std::string expected,
                                                       std::chrono::milliseconds lease,
                                                       deadline limit) override {
        session_claim answer;
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            auto token = new_token();
            if (!token) return std::move(token).error();
            answer = store_detail::claim(e, expected, lease, now(), std::move(*token));
            return answer.token.has_value();
        };
        co_return co_await answer_after(key, limit, std::move(step), answer);
    }

    asio::awaitable<result<bool>> async_renew(std::string key, std::string token,
                                              std::chrono::milliseconds lease,
                                              deadline limit) override {
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            return store_detail::renew(e, token, lease, now());
        };
        co_return co_await update(key, limit, std::move(step));
    }

    asio::awaitable<result<bool>> async_commit(std::string key, std::string token,
                                               std::string sandbox_id, std::uint64_t generation,
                                               std::chrono::milliseconds ttl,
                                               deadline limit) override {
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            return store_detail::commit(e, token, std::move(sandbox_id), generation, ttl, now());
        };
        co_return co_await update(key, limit, std::move(step));
    }

    asio::awaitable<result<void>> async_release(std::string key, std::string token,
                                                deadline limit) override {
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            if (e.token != token) return false;
            store_detail::release(e, token);
            store_detail::expire(e, now());
            return true;
        };
        auto updating = update(key, limit, std::move(step));
        auto updated = co_await std::move(updating);
        if (!updated) co_return std::move(updated).error();
        co_return result<void>{};
    }

    asio::awaitable<result<std::optional<session_touch>>> async_touch(std::string key,
                                                                      std::string sandbox_id,
                                                                      std::chrono::milliseconds ttl,
                                                                      bool take_notice,
                                                                      deadline limit) override {
        std::optional<session_touch> answer;
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            answer = store_detail::touch(e, sandbox_id, ttl, take_notice, now());
            return answer.has_value();
        };
        co_return co_await answer_after(key, limit, std::move(step), answer);
    }

    asio::awaitable<result<bool>> async_erase(
        std::string key, std::string sandbox_id,
        std::optional<std::chrono::milliseconds> unused_at_least,
        std::optional<std::chrono::milliseconds> remember_for, deadline limit) override {
        entry_step step = [&](store_detail::entry& e) -> result<bool> {
            return store_detail::erase(e, sandbox_id, unused_at_least, remember_for, now());
        };
        auto updating = update(key, limit, std::move(step));
        auto erased = co_await std::move(updating);
        // After the key's lock is released: the sweep skips a key whose lock is busy.
        if (erased && *erased) sweep_some();
        co_return erased;
    }

    bool is_shared() const noexcept override { return true; }

  private:
    static store_detail::time_point now() { return store_detail::clock::now(); }

    // One step of the contract on a key's entry: changes it (or not) and says whether it changed.
    using entry_step = std::function<result<bool>(store_detail::entry&)>;

    // Every operation's frame: under the key's lock, reads its entry, applies `step` and writes the
    // entry back when the step changed it; the lock is released before this returns. The result
    // is the step's (or the first failure: the lock, the read, the step, the write).
    asio::awaitable<result<bool>> update(const std::string& key, deadline limit, entry_step step) {
        auto locking = lock(key, limit);
        auto locked = co_await std::move(locking);
        if (!locked) co_return std::move(locked).error();
        auto e = read(key);
        if (!e) co_return std::move(e).error();
        auto changed = step(*e);
        if (!changed || !*changed) co_return changed;
        auto written = write(key, *e);
        if (!written) co_return std::move(written).error();
        co_return true;
    }

    // update(), then what the step left in `answer` (a local of the awaiting caller).
    template <class T>
    asio::awaitable<result<T>> answer_after(const std::string& key, deadline limit, entry_step step,
                                            const T& answer) {
        auto updating = update(key, limit, std::move(step));
        auto updated = co_await std::move(updating);
        if (!updated) co_return std::move(updated).error();
        co_return answer;
    }

    std::string path(const std::string& key, const char* suffix) const {
        return options_.directory + "/" + hex(key) + suffix;
    }

    // The directory, made 0700 if missing; refused unless it is a real directory of ours that
    // nobody else can write.
    result<void> ensure_directory() {
        if (directory_ready_) return {};
        const auto& dir = options_.directory;
        if (const auto slash = dir.rfind('/'); slash != std::string::npos && slash > 0) {
            (void)::mkdir(dir.substr(0, slash).c_str(), 0711);
        }
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
            return unavailable_errno("cannot make " + dir, errno);
        }
        struct stat st {};
        if (::lstat(dir.c_str(), &st) != 0) return unavailable_errno("cannot stat " + dir, errno);
        if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
            return unavailable(dir + " is not a 0700 directory of this user");
        }
        directory_ready_ = true;
        return {};
    }

    // The key's flock, retried on a timer until the earlier of `limit` and lock_wait. The lock
    // file is checked to still be the one at its path after locking, so one unlinked meanwhile
    // is never mistaken for the live lock.
    asio::awaitable<result<unique_fd>> lock(const std::string& key, deadline limit) {
        if (key.empty() || key.size() > max_key_bytes) {
            co_return make_error(errc::invalid_argument,
                                 "a host session key must be 1 to 120 bytes");
        }
        if (auto ready = ensure_directory(); !ready) co_return std::move(ready).error();
        const auto lock_path = path(key, ".lock");
        const auto until = earliest(limit, deadline::after(options_.lock_wait));
        asio::steady_timer timer(executor_);
        auto pause = std::chrono::milliseconds(1);
        for (;;) {
            unique_fd fd(
                ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
            if (fd.get() < 0) co_return unavailable_errno("cannot open a lock file", errno);
            if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) {
                if (is_live_lock(fd, lock_path)) co_return fd;
                continue;  // unlinked while we waited: lock the new one
            }
            if (errno != EWOULDBLOCK && errno != EINTR) {
                co_return unavailable_errno("cannot lock a lock file", errno);
            }
            fd.reset();
            if (until.has_expired()) {
                co_return unavailable("a session's lock was held longer than the wait allows");
            }
            timer.expires_after(
                std::min<std::chrono::steady_clock::duration>(pause, until.remaining()));
            auto [ec] = co_await timer.async_wait(as_tuple(asio::use_awaitable));
            if (ec) co_return make_error(errc::cancelled, "the store operation was cancelled");
            pause = std::min(pause * 2, std::chrono::milliseconds(10));
        }
    }

    // The locked file is still the one at its path (a locker that unlinked it did so under the
    // lock, after which the next locker makes a new one).
    static bool is_live_lock(const unique_fd& fd, const std::string& lock_path) {
        struct stat held {};
        struct stat current {};
        return ::fstat(fd.get(), &held) == 0 && ::stat(lock_path.c_str(), &current) == 0 &&
               held.st_ino == current.st_ino && held.st_dev == current.st_dev;
    }

    // Entries that ran out (a TTL, an ended marker) are otherwise removed only when their key is
    // used again. After an erase, a few entries picked at random from the directory (a bounded
    // listing) are expired and removed when empty; a key whose lock is busy is skipped, so this
    // never waits. A key that is never used again therefore does not stay for ever.
    void sweep_some() {
        static constexpr std::size_t max_listed = 4096;
        static constexpr std::size_t per_sweep = 8;
        static constexpr std::string_view suffix = ".entry";
        std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(options_.directory.c_str()), ::closedir);
        if (!dir) return;
        std::vector<std::string> keys;
        while (keys.size() < max_listed) {
            const dirent* d = ::readdir(dir.get());
            if (d == nullptr) break;
            std::string_view name = d->d_name;
            if (name.size() <= suffix.size() || !name.ends_with(suffix)) continue;
            name.remove_suffix(suffix.size());
            if (auto key = unhex(name)) keys.push_back(std::move(*key));
        }
        dir.reset();
        std::minstd_rand pick(std::random_device{}());
        std::shuffle(keys.begin(), keys.end(), pick);
        if (keys.size() > per_sweep) keys.resize(per_sweep);
        for (const auto& key : keys) {
            const auto lock_path = path(key, ".lock");
            unique_fd fd(::open(lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
            if (fd.get() < 0 || ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
            if (!is_live_lock(fd, lock_path)) continue;
            auto e = read(key);
            if (!e) continue;
            store_detail::expire(*e, now());
            if (store_detail::is_empty(*e)) (void)write(key, *e);
        }
    }

    result<store_detail::entry> read(const std::string& key) {
        const auto entry_path = path(key, ".entry");
        unique_fd fd(::open(entry_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
        if (fd.get() < 0) {
            if (errno == ENOENT) return store_detail::entry{};
            return unavailable_errno("cannot open a session entry", errno);
        }
        std::string text(max_entry_bytes + 1, '\0');
        std::size_t have = 0;
        for (;;) {
            const ssize_t n = ::read(fd.get(), text.data() + have, text.size() - have);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return unavailable_errno("cannot read a session entry", errno);
            if (n == 0) break;
            have += static_cast<std::size_t>(n);
            if (have > max_entry_bytes) return unavailable("a session entry file is too large");
        }
        text.resize(have);
        return parse(key, text);
    }

    // Replaces the entry atomically (an empty one is removed, with its lock file: the caller
    // holds the lock, and lockers check that the file they locked is still the live one).
    result<void> write(const std::string& key, const store_detail::entry& e) {
        const auto entry_path = path(key, ".entry");
        if (store_detail::is_empty(e)) {
            if (::unlink(entry_path.c_str()) != 0 && errno != ENOENT) {
                return unavailable_errno("cannot remove a session entry", errno);
            }
            (void)::unlink(path(key, ".lock").c_str());
            return {};
        }
        const auto temporary = entry_path + ".tmp";
        const auto text = serialize(key, e);
        unique_fd fd(
            ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
        if (fd.get() < 0) return unavailable_errno("cannot write a session entry", errno);
        std::size_t done = 0;
        while (done < text.size()) {
            const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return unavailable_errno("cannot write a session entry", errno);
            done += static_cast<std::size_t>(n);
        }
        fd.reset();
        if (::rename(temporary.c_str(), entry_path.c_str()) != 0) {
            return unavailable_errno("cannot replace a session entry", errno);
        }
        return {};
    }

    static result<std::string> new_token() {
        unsigned char bytes[16];
        std::size_t have = 0;
        while (have < sizeof bytes) {
            const ssize_t n = ::getrandom(bytes + have, sizeof bytes - have, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) return unavailable_errno("no random bytes for a claim token", errno);
            have += static_cast<std::size_t>(n);
        }
        return hex(std::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
    }

    asio::any_io_executor executor_;
    host_store_options options_;
    bool directory_ready_ = false;
};

}  // namespace

std::shared_ptr<session_store> make_host_session_store(asio::any_io_executor executor,
                                                       host_store_options options) {
    return std::make_shared<host_session_store>(std::move(executor), std::move(options));
}

}  // namespace moat
