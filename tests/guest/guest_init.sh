#!/bin/sh
# pid 1 of the cgroup v2 guest (User-Mode Linux, booted by run_guest.sh). The host's filesystem is
# the guest's read-only root (hostfs); MOAT_GUEST_BUILD is the host's dev build, MOAT_GUEST_OUT a
# host directory the guest may write (both come from the kernel command line). Runs the batch,
# writes one "<step> <exit code>" line per step to $MOAT_GUEST_OUT/status, and powers off. Never
# exits: pid 1 exiting would panic the guest. With MOAT_GUEST_CGROUP=v1 it mounts only cgroup v1
# hierarchies (memory, pids, cpu, freezer; no cgroup2) and runs the v1 batch instead: pause and
# resume through the v1 freezer.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
out=$MOAT_GUEST_OUT
build=$MOAT_GUEST_BUILD
# The checkout: the build's tests use paths of it (fixtures, scripts).
source=$(cd "$(dirname "$0")/../.." && pwd)

power_off() {
    sync
    echo o >/proc/sysrq-trigger
    while :; do sleep 10; done
}
# One line on the console (run_guest.sh shows its tail), then off: pid 1 must never exit.
give_up() {
    echo "guest_init.sh: $*"
    power_off
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
cgroup=${MOAT_GUEST_CGROUP:-v2}
if [ "$cgroup" = v1 ]; then
    # A v1-only host, as older distributions mount it: no cgroup2 anywhere.
    mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup
    for c in memory pids cpu,cpuacct freezer; do
        mkdir "/sys/fs/cgroup/$c" && mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c" ||
            give_up "cannot mount the v1 $c hierarchy"
    done
else
    # As systemd mounts it: namespaces are delegation boundaries.
    mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
fi
# The guest's own /run and /tmp hide what the host has there: a checkout, build or work
# directory under them is mounted again from the host at its own path (so that the paths compiled
# into the build still hold), read-only like the rest of the root.
show_again() {
    [ -d "$1" ] && return 0
    mkdir -p "$1" && mount -r -t hostfs -o "$1" hostfs "$1" ||
        give_up "cannot mount the host's $1 into the guest"
}
show_again "$source"
show_again "$build"
# The one writable host directory.
mkdir -p "$out" 2>/dev/null
mount -t hostfs -o "$out" hostfs "$out" || give_up "cannot mount the host's $out writable"
: >"$out/status" 2>/dev/null || give_up "cannot write $out/status"

step() {
    name=$1
    shift
    "$@" >"$out/$name.log" 2>&1
    echo "$name $?" >>"$out/status"
}

# Before a batch: the kernel and what "$@" says of its cgroups in guest.txt, and the environment
# the tests read.
begin_batch() {
    {
        uname -r
        "$@"
    } >"$out/guest.txt" 2>&1
    export HOME=/tmp MOAT_REQUIRE_NAMESPACES=1 MOAT_EXPECT_CGROUP="$cgroup"
    cd /tmp || echo "cd /tmp failed" >>"$out/guest.txt"
}

# The v1 batch: the pause tests, whose commands the v1 freezer must freeze (never pid 1), and the
# cgroup test of the v1 layout.
if [ "$cgroup" = v1 ]; then
    begin_batch grep cgroup /proc/self/mountinfo
    tests="pause then resume keeps*,a paused sandbox's TTL does not run out*"
    tests="$tests,operations on a paused sandbox resume it first*,destroying a paused sandbox*"
    tests="$tests,*written to the cgroup version the host gives moat*"
    step tests "$build/tests/moat_tests" --no-version --duration=true -tc="$tests"
    # Every sandbox had its freezer cgroup, and none is left.
    find /sys/fs/cgroup/freezer -mindepth 1 -type d >"$out/cgroups.txt" 2>&1
    step no_freezer_left test "$(cat "$out/cgroups.txt")" = /sys/fs/cgroup/freezer/moat
    echo finished >>"$out/status"
    power_off
fi

echo "+memory +pids +cpu" >/sys/fs/cgroup/cgroup.subtree_control
begin_batch sh -c 'echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
    echo "subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"'

# The local backend's isolation and limit tests, in one process (process creation is 10-30x
# slower here than on the host). doctest filters: comma-separated, * wildcards.
tests="*written to the cgroup version the host gives moat*"
tests="$tests,*memory bomb is OOM-killed*,*busy loop under a cpu quota*"
tests="$tests,*wall limit kills the command*whole tree*"
tests="$tests,a flood of processes stops at pids.max and the sandbox still works"
tests="$tests,a busy loop ends at the wall limit with 124 and nothing left"
tests="$tests,background children die with their command"
tests="$tests,destroy leaves no process*,exit codes*,the root is read-only and /workspace*"
tests="$tests,only the sandbox*own processes appear in its /proc"
tests="$tests,a sandbox reports the isolation layers it got"
tests="$tests,destroying the backend ends every sandbox it created"
tests="$tests,moat doctor reports every isolation layer and passes its live check"
tests="$tests,moat janitor cleans up after kill -9*"
# The seccomp allow-list on this kernel: the denied families, and the usual workloads under it.
tests="$tests,*denied syscall family*,Python's subprocess*,pip downloads*"
tests="$tests,*started with setsid is killed when the exec ends*,per-command cgroups are reused*"
step tests "$build/tests/moat_tests" --no-version --duration=true -tc="$tests"
step doctor "$build/moat" doctor
# doctor passing is not enough: it must have found v2, not a v1 or no-cgroup fallback.
step doctor_reports_v2 grep -E "^  cgroups +v2 \(unified\)" "$out/doctor.log"
step bench "$build/moat" bench create --n "${MOAT_GUEST_BENCH_N:-30}"
# The helper's TTL backstop under a wall clock stepped forward: a test that steps the clock, which
# only a throwaway guest may do (it is skipped elsewhere and refuses to run without this variable).
step wall_clock_step env MOAT_GUEST_CLOCK_STEPPABLE=1 "$build/tests/moat_sandboxd_tests" \
    --no-skip --no-version -tc="a wall-clock step forward does not end a sandbox before its TTL"
# Nothing of moat may be left in the cgroup tree but the empty parent, nor any process of a
# sandbox or helper.
find /sys/fs/cgroup -mindepth 1 -type d >"$out/cgroups.txt" 2>&1
step no_cgroup_left test "$(cat "$out/cgroups.txt")" = /sys/fs/cgroup/moat
for p in /proc/[0-9]*; do
    comm=$(cat "$p/comm" 2>/dev/null) && echo "${p#/proc/} $comm"
done >"$out/processes.txt"
step no_process_left sh -c '! grep -E " (moat|sleep|python3|sh)" "$1"' sh "$out/processes.txt"

# Not the root cgroup. Fail closed: in a cgroup nobody delegated, doctor names the missing piece
# and the fix, and no sandbox is created.
mkdir /sys/fs/cgroup/not-delegated
step doctor_fails_closed_undelegated sh -c '
    echo $$ >/sys/fs/cgroup/not-delegated/cgroup.procs || exit 1
    "$1" doctor >"$2" 2>&1 && exit 1
    grep -q "^  why: memory, pids and cpu cgroups: v2: moat.s cgroup is not delegated to it: .*Delegate=yes.*: /sys/fs/cgroup/not-delegated$" "$2"' \
    sh "$build/moat" "$out/doctor_undelegated.out"
# A cgroup marked delegated the way systemd marks a Delegate=yes unit's: the helper moves the
# cgroup's processes (the caller included) into moat-leaf and puts sandboxes under moat.
mkdir /sys/fs/cgroup/delegated
python3 -c 'import os; os.setxattr("/sys/fs/cgroup/delegated", "trusted.delegate", b"1")'
step doctor_in_delegated_cgroup sh -c '
    echo $$ >/sys/fs/cgroup/delegated/cgroup.procs && "$1" doctor' sh "$build/moat"
step delegated_leaf_and_parent sh -c '
    test -d /sys/fs/cgroup/delegated/moat-leaf && test -d /sys/fs/cgroup/delegated/moat &&
    test -z "$(cat /sys/fs/cgroup/delegated/cgroup.procs)" &&
    test -z "$(find /sys/fs/cgroup/delegated/moat -mindepth 1 -type d)"'
echo finished >>"$out/status"
power_off
