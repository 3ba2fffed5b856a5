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

}  // namespace

std::string_view python_driver_source() {
    return driver;
}

}  // namespace moat
