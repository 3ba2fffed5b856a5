// How the CLI shows a sandbox: as a JSON object (create --json, ls --json) and as times for
// people (ls).
#pragma once

#include <moat/sandbox_spec.hpp>

#include "core/json_writer.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace moat::cli {

// {"id", "state", "created_at", "expires_at" (RFC 3339 UTC), "host_pid" (or null), "owned",
//  "survive_owner", "owner_instance", "labels": {...}, "memory_used_bytes", "pids_current"
//  (or null), "layers": [...], "limits": {...}}
void write_sandbox_json(json_writer& w, const sandbox_info& info);
// A JSON array of those objects and a newline (ls --json, session ls --json).
std::string sandboxes_json(const std::vector<sandbox_info>& sandboxes);

// "2026-11-30T10:34:00Z"
std::string format_utc(std::chrono::system_clock::time_point t);

// A span for people: "42s", "5m12s", "3h04m", "2d03h"; negative spans get a leading "-".
std::string format_span(std::chrono::system_clock::duration d);

}  // namespace moat::cli
