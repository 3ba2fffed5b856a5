#!/bin/sh
# Boots a User-Mode Linux guest (Debian's user-mode-linux, cgroup v2 with memory, pids and cpu)
# on the host's filesystem and runs tests/guest/guest_init.sh in it against the host's dev build:
# the local backend's isolation and limit tests, `moat doctor`, `moat bench create`, and the
# helper's TTL backstop under a stepped wall clock (which only the guest may step). With
# MOAT_GUEST_CGROUP=v1 the guest mounts only cgroup v1 hierarchies (freezer among them, no cgroup2)
# and runs the pause tests there instead (guest_init.sh's v1 batch).
#
#   tests/guest/run_guest.sh BUILD_DIR [WORK_DIR]
#
# BUILD_DIR is the dev build (its tests/moat_tests and moat). WORK_DIR (default BUILD_DIR/guest)
# receives the logs: status, tests.log, doctor.log, bench.log, cgroups.txt, console.txt. Exit 0
# when every step passed, 1 when one failed, 2 when the guest could not be run.
#
# The guest runs as an unprivileged host user (nobody): as root it could remount the host's
# filesystem writable. Its root is the host's / read-only; only WORK_DIR/out is writable. The
# guest mounts its own tmpfs on /run and /tmp and mounts a checkout, build or WORK_DIR that lies
# below them again at its own path, so any location works. It runs with its memory file in
# MOAT_GUEST_TMPDIR (default /dev/shm) and no core dumps. A stuck guest gets SIGTERM after
# MOAT_GUEST_TIMEOUT seconds (default 600), then its whole process group SIGKILL.
# MOAT_GUEST_BENCH_N sets the iterations of `moat bench create` in the guest (default 30).
set -u
build=$(cd "${1:?usage: run_guest.sh BUILD_DIR [WORK_DIR]}" && pwd) || exit 2
work=${2:-$build/guest}
here=$(cd "$(dirname "$0")" && pwd)
uml=$(command -v linux.uml || true)
if [ -z "$uml" ]; then
    echo "run_guest.sh: linux.uml not found (apt-get install user-mode-linux; scripts/install-deps)" >&2
    exit 2
fi
for f in "$build/tests/moat_tests" "$build/tests/moat_sandboxd_tests" "$build/moat" \
    "$here/guest_init.sh"; do
    [ -x "$f" ] || { echo "run_guest.sh: $f is missing" >&2; exit 2; }
done
case "$build$work$here" in
    *" "*) echo "run_guest.sh: paths with spaces cannot go on a kernel command line" >&2; exit 2 ;;
esac
user=${MOAT_GUEST_USER:-nobody}
uid=$(id -u "$user") && gid=$(id -g "$user") || exit 2
[ "$uid" -ne 0 ] || { echo "run_guest.sh: the guest must not run as host root" >&2; exit 2; }

rm -rf "$work"
mkdir -p "$work/out" "$work/uml" || exit 2
chown "$uid:$gid" "$work/out" "$work/uml" || exit 2
umid=moat-guest-$$
cd "$work" || exit 2
ulimit -c 0
timeout=${MOAT_GUEST_TIMEOUT:-600}
start=$(date +%s)
# setpriv: the guest kernel process and its helper threads all run as $user.
TMPDIR=${MOAT_GUEST_TMPDIR:-/dev/shm} timeout -s TERM "$timeout" \
    setpriv --reuid="$uid" --regid="$gid" --clear-groups \
    "$uml" mem=${MOAT_GUEST_MEM:-768M} rootfstype=hostfs rootflags=/ ro \
    init="$here/guest_init.sh" con=null con0=null,fd:1 \
    uml_dir="$work/uml" umid="$umid" quiet \
    MOAT_GUEST_BUILD="$build" MOAT_GUEST_OUT="$work/out" \
    MOAT_GUEST_BENCH_N="${MOAT_GUEST_BENCH_N:-30}" MOAT_GUEST_CGROUP="${MOAT_GUEST_CGROUP:-v2}" \
    </dev/null >"$work/console.txt" 2>&1
rc=$?
# Whatever is left of a guest that was stopped: its process group, from the pid file.
if [ -f "$work/uml/$umid/pid" ]; then
    pid=$(cat "$work/uml/$umid/pid")
    pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')
    [ -z "$pgid" ] || kill -KILL -- "-$pgid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
fi
echo "guest: exit $rc after $(($(date +%s) - start)) s"
cat "$work/out/status" 2>/dev/null
grep -q '^finished$' "$work/out/status" 2>/dev/null || {
    echo "run_guest.sh: the guest did not finish (console: $work/console.txt)" >&2
    tail -20 "$work/console.txt" >&2
    exit 1
}
failed=$(grep -v '^finished$' "$work/out/status" | awk '$2 != 0 { print $1 }')
for name in $failed; do
    echo "---- $name.log (failed) ----"
    tail -60 "$work/out/$name.log"
done
[ -z "$failed" ] || exit 1
exit 0
