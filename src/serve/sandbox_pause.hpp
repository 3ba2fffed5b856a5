// `moat serve`'s pause and resume (E2B's pause, resume, connect and autoPause): the registry
// entry's side of sandbox::async_pause / async_resume, the autoPause watcher, and the budget of
// paused sandboxes.
//
// A paused entry keeps its place in the registry (listed as `paused`, counted against
// --max-sandboxes); its end_at is the end of its paused lifetime (sandbox_spec::paused_lifetime,
// 24 h), and envd answers for it as for a sandbox that is gone until connect or resume. Past
// --paused-memory-mb (the memory paused sandboxes hold together, read from their cgroups) the one
// paused longest ago is ended. An autoPause sandbox's moat TTL runs auto_pause_grace past its
// end; the watcher pauses it at its end instead of letting it run out.
#pragma once

#include "serve/serve_context.hpp"

#include <asio/awaitable.hpp>

#include <chrono>

namespace moat::serve {

// How often the watcher looks for autoPause sandboxes at their end.
inline constexpr std::chrono::seconds auto_pause_interval{1};

// Pauses the entry's sandbox (the entry must not be paused), then holds the paused budget.
asio::awaitable<result<void>> pause_entry(serve_context& context,
                                          std::shared_ptr<registry_entry> entry);
// Resumes the entry's sandbox and sets its end `ttl` from now (an autoPause one's moat TTL
// auto_pause_grace more).
asio::awaitable<result<void>> resume_entry(serve_context& context, registry_entry& entry,
                                           std::chrono::milliseconds ttl);
// Pauses autoPause sandboxes at their end, every auto_pause_interval, until cancelled.
asio::awaitable<void> run_auto_pauser(serve_context& context);

}  // namespace moat::serve
