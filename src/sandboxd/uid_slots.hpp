// Host uid/gid ranges for sandboxes. Slot n maps sandbox ids [0, wire::uid_range_size) onto host
// ids starting at first_uid + n * wire::uid_range_size, so no two live sandboxes share a host id
// and none maps host root. A slot is claimed by an exclusive flock on <state>/uids/<n>.lock; the
// lock fd is handed to the sandbox's pid 1, so the slot stays claimed exactly as long as the
// sandbox lives, even after the helper that created it is gone.
#pragma once

#include <cstdint>
#include <string>

namespace moat::sandboxd {

inline constexpr std::uint32_t first_uid = 1u << 20;
inline constexpr std::uint32_t slot_count = 60000;

struct uid_slot {
    int lock_fd = -1;  // close-on-exec; closing the last copy releases the slot
    std::uint32_t uid_base = 0;
};

class uid_slots {
  public:
    uid_slots() = default;
    uid_slots(const uid_slots&) = delete;
    uid_slots& operator=(const uid_slots&) = delete;
    ~uid_slots();

    // Creates <state_dir>/uids (0700) if needed. Returns 0 or an errno.
    int open(const std::string& state_dir);

    // Claims a free slot, probing from a random one. Returns 0, EAGAIN when every slot is taken,
    // or the errno of the failing call.
    int claim(uid_slot& out);

  private:
    int dir_fd_ = -1;
};

}  // namespace moat::sandboxd
