// The sandbox's `sudo`: moat-sandboxd run under the name sudo (bind-mounted read-only at
// /opt/moat/bin/sudo, and over a host's own sudo, by template_root.cpp). It is not setuid and
// gains nothing itself (nosuid mounts and no_new_privs stay): it asks pid 1 over its sudo socket
// (wire::sudo_socket_name, checked there with SO_PEERCRED) to start the command as the sandbox's
// root, hands over its stdin, stdout and stderr (SCM_RIGHTS), passes on SIGINT, SIGTERM, SIGHUP,
// SIGQUIT, SIGUSR1 and SIGUSR2, and ends as the command did: its exit status, or the same
// signal. Refused (exit 1, with a message) when the sandbox does not allow sudo
// (sandbox_spec::allow_sudo) or pid 1 runs too many sudo requests already.
//
//   sudo [-E] [-H] [-n] [-S] [-u root] [--] [NAME=VALUE...] COMMAND [ARG...]
//
// -E keeps the caller's environment; without it the command gets PATH, TERM, LANG and LC_*,
// the proxy variables, HOME=/root, USER, LOGNAME and SHELL of root, and SUDO_USER, SUDO_UID,
// SUDO_GID and SUDO_COMMAND. NAME=VALUE arguments are added. -n and -S change nothing (there is
// never a password), -H is the default, -u accepts only root (or #0). Any other option is an
// error (exit 1) naming it.
#pragma once

#include <string_view>

namespace moat::sandboxd {

// True when argv[0]'s last component is "sudo".
bool invoked_as_sudo(std::string_view argv0);

// Runs the shim; the process exit code (or it ends by the command's signal).
int run_sudo_shim(int argc, char** argv);

}  // namespace moat::sandboxd
