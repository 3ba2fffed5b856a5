// RFC 3339 date-times, one parser and one printer for every place moat reads or writes them (the
// E2B API's startedAt/endAt and ?after filters, envd's modifiedTime, moat's own labels and
// reports).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace moat::detail {

// "2026-12-01T14:40:11Z", "...11.123456789Z", "...11.5+02:00" ('T'/'t', 'Z'/'z'; a fraction of 1
// to any number of digits, nanoseconds kept), years 1970 to 2200 (system_clock counts
// nanoseconds, about 1678 to 2262: kept well inside). None for anything else.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view text);

// UTC with `fraction_digits` (0, 3, 6 or 9; anything else is read as 9) digits after the seconds
// (truncated), then 'Z': "2026-12-01T14:40:11Z", "2026-12-01T14:40:11.123Z".
std::string format_rfc3339(std::chrono::system_clock::time_point t, int fraction_digits = 0);

}  // namespace moat::detail
