#include "local/sandbox_id.hpp"

#include <sys/random.h>
#include <array>
#include <cstdint>
#include <stdexcept>

namespace moat {

std::string make_sandbox_id() {
    std::array<std::uint8_t, 10> bytes{};
    std::size_t filled = 0;
    while (filled < bytes.size()) {
        const ssize_t n = ::getrandom(bytes.data() + filled, bytes.size() - filled, 0);
        if (n > 0) filled += static_cast<std::size_t>(n);
    }
    static constexpr char digits[] = "0123456789abcdef";
    std::string id = "sb-";
    for (const auto b : bytes) {
        id += digits[b >> 4];
        id += digits[b & 15];
    }
    return id;
}

bool is_valid_sandbox_id(const std::string& id) noexcept {
    if (id.size() != 23 || id.compare(0, 3, "sb-") != 0) return false;
    for (std::size_t i = 3; i < id.size(); ++i) {
        const char c = id[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return true;
}

}  // namespace moat
