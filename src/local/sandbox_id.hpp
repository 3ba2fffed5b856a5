// Sandbox ids: chosen by moat from the kernel's random source, never by a tenant.
#pragma once

#include <moat/result.hpp>

#include <string>

namespace moat {

// "sb-" followed by 20 lowercase hex digits (80 random bits). backend_failure if the kernel's
// random source fails (a bounded number of tries: never a loop without end, never a guessable id).
result<std::string> make_sandbox_id();

}  // namespace moat
