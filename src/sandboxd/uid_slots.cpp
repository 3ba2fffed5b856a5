#include "sandboxd/uid_slots.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <charconv>

#include "wire/protocol.hpp"

namespace moat::sandboxd {

static_assert(std::uint64_t{first_uid} + std::uint64_t{slot_count} * wire::uid_range_size <
                  0xffffffffull,
              "uid ranges must stay below the invalid uid (uint32 -1)");

uid_slots::~uid_slots() {
    if (dir_fd_ >= 0) ::close(dir_fd_);
}

int uid_slots::open(const std::string& state_dir) {
    const std::string dir = state_dir + "/uids";
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno;
    dir_fd_ = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    return dir_fd_ < 0 ? errno : 0;
}

int uid_slots::claim(uid_slot& out) {
    // Randomness only spreads where the probe starts (any start finds a free slot, every slot is
    // tried once): one call, no loop, and without it the pid still spreads helpers apart.
    std::uint32_t start = 0;
    if (::getrandom(&start, sizeof start, GRND_NONBLOCK) != sizeof start) {
        start = static_cast<std::uint32_t>(::getpid());
    }
    for (std::uint32_t i = 0; i < slot_count; ++i) {
        const std::uint32_t slot = (start + i) % slot_count;
        char name[16];
        auto [end, ec] = std::to_chars(name, name + sizeof name - 6, slot);
        (void)ec;
        std::char_traits<char>::copy(end, ".lock", 6);
        const int fd = ::openat(dir_fd_, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) return errno;
        if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
            out.lock_fd = fd;
            out.uid_base = first_uid + slot * wire::uid_range_size;
            return 0;
        }
        const int err = errno;
        ::close(fd);
        if (err != EWOULDBLOCK) return err;
    }
    return EAGAIN;
}

}  // namespace moat::sandboxd
