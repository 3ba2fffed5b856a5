// The sandbox's resident supervisor of the Python interpreter and the relay that reaches it (see
// python_driver.hpp for the protocol).
#include "tools/python_driver.hpp"

namespace moat {

namespace {

// The interpreter's supervisor: the sandbox's resident (see python_driver.hpp).
constexpr std::string_view resident = R"PY(
import fcntl, json, os, select, signal, socket, subprocess, sys
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
server.listen(256)  # direct connections wait here for their turn
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

cells_dir = os.path.abspath('.cells')
max_contexts = 32

class Context:
    # One interpreter with its own namespace and working directory. '' is the sandbox's default
    # context (the tool layer's): only its interpreters count as generations.
    def __init__(self, language='python', cwd=None):
        self.language = language
        self.cwd = cwd
        self.interp = None
        self.leftover = b''

contexts = {'': Context()}

def start(ctx):
    global generation
    if ctx is contexts.get(''):
        generation += 1
    save()
    ctx.leftover = b''
    ctx.interp = subprocess.Popen([sys.executable, '-u', '-c', driver, str(cells), cells_dir,
                                   ctx.language],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, start_new_session=True, cwd=ctx.cwd)
    for f in (ctx.interp.stdin, ctx.interp.stdout, ctx.interp.stderr):
        os.set_blocking(f.fileno(), False)

def reap(ctx, grace):
    interp = ctx.interp
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
    ctx.interp = None
    if code is None:
        return 128 + 9, 9
    if code < 0:
        return 128 - code, -code
    return code, 0

def stop(ctx):
    if ctx.interp is None:
        return 0, 0
    try:
        os.killpg(ctx.interp.pid, signal.SIGKILL)
    except OSError:
        pass
    return reap(ctx, 5)

def on_path(program):
    if os.path.isabs(program):
        return os.access(program, os.X_OK)
    return any(os.access(os.path.join(d, program), os.X_OK)
               for d in os.environ.get('PATH', '/usr/bin:/bin').split(':') if d)

def answer(conn, ok, text):
    send(conn, (b'ok ' if ok else b'error ') + text.encode('utf-8', 'replace') + b'\n')

def manage(conn, request):
    # The context operations: create, restart, remove, list. One answer line each.
    op = request.get('op')
    ident = request.get('id', '')
    if op == 'create':
        language = str(request.get('language') or 'python')
        language = {'js': 'javascript', 'sh': 'bash'}.get(language, language)
        cwd = request.get('cwd') or None
        program = {'python': sys.executable, 'bash': 'bash', 'javascript': 'node'}.get(language)
        if program is None or not on_path(program):
            return answer(conn, False, 'unsupported language: ' + language[:64] +
                          ('' if program is None else ' (%s is not in this sandbox)' % program))
        if cwd is not None and (len(str(cwd)) > 1024 or not os.path.isdir(cwd)):
            return answer(conn, False, 'no such directory: ' + str(cwd)[:256])
        if len(contexts) >= max_contexts:
            return answer(conn, False, 'at most %d contexts per sandbox' % max_contexts)
        ident = os.urandom(8).hex()
        contexts[ident] = Context(language, cwd)
        return answer(conn, True, ident + ' ' + language)
    if op == 'list':
        listed = [{'id': k, 'language': c.language, 'cwd': c.cwd or os.getcwd()}
                  for k, c in contexts.items()]
        return answer(conn, True, json.dumps(listed))
    ctx = contexts.get(ident)
    if ctx is None:
        return answer(conn, False, 'no such context')
    if op == 'restart':
        stop(ctx)
        return answer(conn, True, ident)
    if op == 'remove' and ident != '':
        stop(ctx)
        del contexts[ident]
        return answer(conn, True, ident)
    answer(conn, False, 'unknown operation')

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

def take_turn(conn):
    # A worker connected directly ("t" before its frame) waits in the queue of connections for
    # its turn, up to its turn wait. When the turn comes it is offered: the worker answers 'y', or
    # has gone (past its turn wait it closes the connection) and its frame runs nothing. A relay
    # took the turn lock before connecting: its frames have no "t".
    if not send(conn, b'turn\n'):
        return False
    try:
        return conn.recv(1) == b'y'
    except OSError:
        return False

def read_head(conn, frame):
    # The next line of a frame (its head, at most 24 bytes) and what arrived after it, or None.
    while b'\n' not in frame:
        more = conn.recv(64)
        if not more or len(frame) > 24:
            return None
        frame += more
    return frame.partition(b'\n')[::2]

def serve(conn):
    global cells, current
    conn.settimeout(30)
    parts = read_head(conn, b'')
    offered = parts is not None and parts[0] == b't'
    if offered:
        parts = read_head(conn, parts[1])
    if parts is None:
        return
    head, body = parts
    if head == b'p':
        # A ping: served once every earlier connection (and any kill it caused) is done.
        send(conn, b'pong\n')
        return
    kind = head[:1] if head[:1] in (b'x', b'c') else b''
    size = int(head[len(kind):])
    parts = [body[:size]]
    got = len(parts[0])
    while got < size:
        more = conn.recv(min(1 << 20, size - got))
        if not more:
            return
        parts.append(more)
        got += len(more)
    if offered and not take_turn(conn):
        return
    request = {}
    if kind:
        try:
            request = json.loads(b''.join(parts))
        except ValueError:
            return
        if kind == b'c':
            return manage(conn, request)
    ctx = contexts.get(request.get('context') or '')
    if ctx is None:
        send(conn, b'unknown\n')
        return
    current = ctx
    interp = ctx.interp
    # The connection stays in timeout mode: sendall on a non-blocking socket gives up (and loses
    # the rest of a record) as soon as the relay falls behind; a relay that takes in nothing for
    # the whole timeout is gone, and the cell with it.
    fresh = interp is None or interp.poll() is not None
    if fresh:
        if interp is not None:
            reap(ctx, 0)
        start(ctx)
        interp = ctx.interp
    cells += 1
    save()
    number = cells
    if not send(conn, b'go %d %d %d\n' % (generation, 1 if fresh else 0, number)):
        stop(ctx)
        return
    pending = head + b'\n' + b''.join(parts)
    records = Records()
    out = interp.stdout.fileno()
    err = interp.stderr.fileno()
    inp = interp.stdin.fileno()
    if ctx.leftover:
        mine, rest = records.feed(ctx.leftover)
        ctx.leftover = b''
        if not send(conn, mine):
            stop(ctx)
            return
        if rest is not None:
            ctx.leftover = rest
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
            stop(ctx)
            end_record(conn, '%03d killed' % number)
            return
        if err in ready_r:
            try:
                data = os.read(err, 65536)
            except BlockingIOError:
                data = None
            if data and not send(conn, b'e%d\n' % len(data) + data):
                stop(ctx)
                return
        if out in ready_r:
            try:
                data = os.read(out, 65536)
            except BlockingIOError:
                continue
            if not data:
                code, sig = reap(ctx, 3)
                end_record(conn, '%03d crashed %d %d' % (number, code, sig))
                return
            mine, rest = records.feed(data)
            if not send(conn, mine) or records.broken:
                stop(ctx)
                return
            if rest is not None:
                ctx.leftover = rest
                return

current = None
while True:
    current = None
    try:
        conn, _ = server.accept()
    except OSError:
        continue
    try:
        serve(conn)
    except Exception:
        if current is not None:
            stop(current)
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
frame = head if head == b'p\n' else head + read_exact(int(head.lstrip(b'xc')))
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
