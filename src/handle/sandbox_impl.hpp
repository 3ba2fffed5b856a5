// The shared state behind a moat::sandbox handle (see sandbox.hpp for the contract). Background
// work (the destroy after a quarantine, running backend operations) holds it alive.
#pragma once

#include <moat/sandbox.hpp>
#include <moat/task_group.hpp>

#include "core/async_event.hpp"
#include "handle/operation_queue.hpp"
#include "handle/port_forwarder.hpp"
#include "handle/telemetry.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>

namespace moat {

struct sandbox::impl : std::enable_shared_from_this<sandbox::impl> {
    impl(backend& b, sandbox_info i, handle_options o, std::function<void()> ended_hook,
         std::shared_ptr<moat::telemetry> t);

    // An operation's place in its lane (the ordered lane's one turn, or one of the side lane's)
    // while it holds it. Handed on when it goes, however that happens (a normal end, an
    // exception, a frame destroyed while suspended).
    class held_turn {
      public:
        held_turn(std::shared_ptr<impl> owner, moat::lane in)
            : owner_(std::move(owner)), lane_(in) {}
        held_turn(held_turn&& other) noexcept
            : owner_(std::move(other.owner_)), lane_(other.lane_) {}
        held_turn& operator=(held_turn&& other) noexcept {
            if (this != &other) {
                release();
                owner_ = std::move(other.owner_);
                lane_ = other.lane_;
            }
            return *this;
        }
        held_turn(const held_turn&) = delete;
        held_turn& operator=(const held_turn&) = delete;
        ~held_turn() { release(); }
        // Gives the turn to the next operation now.
        void release() {
            if (auto owner = std::exchange(owner_, nullptr)) owner->end_turn(lane_);
        }

      private:
        std::shared_ptr<impl> owner_;
        moat::lane lane_;
    };

    // sandbox_unavailable with the cause if no operation may start; nullopt if one may.
    std::optional<error> refusal() const;
    // ready/busy -> quarantined, then a background destroy.
    void quarantine(const error& why);
    // Waits for this caller's place in its lane (FIFO): the place, or the error (cancelled,
    // deadline_exceeded, sandbox_unavailable).
    static asio::awaitable<result<held_turn>> acquire_turn(std::shared_ptr<impl> self,
                                                           const char* what, deadline limit,
                                                           moat::lane in);
    // Runs one backend operation while holding the turn, under the caller's deadline and
    // cancellation (stopped and confirmed within the backend's stop grace plus the handle's
    // kill grace, or quarantine). `start` makes the backend's awaitable (a plain lambda, not a
    // coroutine). Never throws.
    template <class T>
    static asio::awaitable<result<T>> run_in_turn(
        std::shared_ptr<impl> self, const char* what, deadline limit,
        std::function<asio::awaitable<result<T>>()> start);
    // Once `what` holds its place: a paused sandbox is resumed first, or the operation fails with
    // sandbox_paused, as options.on_paused says (sandbox_pause.cpp).
    static asio::awaitable<result<void>> unpause_for(std::shared_ptr<impl> self, const char* what,
                                                     deadline limit);
    // acquire_turn + run_in_turn, then the place goes on.
    template <class T>
    static asio::awaitable<result<T>> run(std::shared_ptr<impl> self, const char* what,
                                          deadline limit, moat::lane in,
                                          std::function<asio::awaitable<result<T>>()> start);
    // Destroys the sandbox (or waits for the destroy under way) and returns its outcome. Not
    // cancellable: the destroy runs in the handle's own task group, to its confirmation or the
    // backend's bound.
    static asio::awaitable<result<void>> destroy_now(std::shared_ptr<impl> self);
    // The one destroy of this handle's sandbox (started at most once, by destroy_now).
    static asio::awaitable<void> destroy_once(std::shared_ptr<impl> self);
    // How long a stopped operation may take to confirm before the handle quarantines.
    std::chrono::milliseconds stop_bound() const;

    backend& sandboxes;
    asio::any_io_executor executor;
    sandbox_info info;
    handle_options options;
    handle_state state = handle_state::ready;
    std::optional<error> cause;
    operation_queue queue;       // the ordered lane: one at a time
    operation_queue side_queue;  // the side lane: options.side_lane_width at a time
    task_group tasks;
    async_event ended;  // destroyed or destroy_failed
    std::optional<result<void>> destroy_outcome;
    // The backend operations running now (both lanes), which a destroy stops.
    std::set<std::uint64_t> running_tasks;
    std::function<void()> on_end;  // the runtime's live count
    // Dropping the last reference detaches instead of destroying: the sandbox was attached, or
    // created to survive its owner.
    bool detach_on_drop = false;
    // The runtime (and with it, by contract, the backend) is being destroyed: nothing may call
    // the backend any more. Background work left on the executor finds this and stops.
    bool backend_gone = false;
    std::shared_ptr<moat::telemetry> telemetry;
    // async_port_host's loopback forwards (backends without port names), by sandbox port; closed
    // when the handle stops vouching for the sandbox (quarantine, destroy) or is dropped.
    std::map<std::uint16_t, std::unique_ptr<port_forwarder>> forwards;
    // Directory watches open now, or being opened (at most options.max_watches).
    std::size_t watches = 0;
    void close_forwards() noexcept;

    // Reports one finished operation (metrics and the runtime's on_operation).
    void report(const char* what, std::optional<errc> failure,
                std::chrono::steady_clock::time_point called,
                std::chrono::steady_clock::time_point granted);

    operation_queue& queue_of(moat::lane in) { return in == moat::lane::side ? side_queue : queue; }

  private:
    // Gives the place to the next operation of its lane (through held_turn only).
    void end_turn(moat::lane in);
};

// sandbox::async_connect_port on the handle's state (sandbox.cpp): also what the handle's loopback
// forwards connect with.
asio::awaitable<result<asio::ip::tcp::socket>> connect_port_call(
    std::shared_ptr<sandbox::impl> state, std::uint16_t port, deadline limit, moat::lane in);

// The backend's async_watch_dir in its lane (sandbox.cpp); sandbox_watch.cpp wraps the watch.
asio::awaitable<result<dir_watch>> watch_dir_call(std::shared_ptr<sandbox::impl> state,
                                                  std::string path, watch_options options,
                                                  deadline limit, moat::lane in);
// The backend's async_update_network in its lane (sandbox.cpp); sandbox_network.cpp keeps info.
asio::awaitable<result<sandbox_info>> update_network_call(std::shared_ptr<sandbox::impl> state,
                                                          sandbox_network network, deadline limit,
                                                          moat::lane in);

}  // namespace moat
