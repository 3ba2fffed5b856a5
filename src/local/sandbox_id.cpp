#include "local/sandbox_id.hpp"

#include "core/ascii.hpp"

#include <sys/random.h>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace moat {

result<std::string> make_sandbox_id() {
    std::array<std::uint8_t, 10> bytes{};
    std::size_t filled = 0;
    // A signal can interrupt a call (EINTR) or shorten it; a failure that persists (ENOSYS under a
    // seccomp filter, EPERM) is an error after a few tries.
    int err = 0;
    for (int attempt = 0; attempt < 8 && filled < bytes.size(); ++attempt) {
        const ssize_t n = ::getrandom(bytes.data() + filled, bytes.size() - filled, 0);
        if (n > 0) {
            filled += static_cast<std::size_t>(n);
        } else if (n < 0) {
            err = errno;
        }
    }
    if (filled < bytes.size()) {
        const char* name = err != 0 ? ::strerrorname_np(err) : "short reads";
        return make_error(errc::backend_failure,
                          std::string("cannot draw a sandbox id from the kernel's random source "
                                      "(getrandom: ") +
                              (name != nullptr ? name : "E?") + ")");
    }
    std::string id = "sb-";
    detail::append_hex(id, bytes);
    return id;
}

}  // namespace moat
