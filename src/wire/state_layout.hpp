// Where things live in the state directory, shared by the library and the helper:
//
//   <state_dir>/                0711, root: searchable so sandbox setup (unprivileged host uids)
//                               reaches the read-only template
//   <state_dir>/template/       the template root (helper)
//   (uid range locks are host-wide, not here: see sandboxd/uid_slots.hpp)
//   <state_dir>/sandboxes/      0700, root: per sandbox
//       <id>.json               its record (written by the library, atomically; 0600)
//       <id>.sock               survivors: the attach socket its pid 1 listens on (0600)
#pragma once

#include <string>
#include <string_view>

namespace moat::wire {

inline constexpr std::string_view sandboxes_subdir = "sandboxes";

inline std::string sandboxes_dir(std::string_view state_dir) {
    return std::string(state_dir) + "/" + std::string(sandboxes_subdir);
}

inline std::string record_path(std::string_view state_dir, std::string_view id) {
    return sandboxes_dir(state_dir) + "/" + std::string(id) + ".json";
}

// The sandbox's egress byte meter (egress/byte_meter.hpp), shared by every process serving it.
inline std::string egress_meter_path(std::string_view state_dir, std::string_view id) {
    return sandboxes_dir(state_dir) + "/" + std::string(id) + ".egress";
}

inline std::string attach_socket_path(std::string_view state_dir, std::string_view id) {
    return sandboxes_dir(state_dir) + "/" + std::string(id) + ".sock";
}

}  // namespace moat::wire
