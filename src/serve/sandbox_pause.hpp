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
//
// autoResume (E2B's lifecycle.autoResume): traffic to such a paused sandbox, a port request or an
// envd call that names it with its credentials, resumes it first (wake_for_traffic) and then goes
// on; its end is then auto_resume_ttl from the resume: the create's timeout, at least
// auto_resume_min_ttl, as E2B's API does. Without autoResume, that traffic is answered as for a
// sandbox that is gone (502 "The sandbox was not found", E2B's proxy's answer) until connect or
// resume. One resume at a time per sandbox: every other resume (traffic, connect, resume) joins
// the one in flight.
#pragma once

#include "serve/serve_context.hpp"

#include <asio/awaitable.hpp>

#include <chrono>

namespace moat::serve {

// How often the watcher looks for autoPause sandboxes at their end.
inline constexpr std::chrono::seconds auto_pause_interval{1};
// The least an auto-resumed sandbox runs before its timeout (E2B's minimum-autoresume-timeout).
inline constexpr std::chrono::seconds auto_resume_min_ttl{300};

// The TTL an auto-resume gives a sandbox created with `timeout`.
inline std::chrono::seconds auto_resume_ttl_for(std::chrono::seconds timeout) {
    return timeout < auto_resume_min_ttl ? auto_resume_min_ttl : timeout;
}

// A new entry's lifecycle: autoPause (its end auto_pause_grace before its moat TTL's) and
// autoResume (with the TTL a resume by traffic gives a sandbox created with `timeout`).
void set_lifecycle(registry_entry& entry, bool auto_pause, bool auto_resume,
                   std::chrono::seconds timeout);

// Traffic to the entry is answered as for a sandbox that is gone: it is paused, without
// autoResume, and no resume is in flight.
inline bool refuses_traffic(const registry_entry& entry) {
    return entry.paused && !entry.auto_resume && !entry.resuming;
}

// Pauses the entry's sandbox (the entry must not be paused), then holds the paused budget.
asio::awaitable<result<void>> pause_entry(serve_context& context,
                                          std::shared_ptr<registry_entry> entry);
// Resumes the entry's sandbox (joining the resume in flight, if any) and sets its end `ttl` from
// now (an autoPause one's moat TTL auto_pause_grace more).
// Cancellation: the caller stops waiting (errc::cancelled); the resume runs on in the server's
// background group, bounded by the backend.
asio::awaitable<result<void>> resume_entry(serve_context& context,
                                           std::shared_ptr<registry_entry> entry,
                                           std::chrono::milliseconds ttl);
// Before traffic to the entry goes on: nothing when it runs; resumes it (or joins the resume in
// flight) when it is paused with autoResume. Errors: sandbox_paused (paused, no autoResume),
// sandbox_not_found (it ended meanwhile), the resume's own failure. Cancellation as resume_entry.
asio::awaitable<result<void>> wake_for_traffic(serve_context& context,
                                               std::shared_ptr<registry_entry> entry);
// Pauses autoPause sandboxes at their end, every auto_pause_interval, until cancelled.
asio::awaitable<void> run_auto_pauser(serve_context& context);

}  // namespace moat::serve
