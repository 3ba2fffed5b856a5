// posix_spawn's attribute and file-action objects, owned, set up the one way moat starts a child
// (the sandbox helper, umoci): every signal at its default disposition, an empty signal mask, and
// a process group of its own, so that a kill of the group reaches whatever the child starts.
#pragma once

#include <signal.h>
#include <spawn.h>

namespace moat::detail {

struct spawn_attributes {
    posix_spawnattr_t attr{};
    posix_spawn_file_actions_t actions{};
    spawn_attributes() {
        posix_spawnattr_init(&attr);
        posix_spawn_file_actions_init(&actions);
        sigset_t signals;
        sigemptyset(&signals);
        posix_spawnattr_setsigmask(&attr, &signals);
        sigfillset(&signals);
        posix_spawnattr_setsigdefault(&attr, &signals);
        posix_spawnattr_setpgroup(&attr, 0);
        posix_spawnattr_setflags(
            &attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
    }
    ~spawn_attributes() {
        posix_spawn_file_actions_destroy(&actions);
        posix_spawnattr_destroy(&attr);
    }
    spawn_attributes(const spawn_attributes&) = delete;
    spawn_attributes& operator=(const spawn_attributes&) = delete;
};

}  // namespace moat::detail
