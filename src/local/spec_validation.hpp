// Checks of caller input before anything is created or started. Each failure is
// errc::invalid_argument with a detail naming the field.
#pragma once

#include <moat/exec.hpp>
#include <moat/result.hpp>
#include <moat/sandbox_spec.hpp>

#include <string_view>

namespace moat {

result<void> validate_spec(const sandbox_spec& spec);
// The layout's fields (see sandbox_layout), and where the local backend can place them.
result<void> validate_layout(const sandbox_layout& layout);
// `path` is `tree` or lies under it ("/workspace/out" is within "/workspace", "/workspacex" not).
bool is_within(std::string_view path, std::string_view tree) noexcept;
// The writable tree of the local backend's sandboxes holding `path` ("/workspace", "/tmp",
// "/home"), or "" if none does.
std::string_view writable_tree(std::string_view path) noexcept;
// The explicit limits of `limits` against the ranges documented in resource_limits.
result<void> validate_limits(const resource_limits& limits);
// `ceiling` is exec_request::max_wall_limit for a command, max_spawn_wall_limit for a spawn.
result<void> validate_exec(const exec_request& request,
                           std::chrono::milliseconds ceiling = exec_request::max_wall_limit);
result<void> validate_ttl(std::chrono::milliseconds ttl);

// /workspace is a tmpfs charged to the sandbox's memory: a size at or above the memory limit is
// clamped to half of it, so filling /workspace ends in ENOSPC rather than an OOM kill. Unset
// limits count as their defaults.
std::uint64_t effective_workspace_bytes(const resource_limits& limits) noexcept;

}  // namespace moat
