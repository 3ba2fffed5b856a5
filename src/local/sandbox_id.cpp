#include "local/sandbox_id.hpp"

#include <sys/random.h>
#include <array>
#include <cstdint>

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

}  // namespace moat
