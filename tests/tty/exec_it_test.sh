#!/usr/bin/env bash
# `moat exec -it` in a real terminal: a tmux pane runs a host shell, which runs
# `moat exec -it ID -- bash`; the test types into the pane, resizes it, sends Ctrl-C, exits, and
# checks that the pane's terminal is back in cooked mode afterwards, also after a SIGTERM to moat
# and when the sandbox is destroyed from outside mid-session. Every step waits for text in the pane (no fixed sleeps).
# Usage: exec_it_test.sh MOAT_BINARY
set -euo pipefail
moat="$1"
command -v tmux >/dev/null || { echo "SKIPPED: tmux is not installed (scripts/install-deps)"; exit 77; }
if ! "$moat" doctor >/dev/null 2>&1 && [ "${MOAT_REQUIRE_NAMESPACES:-}" != 1 ]; then
    echo "SKIPPED: this host cannot make sandboxes"; exit 77
fi

socket="moat-exec-it-$$"
tm() { tmux -L "$socket" -f /dev/null "$@"; }
id=""
cleanup() {
    tm kill-server 2>/dev/null || true
    [ -z "$id" ] || "$moat" destroy "$id" >/dev/null 2>&1 || true
}
trap cleanup EXIT

fail() {
    echo "FAIL: $*"
    echo "--- pane:"
    tm capture-pane -p -J -S - -t t || true
    exit 1
}

# Waits until the pane shows `text` at least `count` times (default 1), up to 20 s.
wait_for() {
    local text="$1" count="${2:-1}" i
    for ((i = 0; i < 400; i++)); do
        local seen
        seen=$(tm capture-pane -p -J -S - -t t | grep -c -F -- "$text" || true)
        ((seen >= count)) && return 0
        sleep 0.05
    done
    fail "'$text' did not appear $count time(s)"
}

# Sends a line (literally) and Enter.
type_line() { tm send-keys -t t -l -- "$1"; tm send-keys -t t Enter; }

id=$("$moat" create --ttl 600 | tail -n 1)
[ -n "$id" ] || fail "moat create printed no id"

tm new-session -d -s t -x 100 -y 30 "env -i PATH=$PATH TERM=xterm-256color PS1='host\$ ' bash --norc --noprofile"
tm set-option -t t -g window-size manual >/dev/null 2>&1 || true
wait_for 'host$ '
cooked_modes='stty -a | tr " ;" "\n\n" | grep -x -e icanon -e echo -e isig | tr "\n" , ; echo'
type_line "$cooked_modes"
wait_for 'isig,icanon,echo,'

# The session: a prompt of the sandbox's bash.
# (Each prompt is computed, so the host's echo of the command line never matches it.)
type_line "$moat exec -it --env PS1='sbx-\$((6 * 7))\$ ' $id -- bash --norc --noprofile -i"
wait_for 'sbx-42$ '
type_line 'echo typed-$((1 + 1)); test -t 0 && echo tty-$((2 + 2))'
wait_for 'typed-2'
wait_for 'tty-4'
type_line 'stty size'
wait_for '30 100'
tm resize-window -t t -x 120 -y 40
type_line 'stty size'
wait_for '40 120'

# Ctrl-C interrupts the sandbox's sleep, not moat: the same bash answers afterwards.
type_line 'sleep 30; echo SLEPT-$((1 + 1))'
"$moat" exec "$id" -- sh -c 'for i in $(seq 200); do pgrep -x sleep >/dev/null && exit 0; sleep 0.05; done; exit 1' \
    || fail "the sleep never started"
tm send-keys -t t C-c
type_line 'echo after-$((2 + 2))'
wait_for 'after-4'
if tm capture-pane -p -J -S - -t t | grep -q -F 'SLEPT-2'; then fail "Ctrl-C did not interrupt"; fi

# exit: moat exits with the command's code, and the pane's terminal is cooked again.
type_line 'exit 3'
wait_for 'host$ ' 2
type_line 'echo rc-$?'
wait_for 'rc-3'
type_line "$cooked_modes"
wait_for 'isig,icanon,echo,' 2

# SIGTERM to moat mid-session (as a closing window's SIGHUP would be): the session is cancelled,
# the command killed, the terminal restored, and moat exits 128 + 15.
type_line "$moat exec -it --env PS1='term-\$((6 * 7))\$ ' $id -- bash --norc --noprofile -i"
wait_for 'term-42$ '
shell_pid=$(tm list-panes -t t -F '#{pane_pid}')
moat_pid=$(pgrep -P "$shell_pid" | head -n 1)
[ -n "$moat_pid" ] || fail "no moat process below the pane's shell"
kill -TERM "$moat_pid"
wait_for 'host$ ' 3
type_line 'echo rc-$?'
wait_for 'rc-143'
type_line "$cooked_modes"
wait_for 'isig,icanon,echo,' 3

# The sandbox destroyed from outside mid-session: moat ends, the terminal is restored.
type_line "$moat exec -it --env PS1='again-\$((6 * 7))\$ ' $id -- bash --norc --noprofile -i"
wait_for 'again-42$ '
"$moat" destroy "$id" >/dev/null || fail "moat destroy failed"
id=""
wait_for 'host$ ' 4
type_line 'echo "status $(($? + 1000))"'
wait_for 'status 1'
if tm capture-pane -p -J -S - -t t | grep -q -x 'status 1000'; then fail "moat exited 0 after the sandbox went"; fi
type_line "$cooked_modes"
wait_for 'isig,icanon,echo,' 4
echo "PASS"
