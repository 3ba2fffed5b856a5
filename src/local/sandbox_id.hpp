// Sandbox ids: chosen by moat from the kernel's random source, never by a tenant.
#pragma once

#include <string>

namespace moat {

// "sb-" followed by 20 lowercase hex digits (80 random bits).
std::string make_sandbox_id();

}  // namespace moat
