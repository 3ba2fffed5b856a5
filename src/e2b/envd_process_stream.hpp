// Commands over envd's process service: a Start stream read as moat's exec_stream (or, for a
// spawned command, a moat::process with stdin and signals through SendInput, CloseStdin and
// SendSignal).
//
// - The request's wall limit is sent as Connect-Timeout-Ms (envd kills the process when it
//   passes and ends the stream with deadline_exceeded) and enforced here too: a stream still open
//   a second past the limit is closed, the process is killed with SendSignal and its end
//   confirmed through Process/List. Either way the result is data: timed_out, exit code 124,
//   signal SIGKILL (as the local backend reports it); unconfirmed, backend_failure.
// - A caller's cancellation (or with_timeout's deadline) closes the stream, sends SIGKILL by the
//   command's tag, and waits up to kill_grace for Process/List to stop listing it: then
//   errc::cancelled; unconfirmed, errc::backend_failure. A cancellation while Start is in flight
//   first waits (within kill_grace) for envd's answer: the command is listed only from then on.
// - Dropping the stream or the process before its end kills the command (a task of the client's
//   task group sends the SIGKILL).
// - Frames are capped at envd_options::max_frame_bytes; a truncated, oversized or garbage frame
//   is protocol_error (and the command is killed).
#pragma once

#include "e2b/envd_calls.hpp"

#include <moat/exec.hpp>
#include <moat/result.hpp>

#include <asio/awaitable.hpp>

namespace moat::e2b {

asio::awaitable<result<exec_stream>> async_start_exec_stream(state_ptr s, exec_request request);
asio::awaitable<result<process>> async_start_process(state_ptr s, exec_request request);

}  // namespace moat::e2b
