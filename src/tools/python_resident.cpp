// The sandbox's resident supervisor of the Python interpreter and the relay that reaches it (see
// python_driver.hpp for the protocol).
#include "tools/python_driver.hpp"

namespace moat {

namespace {

// The interpreter's supervisor: the sandbox's resident (see python_driver.hpp).
constexpr std::string_view resident = R"PY(
import fcntl, os, select, signal, socket, subprocess, sys
driver = sys.argv[1]
home = os.path.join('.cells', '.kernel')
os.makedirs(home, mode=0o700, exist_ok=True)
os.chmod(home, 0o700)
lock = os.open(os.path.join(home, 'lock'), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
try:
    fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    os.write(1, b'running\n')
    os._exit(0)
state_path = os.path.join(home, 'state')
try:
    with open(state_path) as f:
        generation, cells = (int(x) for x in f.read().split()[:2])
except (OSError, ValueError):
    generation, cells = 0, 0
sock_path = os.path.join(home, 'sock')
try:
    os.unlink(sock_path)
except FileNotFoundError:
    pass
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
mask = os.umask(0o077)
server.bind(sock_path)
os.umask(mask)
server.listen(16)
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
os.write(1, b'ready\n')
null = os.open('/dev/null', os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
os.close(null)

def save():
    tmp = state_path + '.tmp'
    with open(tmp, 'w') as f:
        f.write('%d %d\n' % (generation, cells))
    os.replace(tmp, state_path)

interp = None
leftover = b''

def start():
    global interp, generation, leftover
    generation += 1
    save()
    leftover = b''
    interp = subprocess.Popen([sys.executable, '-u', '-c', driver, str(cells)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, start_new_session=True)
    for f in (interp.stdin, interp.stdout, interp.stderr):
        os.set_blocking(f.fileno(), False)

def reap(grace):
    global interp
    try:
        interp.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    code = interp.returncode
    for f in (interp.stdin, interp.stdout, interp.stderr):
        try:
            f.close()
        except OSError:
            pass
    interp = None
    if code is None:
        return 128 + 9, 9
    if code < 0:
        return 128 - code, -code
    return code, 0

def stop():
    try:
        os.killpg(interp.pid, signal.SIGKILL)
    except OSError:
        pass
    return reap(5)

def send(conn, data):
    try:
        conn.sendall(data)
        return True
    except OSError:
        return False

def end_record(conn, text):
    line = text.encode() + b'\n'
    send(conn, b'r%d\n' % len(line) + line)

class Records:
    # Finds the end record in the driver's results channel: the cell's output is forwarded as it
    # is, what follows the end record stays for the next cell.
    def __init__(self):
        self.header = b''
        self.skip = 0
        self.tag = 0
        self.broken = False
    def feed(self, data):
        # Returns (bytes of this cell, rest after its end or None).
        i = 0
        while i < len(data):
            if self.skip:
                n = min(self.skip, len(data) - i)
                i += n
                self.skip -= n
                if self.skip == 0 and self.tag == ord('r'):
                    return data[:i], data[i:]
                continue
            nl = data.find(b'\n', i)
            if nl < 0:
                self.header += data[i:]
                if len(self.header) > 24:
                    self.broken = True
                return data, None
            self.header += data[i:nl]
            i = nl + 1
            h = self.header
            self.header = b''
            if len(h) < 2 or h[0] not in b'oedr' or not h[1:].isdigit() or len(h) > 24:
                self.broken = True
                return data, None
            self.tag = h[0]
            self.skip = int(h[1:])
            if self.skip == 0 and self.tag == ord('r'):
                return data[:i], data[i:]
        return data, None

def serve(conn):
    global cells, leftover
    conn.settimeout(30)
    frame = b''
    while b'\n' not in frame:
        more = conn.recv(64)
        if not more or len(frame) > 24:
            return
        frame += more
    head, _, body = frame.partition(b'\n')
    if head == b'p':
        # A ping: served once every earlier connection (and any kill it caused) is done.
        send(conn, b'pong\n')
        return
    size = int(head)
    parts = [body]
    got = len(body)
    while got < size:
        more = conn.recv(min(1 << 20, size - got))
        if not more:
            return
        parts.append(more)
        got += len(more)
    # The connection stays in timeout mode: sendall on a non-blocking socket gives up (and loses
    # the rest of a record) as soon as the relay falls behind; a relay that takes in nothing for
    # the whole timeout is gone, and the cell with it.
    fresh = interp is None or interp.poll() is not None
    if fresh:
        if interp is not None:
            reap(0)
        start()
    cells += 1
    save()
    number = cells
    if not send(conn, b'go %d %d %d\n' % (generation, 1 if fresh else 0, number)):
        stop()
        return
    pending = head + b'\n' + b''.join(parts)
    records = Records()
    out = interp.stdout.fileno()
    err = interp.stderr.fileno()
    inp = interp.stdin.fileno()
    if leftover:
        mine, rest = records.feed(leftover)
        leftover = b''
        if not send(conn, mine):
            stop()
            return
        if rest is not None:
            leftover = rest
            return
    while True:
        writers = [inp] if pending else []
        ready_r, ready_w, _ = select.select([conn, out, err], writers, [])
        if inp in ready_w:
            try:
                pending = pending[os.write(inp, pending[:65536]):]
            except BlockingIOError:
                pass
            except OSError:
                pending = b''
        if conn in ready_r:
            try:
                asked = conn.recv(16)
            except OSError:
                asked = b''
            if asked and not asked.strip(b'i'):
                # The cell is past its time limit: KeyboardInterrupt in it, the state kept.
                try:
                    os.kill(interp.pid, signal.SIGINT)
                except OSError:
                    pass
                continue
            # The worker stopped the cell (its caller, or its time limit once the interrupt did
            # not end it) or went away.
            stop()
            end_record(conn, '%03d killed' % number)
            return
        if err in ready_r:
            try:
                data = os.read(err, 65536)
            except BlockingIOError:
                data = None
            if data and not send(conn, b'e%d\n' % len(data) + data):
                stop()
                return
        if out in ready_r:
            try:
                data = os.read(out, 65536)
            except BlockingIOError:
                continue
            if not data:
                code, sig = reap(3)
                end_record(conn, '%03d crashed %d %d' % (number, code, sig))
                return
            mine, rest = records.feed(data)
            if not send(conn, mine) or records.broken:
                stop()
                return
            if rest is not None:
                leftover = rest
                return

while True:
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    try:
        serve(conn)
    except Exception:
        if interp is not None:
            stop()
    try:
        conn.close()
    except OSError:
        pass
)PY";

// The relay: one per cell, started by whichever worker holds the turn.
constexpr std::string_view relay = R"PY(
import _socket, fcntl, os, select, sys, time
home = os.path.join('.cells', '.kernel')
wait = int(sys.argv[1]) / 1000.0
def say(data):
    while data:
        data = data[os.write(1, data):]
def read_exact(n):
    parts = []
    while n > 0:
        part = os.read(0, min(n, 1 << 20))
        if not part:
            os._exit(2)
        parts.append(part)
        n -= len(part)
    return b''.join(parts)
head = b''
while not head.endswith(b'\n'):
    c = os.read(0, 1)
    if not c or len(head) > 24:
        os._exit(2)
    head += c
frame = head if head == b'p\n' else head + read_exact(int(head))
try:
    turn = os.open(os.path.join(home, 'turn'), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
except OSError:
    say(b'none\n')
    os._exit(0)
give_up = time.monotonic() + wait
while True:
    try:
        fcntl.lockf(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except OSError:
        if time.monotonic() >= give_up:
            say(b'busy\n')
            os._exit(0)
        time.sleep(0.01)
conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # not socket: its import costs
try:
    conn.connect(os.path.join(home, 'sock'))
except OSError:
    say(b'none\n')
    os._exit(0)
conn.sendall(frame)
inputs = [conn, 0]
while True:
    ready = select.select(inputs, [], [])[0]
    if 0 in ready:
        # The worker's 'i' interrupts the cell; anything else (or its end) stops it.
        try:
            asked = os.read(0, 64)
        except OSError:
            asked = b''
        try:
            conn.sendall(asked or b'k')
        except OSError:
            pass
        if not asked:
            inputs = [conn]
    if conn in ready:
        data = conn.recv(65536)
        if not data:
            os._exit(0)
        say(data)
)PY";

}  // namespace

std::string_view python_resident_source() {
    return resident;
}

std::string_view python_relay_source() {
    return relay;
}

}  // namespace moat
