#include "serve/process_table.hpp"

#include "core/go_signals.hpp"

#include <moat/task_group.hpp>
#include <moat/with_timeout.hpp>

#include "core/asio_compat.hpp"
#include "core/cancellation.hpp"

#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <utility>

namespace moat::serve {

using steady = std::chrono::steady_clock;

process_end end_from_result(const exec_result& r) {
    process_end end;
    end.timed_out = r.timed_out;
    if (r.signal != 0) {
        end.exit_code = -1;
        end.exited = false;
        end.status = "signal: " + detail::go_signal_name(r.signal);
        end.error = end.status;
    } else {
        end.exit_code = r.exit_code;
        end.exited = true;
        end.status = "exit status " + std::to_string(r.exit_code);
        if (r.exit_code != 0) end.error = end.status;
    }
    return end;
}

struct process_table::subscriber {
    std::uint64_t cursor = 0;  // sequence number of the next output item to deliver
    bool end_delivered = false;
    asio::steady_timer* waiting = nullptr;
};

namespace {

struct output_item {
    output_channel channel;
    std::string data;
    bool is_read = false;     // some subscription has had it
    std::uint64_t start = 0;  // offset of data[0] in everything the process printed
};

// What one buffered chunk costs beyond its bytes (the deque slot, the string): charged against
// the buffer's cap, so that many small chunks cannot outgrow it.
constexpr std::size_t item_overhead = 64;

// Removes a waiter's registration when the coroutine frame holding it goes away.
struct waiter_removal {
    std::vector<asio::steady_timer*>& waiters;
    asio::steady_timer* timer;
    ~waiter_removal() {
        waiters.erase(std::remove(waiters.begin(), waiters.end(), timer), waiters.end());
    }
};

// Clears a registration when the coroutine frame holding it goes away, however it goes.
template <class T>
struct pointer_reset {
    T*& slot;
    ~pointer_reset() { slot = nullptr; }
};

}  // namespace

struct process_table::entry {
    std::uint32_t pid = 0;
    process_config config;
    std::optional<std::string> tag;
    // Shared with the calls using it (a stdin write may outlive the pump's reference); released
    // when the pump ends, and the last reference's drop kills a process that still runs.
    std::shared_ptr<process> proc;
    std::deque<output_item> log;  // the newest output, up to the cap, oldest first
    std::uint64_t first_seq = 0;  // sequence number of log.front()
    std::size_t bytes = 0;        // output bytes in `log`
    std::uint64_t appended = 0;   // every byte the process printed so far
    std::uint64_t dropped_bytes = 0;
    asio::steady_timer* pump_waiting = nullptr;  // the pump, waiting for a slow subscription
    std::optional<process_end> end;
    std::optional<error> failure;  // the pump failed: no end will come
    steady::time_point ended_at{};
    std::vector<subscriber*> subscribers;
    bool input_busy = false;
    std::vector<asio::steady_timer*> input_waiters;
    std::shared_ptr<output_budget> budget;  // the server's, shared by every table
    std::size_t charged = 0;                // what this entry counts in budget->used_bytes

    entry() = default;
    entry(const entry&) = delete;
    entry& operator=(const entry&) = delete;
    ~entry() {
        if (budget) budget->used_bytes -= charged;
    }

    std::uint64_t next_seq() const noexcept { return first_seq + log.size(); }
    void pop_front() {
        bytes -= log.front().data.size();
        log.pop_front();
        ++first_seq;
    }
    void wake() {
        for (auto* s : subscribers) {
            if (s->waiting != nullptr) s->waiting->cancel();
        }
        for (auto* t : input_waiters) t->cancel();
        wake_pump();
    }
    std::size_t cost() const noexcept { return bytes + item_overhead * log.size(); }
    // The buffer's cap now: its own, or less while the server's budget is short (never less than
    // the budget's minimum share).
    std::size_t limit(std::size_t cap) const noexcept {
        if (!budget) return cap;
        const std::size_t others = budget->used_bytes - charged;
        const std::size_t left =
            budget->capacity_bytes > others ? budget->capacity_bytes - others : 0;
        return std::min(cap, std::max(left, budget->min_share_bytes));
    }
    void recharge() noexcept {
        if (!budget) return;
        budget->used_bytes = budget->used_bytes - charged + cost();
        charged = cost();
    }
    void append(output_chunk chunk, std::size_t cap) {
        // A chunk larger than the whole buffer keeps only its tail, unless a subscription is
        // attached: the pump waited until it had read everything, and it gets the whole chunk
        // (the buffer then exceeds its cap by less than one pipe read).
        const std::size_t room = cap > item_overhead ? cap - item_overhead : 0;
        if (chunk.data.size() > room && subscribers.empty()) {
            const std::size_t cut = chunk.data.size() - room;
            dropped_bytes += cut;
            appended += cut;
            chunk.data.erase(0, cut);
        }
        if (chunk.data.empty()) return;
        // The newest output stays, up to the cap: whole chunks go first, then the head of one.
        const std::size_t incoming = chunk.data.size() + item_overhead;
        while (!log.empty() && cost() + incoming > cap) {
            auto& oldest = log.front();
            const std::size_t excess = cost() + incoming - cap;
            if (excess >= oldest.data.size() + item_overhead) {
                if (!oldest.is_read) dropped_bytes += oldest.data.size();
                pop_front();
            } else {
                if (!oldest.is_read) dropped_bytes += excess;
                oldest.data.erase(0, excess);
                oldest.start += excess;
                bytes -= excess;
            }
        }
        bytes += chunk.data.size();
        log.push_back(output_item{chunk.channel, std::move(chunk.data), false, appended});
        appended += log.back().data.size();
        recharge();
        wake();
    }
    // Whether appending `incoming` bytes would push out output an attached subscription has not
    // read yet: then the pump waits for it (backpressure on a client that is there).
    bool must_wait(std::size_t incoming, std::size_t cap) const {
        if (subscribers.empty() || log.empty()) return false;
        std::uint64_t low = next_seq();
        for (const auto* s : subscribers) low = std::min(low, std::max(s->cursor, first_seq));
        if (low >= next_seq()) return false;  // every attached subscription is caught up
        const std::uint64_t unread = appended - log[low - first_seq].start;
        const std::uint64_t unread_cost = unread + item_overhead * (next_seq() - low);
        return unread_cost + incoming + item_overhead > cap;
    }
    void wake_pump() {
        if (pump_waiting != nullptr) pump_waiting->cancel();
    }
    process_info info() const {
        process_info i;
        i.pid = pid;
        i.config = config;
        i.tag = tag;
        i.buffered_bytes = bytes;
        i.dropped_bytes = dropped_bytes;
        i.end = end;
        return i;
    }
};

struct process_table::state {
    state(asio::any_io_executor ex, process_table_options o)
        : executor(std::move(ex)), options(std::move(o)), tasks(executor, "serve processes") {}

    asio::any_io_executor executor;
    process_table_options options;
    task_group tasks;
    std::map<std::uint32_t, std::shared_ptr<entry>> live;
    std::deque<std::shared_ptr<entry>> retained;  // by end time, oldest first
    std::optional<std::string> closed_reason;

    steady::time_point now() const { return options.clock ? options.clock() : steady::now(); }

    void prune() {
        const auto t = now();
        while (!retained.empty() && (retained.size() > options.max_retained_ends ||
                                     t - retained.front()->ended_at >= options.retained_end_age)) {
            retained.pop_front();
        }
    }

    error closed_error() const { return make_error(errc::sandbox_unavailable, *closed_reason); }

    static error not_found(const process_selector& s) {
        if (s.pid) {
            return make_error(errc::file_not_found,
                              "process with pid " + std::to_string(*s.pid) + " not found");
        }
        if (s.tag)
            return make_error(errc::file_not_found, "process with tag " + *s.tag + " not found");
        return make_error(errc::not_supported,
                          "the process selector names neither a pid nor a tag");
    }

    result<std::shared_ptr<entry>> find_live(const process_selector& s) const {
        if (closed_reason) return closed_error();
        if (s.pid) {
            auto it = live.find(*s.pid);
            if (it != live.end()) return it->second;
        } else if (s.tag) {
            for (const auto& [pid, e] : live) {
                if (e->tag == s.tag) return e;
            }
        }
        return not_found(s);
    }

    result<std::shared_ptr<entry>> find_any(const process_selector& s) {
        auto found = find_live(s);
        if (found || found.error().code != errc::file_not_found) return found;
        prune();
        for (const auto& e : retained) {
            if ((s.pid && e->pid == *s.pid) || (!s.pid && s.tag && e->tag == s.tag)) return e;
        }
        return found;
    }

    void finish(const std::shared_ptr<entry>& e, process_end end) {
        e->end = std::move(end);
        e->ended_at = now();
        auto it = live.find(e->pid);
        if (it != live.end() && it->second == e) live.erase(it);
        if (!closed_reason) {
            retained.push_back(e);
            prune();
        }
        e->wake();
    }

    void fail(const std::shared_ptr<entry>& e, error why) {
        e->failure = std::move(why);
        auto it = live.find(e->pid);
        if (it != live.end() && it->second == e) live.erase(it);
        e->wake();
    }
};

namespace {

// However the pump ends (its process's end, a failure, a cancellation before it even started, an
// exception), its process is released, which kills it if it still runs, and an entry left without
// an end fails, so that no subscription waits for an end that cannot come.
struct pump_guard {
    std::weak_ptr<process_table::state> table;
    std::shared_ptr<process_table::entry> e;
    ~pump_guard() {
        if (!e->end && !e->failure) {
            auto owner = table.lock();
            error why = make_error(errc::backend_failure, "moat stopped following the process");
            if (owner && owner->closed_reason) why = owner->closed_error();
            if (owner) {
                owner->fail(e, std::move(why));
            } else {
                e->failure = std::move(why);
                e->wake();
            }
        }
        e->proc.reset();
    }
};

// Drains one process's output into its entry until it ends. Holds the table weakly: the table's
// own task group owns this coroutine.
asio::awaitable<void> pump(std::weak_ptr<process_table::state> table,
                           std::shared_ptr<process_table::entry> e) {
    pump_guard guard{table, e};
    auto proc = e->proc;
    const auto executor = co_await asio::this_coro::executor;
    auto token = as_tuple(asio::use_awaitable);
    for (;;) {
        // The executor runs between chunks: async_next completes without suspending while the
        // pipe has data, so a process printing as fast as it is read would otherwise hold the
        // executor (every other request of the server) and drain its output before add()'s caller
        // could attach. A cancellation ends the pump here (the guard fails the entry).
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) co_return;
        co_await asio::post(executor, asio::use_awaitable);
        auto next = co_await proc->async_next();
        if (!next) {
            auto owner = table.lock();
            if (owner) {
                error why = std::move(next).error();
                if (owner->closed_reason) why = owner->closed_error();
                owner->fail(e, std::move(why));
            }
            co_return;
        }
        if (auto* chunk = std::get_if<output_chunk>(&*next)) {
            std::size_t own_cap = 0;
            if (auto owner = table.lock()) own_cap = owner->options.output_buffer_bytes;
            // A client that is attached gets every byte: the pump holds this chunk until the
            // slowest attached subscription has room (its stream's write timeout bounds a stuck
            // client). With nobody attached it never waits. The room is measured against the
            // buffer's cap as the server's budget leaves it now.
            std::size_t cap = e->limit(own_cap);
            while (!e->failure && e->must_wait(chunk->data.size(), cap)) {
                asio::steady_timer timer(executor, asio::steady_timer::time_point::max());
                e->pump_waiting = &timer;
                pointer_reset<asio::steady_timer> unregister{e->pump_waiting};
                (void)co_await timer.async_wait(token);
                cap = e->limit(own_cap);
            }
            e->append(std::move(*chunk), cap);
            continue;
        }
        const auto end = end_from_result(std::get<exec_result>(*next));
        // Its stdin has no reader any more; the descriptor goes now, not with the retained end.
        // (No co_await while holding the table: the last reference must not die in here.)
        (void)co_await proc->async_close_stdin();
        if (auto owner = table.lock()) {
            owner->finish(e, end);
        } else {
            e->end = end;
            e->wake();
        }
        co_return;
    }
}

}  // namespace

process_table::subscription::subscription(std::shared_ptr<state> table, std::shared_ptr<entry> e)
    : table_(std::move(table)), entry_(std::move(e)), self_(std::make_shared<subscriber>()) {
    self_->cursor = entry_->first_seq;
    entry_->subscribers.push_back(self_.get());
}

process_table::subscription::subscription(subscription&& other) noexcept = default;

process_table::subscription& process_table::subscription::operator=(subscription&& other) noexcept {
    if (this != &other) {
        detach();
        table_ = std::move(other.table_);
        entry_ = std::move(other.entry_);
        self_ = std::move(other.self_);
    }
    return *this;
}

process_table::subscription::~subscription() {
    detach();
}

void process_table::subscription::detach() noexcept {
    if (!entry_ || !self_) return;
    auto& subs = entry_->subscribers;
    subs.erase(std::remove(subs.begin(), subs.end(), self_.get()), subs.end());
    entry_->wake_pump();
    self_.reset();
    entry_.reset();
    table_.reset();
}

std::uint32_t process_table::subscription::pid() const noexcept {
    return entry_ ? entry_->pid : 0;
}

asio::awaitable<result<process_event>> process_table::subscription::async_next(deadline wake) {
    if (!entry_ || !self_)
        co_return make_error(errc::invalid_argument, "the subscription is empty");
    auto table = table_;
    auto e = entry_;
    auto self = self_;  // the frame keeps it alive even if the subscription goes first
    for (;;) {
        if (table->closed_reason) co_return table->closed_error();
        if (self->end_delivered) {
            co_return make_error(errc::invalid_argument, "the process's end was already delivered");
        }
        if (self->cursor < e->first_seq) self->cursor = e->first_seq;  // dropped meanwhile
        if (self->cursor < e->next_seq()) {
            auto& item = e->log[self->cursor - e->first_seq];
            item.is_read = true;
            process_event event;
            event.type = process_event::kind::output;
            event.output.channel = item.channel;
            event.output.data = item.data;
            ++self->cursor;
            e->wake_pump();
            co_return event;
        }
        if (e->end) {
            self->end_delivered = true;
            process_event event;
            event.type = process_event::kind::end;
            event.end = *e->end;
            co_return event;
        }
        if (e->failure) co_return *e->failure;
        if (wake.has_expired()) {
            process_event event;
            event.type = process_event::kind::idle;
            co_return event;
        }
        asio::steady_timer timer(table->executor, wake.when());
        self->waiting = &timer;
        pointer_reset<asio::steady_timer> unregister{self->waiting};
        auto token = as_tuple(asio::use_awaitable);
        (void)co_await timer.async_wait(token);
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return make_error(errc::cancelled, "waiting for the process's output was cancelled");
        }
    }
}

process_table::process_table(asio::any_io_executor executor, process_table_options options)
    : state_(std::make_shared<state>(std::move(executor), std::move(options))) {}

process_table::~process_table() {
    close("the sandbox's process table was destroyed");
}

result<void> process_table::check_capacity() const {
    if (state_->closed_reason) return state_->closed_error();
    if (state_->live.size() >= state_->options.max_processes) {
        return make_error(errc::limit_exceeded,
                          "this sandbox already runs " + std::to_string(state_->live.size()) +
                              " processes, the most moat serve keeps per sandbox");
    }
    return {};
}

result<std::uint32_t> process_table::add(process p, process_config config,
                                         std::optional<std::string> tag) {
    if (auto room = check_capacity(); !room) return std::move(room).error();
    auto e = std::make_shared<entry>();
    e->budget = state_->options.budget;
    e->pid = static_cast<std::uint32_t>(p.pid());
    e->config = std::move(config);
    e->tag = std::move(tag);
    e->proc = std::make_shared<process>(std::move(p));
    auto& retained = state_->retained;
    retained.erase(std::remove_if(retained.begin(), retained.end(),
                                  [&](const std::shared_ptr<entry>& old) {
                                      return old->pid == e->pid || (e->tag && old->tag == e->tag);
                                  }),
                   retained.end());
    state_->live[e->pid] = e;
    std::weak_ptr<state> weak = state_;
    state_->tasks.spawn(pump(std::move(weak), e));
    return e->pid;
}

result<process_table::subscription> process_table::subscribe(const process_selector& selector) {
    auto found = state_->find_any(selector);
    if (!found) return std::move(found).error();
    return subscription(state_, *found);
}

result<void> process_table::check_live(const process_selector& selector) const {
    auto found = state_->find_live(selector);
    if (!found) return std::move(found).error();
    return {};
}

std::vector<process_info> process_table::list() const {
    std::vector<process_info> out;
    if (state_->closed_reason) return out;
    out.reserve(state_->live.size());
    for (const auto& [pid, e] : state_->live) out.push_back(e->info());
    return out;
}

result<process_info> process_table::info(const process_selector& selector) const {
    auto found = state_->find_any(selector);
    if (!found) return std::move(found).error();
    return (*found)->info();
}

asio::awaitable<result<void>> process_table::async_write_stdin(process_selector selector,
                                                               std::string data, deadline limit) {
    auto table = state_;
    auto found = table->find_live(selector);
    if (!found) co_return std::move(found).error();
    auto e = *found;
    auto token = as_tuple(asio::use_awaitable);
    while (e->input_busy) {  // one write at a time, so two clients' bytes never interleave
        if (limit.has_expired()) {
            co_return make_error(errc::deadline_exceeded,
                                 "another write to the process's stdin did not finish in time");
        }
        asio::steady_timer timer(table->executor, limit.when());
        e->input_waiters.push_back(&timer);
        waiter_removal unregister{e->input_waiters, &timer};
        (void)co_await timer.async_wait(token);
        if (is_cancelled(co_await asio::this_coro::cancellation_state)) {
            co_await asio::this_coro::reset_cancellation_state();
            co_return make_error(errc::cancelled, "writing to the process's stdin was cancelled");
        }
    }
    if (table->closed_reason) co_return table->closed_error();
    if (e->end || e->failure) co_return state::not_found(selector);
    e->input_busy = true;
    struct release {
        entry& owner;
        ~release() {
            owner.input_busy = false;
            for (auto* t : owner.input_waiters) t->cancel();
        }
    } turn{*e};
    auto proc = e->proc;
    if (!proc) co_return state::not_found(selector);
    auto write = proc->async_write_stdin(std::move(data));
    co_return co_await with_timeout(std::move(write), limit);
}

asio::awaitable<result<void>> process_table::async_close_stdin(process_selector selector) {
    auto found = state_->find_live(selector);
    if (!found) co_return std::move(found).error();
    auto proc = (*found)->proc;
    if (!proc) co_return state::not_found(selector);
    co_return co_await proc->async_close_stdin();
}

asio::awaitable<result<void>> process_table::async_signal(process_selector selector, int signal) {
    auto found = state_->find_live(selector);
    if (!found) co_return std::move(found).error();
    auto proc = (*found)->proc;
    if (!proc) co_return state::not_found(selector);
    co_return co_await proc->async_signal(signal);
}

void process_table::close(std::string reason) {
    auto& s = *state_;
    if (s.closed_reason) return;
    s.closed_reason = std::move(reason);
    // Dropping the table's reference kills each process that still runs (a pump in the middle of
    // a read holds its own until the cancellation below has killed it and confirmed the end).
    for (const auto& [pid, e] : s.live) {
        e->proc.reset();
        e->wake();
    }
    for (const auto& e : s.retained) e->wake();
    s.live.clear();
    s.retained.clear();
    s.tasks.cancel_all();
}

bool process_table::is_closed() const noexcept {
    return state_->closed_reason.has_value();
}

asio::awaitable<void> process_table::async_shutdown() {
    close("the sandbox's process table was shut down");
    auto table = state_;
    co_await table->tasks.async_wait_all();
}

}  // namespace moat::serve
