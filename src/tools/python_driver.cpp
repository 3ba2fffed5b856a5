#include "tools/python_driver.hpp"

namespace moat {

namespace {

// Kept small and dependency-free: it runs on whatever python3 the sandbox's root provides (3.8+).
constexpr std::string_view driver = R"PY(
import ast, os, select, sys, traceback
number = int(sys.argv[1])
sys.argv = ['']
channel = os.fdopen(os.dup(0), 'rb', buffering=0)
null = os.open('/dev/null', os.O_RDONLY)
os.dup2(null, 0)
os.close(null)

def forward(results, sources, ends, parent):
    # The forwarder: the only writer of the results channel. Frames the cell's output and the
    # driver's end records; a cell's bytes are never read as a record.
    def emit(tag, data):
        record = b'%c%d\n' % (tag, len(data)) + data
        while record:
            record = record[os.write(results, record):]
    def drain(fd):
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return True
            if not data:
                return False
            emit(sources[fd], data)
    for fd in sources:
        os.set_blocking(fd, False)
    pending = b''
    try:
        while sources:
            ready = select.select(list(sources) + ([ends] if ends >= 0 else []), [], [], 0.2)[0]
            for fd in [fd for fd in ready if fd in sources]:
                if not drain(fd):
                    del sources[fd]
            if ends in ready:
                more = os.read(ends, 4096)
                if not more:
                    ends = -1
                pending += more
                while b'\n' in pending:
                    line, pending = pending.split(b'\n', 1)
                    for fd in list(sources):
                        if not drain(fd):
                            del sources[fd]
                    emit(ord('r'), line[:512] + b'\n')
            if os.getppid() != parent:
                for fd in list(sources):
                    drain(fd)
                break
    except OSError:
        pass
    os._exit(0)

out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
ends_r, ends_w = os.pipe()
parent = os.getpid()
if os.fork() == 0:
    for fd in (out_w, err_w, ends_w, channel.fileno()):
        os.close(fd)
    forward(1, {out_r: ord('o'), err_r: ord('e')}, ends_r, parent)
for fd in (out_r, err_r, ends_r):
    os.close(fd)
os.dup2(out_w, 1)
os.dup2(err_w, 2)
os.close(out_w)
os.close(err_w)
sys.stdin = open(0, 'r', closefd=False)
cells_dir = os.path.join(os.getcwd(), '.cells')  # the sandbox's working directory
namespace = {'__name__': '__main__', '__builtins__': __builtins__}

def read_exact(n):
    parts = []
    while n > 0:
        part = channel.read(n)
        if not part:
            raise EOFError
        parts.append(part)
        n -= len(part)
    return b''.join(parts)

def read_cell():
    line = b''
    while not line.endswith(b'\n'):
        c = channel.read(1)
        if not c:
            raise EOFError
        line += c
        if len(line) > 20:
            raise EOFError
    return read_exact(int(line)).decode('utf-8', 'replace')

def report(exc):
    te = traceback.TracebackException.from_exception(exc)
    if isinstance(exc, SyntaxError):
        sys.stderr.write(''.join(te.format_exception_only()))
        return
    def strip(t):
        while t is not None:
            t.stack = traceback.StackSummary.from_list(
                [f for f in t.stack if f.filename != '<string>'])
            t = t.__cause__ or t.__context__
    strip(te)
    sys.stderr.write(''.join(te.format()))

def run(number, code):
    name = '%s/%03d.py' % (cells_dir, number)
    try:
        os.makedirs(cells_dir, exist_ok=True)
        with open(name, 'w', encoding='utf-8') as f:
            f.write(code)
    except OSError:
        name = '<cell %d>' % number
    try:
        tree = ast.parse(code, name)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, 'exec'), namespace)
        if last is not None:
            value = eval(compile(last, name, 'eval'), namespace)
            if value is not None:
                print(repr(value))
        return 'ok', '-'
    except SystemExit as e:
        if e.code is None or e.code == 0:
            return 'ok', '-'
        report(e)
        return 'error', 'SystemExit'
    except BaseException as e:
        report(e)
        return 'error', type(e).__name__

while True:
    try:
        code = read_cell()
    except (EOFError, ValueError):
        break
    number += 1
    status, kind = run(number, code)
    try:
        sys.stdout.flush()
    except Exception:
        pass
    try:
        sys.stderr.flush()
    except Exception:
        pass
    os.write(ends_w, ('%03d %s %s\n' % (number, status, kind)).encode())
)PY";

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
            if len(h) < 2 or h[0] not in b'oer' or not h[1:].isdigit() or len(h) > 24:
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
    if not send(conn, b'go %d %d\n' % (generation, 1 if fresh else 0)):
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
            # The worker stopped the cell (its time limit, its caller) or went away.
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
        # Anything from the worker (or its end) stops the cell.
        try:
            os.read(0, 64)
        except OSError:
            pass
        try:
            conn.sendall(b'k')
        except OSError:
            pass
        inputs = [conn]
    if conn in ready:
        data = conn.recv(65536)
        if not data:
            os._exit(0)
        say(data)
)PY";

}  // namespace

std::string_view python_driver_source() {
    return driver;
}

std::string_view python_resident_source() {
    return resident;
}

std::string_view python_relay_source() {
    return relay;
}

}  // namespace moat
