// The read-only root every sandbox starts from, built once per helper in the helper's private
// mount namespace (never visible on the host):
//
//   /            tmpfs, remounted ro,nosuid,nodev when complete
//   /usr         ro,nosuid,nodev bind of the host's /usr
//   /bin /sbin /lib /lib64   the host's symlinks into usr (a real directory is bound read-only)
//   /etc         written: passwd, group, hosts, hostname, resolv.conf, nsswitch.conf; bound or
//                mirrored from the host: ld.so.cache, localtime, os-release, alternatives/, ssl/,
//                python3*/ (never the host's passwd, shadow or group)
//   /dev         tmpfs (ro,nosuid,nodev,noexec) with read-only binds of null, zero, full, random,
//                urandom, tty; fd, stdin, stdout, stderr symlinks into /proc/self/fd; shm/
//   /proc /tmp /workspace /dev/shm /root /home   empty mount points
//   /.layer      the mount point a sandbox of a template builds its root on (sandbox_child.cpp)
//   /opt/moat/bin  python -> /usr/bin/python3 and pip -> /usr/bin/pip3, each only when the host
//                lacks /usr/bin/python (pip) and has its target; last on the default PATH
//   /opt/moat/python  the mount point of each sandbox's own Python environment (python_env.hpp),
//                first on the default PATH
//
// There is no /sys. Each sandbox's root is an overlay of this tree (idmapped onto its user
// namespace, so that its root owns what host root owns here) and a tmpfs of its own, with the
// host binds above bound again over it (sandbox_child.cpp, build_layer_root); where idmapped
// mounts of this tmpfs are unavailable, the sandbox bind-mounts the tree itself, read-only. Either
// way it mounts its own /proc, /tmp, /dev/shm and /workspace on the mount points, and /home when
// its layout has a home there; a sandbox whose layout names another user or home has its own
// passwd and group over /etc's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moat::sandboxd {

// Builds the template at `path` (created if missing). The caller must already be in a private
// mount namespace. Returns 0 or an errno, with `detail` naming the failed step. `bound` receives
// the paths (relative to the root: "usr", "etc/ssl"...) bound from the host below the root, /dev
// aside: what a sandbox whose root is an overlay of this tree binds again over it (the overlay
// shows the tree's own files, not the mounts on it).
int build_template_root(const std::string& path, std::vector<std::string>& bound,
                        std::string& detail);

// The name of uid 1000 (wire::sandbox_user_id) in the template's /etc/passwd.
inline constexpr std::string_view template_user_name = "user";

// /etc/passwd and /etc/group of a sandbox whose commands run as `user` (uid and gid 1000) with
// `home`: root, that user, nobody (nogroup).
std::string passwd_for(std::string_view user, std::string_view home);
std::string group_for(std::string_view user);

}  // namespace moat::sandboxd
