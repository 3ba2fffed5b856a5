#include "core/rfc3339.hpp"

#include <cstdint>
#include <cstdio>
#include <ctime>

namespace moat::detail {
namespace {

bool digits(std::string_view s, std::size_t at, std::size_t count, int& out) {
    if (at + count > s.size()) return false;
    out = 0;
    for (std::size_t i = at; i < at + count; ++i) {
        if (s[i] < '0' || s[i] > '9') return false;
        out = out * 10 + (s[i] - '0');
    }
    return true;
}

}  // namespace

std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view s) {
    int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
    const bool head = s.size() >= 20 && digits(s, 0, 4, year) && s[4] == '-' &&
                      digits(s, 5, 2, month) && s[7] == '-' && digits(s, 8, 2, day) &&
                      (s[10] == 'T' || s[10] == 't') && digits(s, 11, 2, hour) && s[13] == ':' &&
                      digits(s, 14, 2, minute) && s[16] == ':' && digits(s, 17, 2, second);
    if (!head || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 ||
        second > 60 || year < 1970 || year > 2200) {
        return std::nullopt;
    }
    std::size_t at = 19;
    std::int64_t nanos = 0;
    if (at < s.size() && s[at] == '.') {
        ++at;
        std::size_t n = 0;
        while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
            if (n < 9) nanos = nanos * 10 + (s[at] - '0');
            ++n;
            ++at;
        }
        if (n == 0) return std::nullopt;
        for (std::size_t k = n; k < 9; ++k) nanos *= 10;
    }
    std::int64_t offset_s = 0;
    if (at < s.size() && (s[at] == 'Z' || s[at] == 'z')) {
        ++at;
    } else if (at < s.size() && (s[at] == '+' || s[at] == '-')) {
        int oh = 0, om = 0;
        if (!digits(s, at + 1, 2, oh) || at + 3 >= s.size() || s[at + 3] != ':' ||
            !digits(s, at + 4, 2, om) || oh > 23 || om > 59) {
            return std::nullopt;
        }
        offset_s = (oh * 3600 + om * 60) * (s[at] == '+' ? 1 : -1);
        at += 6;
    } else {
        return std::nullopt;
    }
    if (at != s.size()) return std::nullopt;
    std::tm tm{};
    tm.tm_year = year - 1900;
    tm.tm_mon = month - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = minute;
    tm.tm_sec = second;
    const std::time_t t = ::timegm(&tm);
    return std::chrono::system_clock::from_time_t(t) - std::chrono::seconds(offset_s) +
           std::chrono::duration_cast<std::chrono::system_clock::duration>(
               std::chrono::nanoseconds(nanos));
}

std::string format_rfc3339(std::chrono::system_clock::time_point t, int fraction_digits) {
    const auto since = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch());
    std::int64_t seconds = since.count() / 1'000'000'000;
    std::int64_t nanos = since.count() % 1'000'000'000;
    if (nanos < 0) {  // before 1970: the fraction counts up from the second below
        nanos += 1'000'000'000;
        --seconds;
    }
    const std::time_t whole = static_cast<std::time_t>(seconds);
    std::tm utc{};
    ::gmtime_r(&whole, &utc);
    char text[48];
    std::size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
    std::string out(text, n);
    if (fraction_digits != 0) {
        const int width = fraction_digits == 3 || fraction_digits == 6 ? fraction_digits : 9;
        std::int64_t fraction = nanos;
        for (int k = width; k < 9; ++k) fraction /= 10;
        char digits_text[16];
        std::snprintf(digits_text, sizeof digits_text, ".%0*lld", width,
                      static_cast<long long>(fraction));
        out += digits_text;
    }
    out += 'Z';
    return out;
}

}  // namespace moat::detail
