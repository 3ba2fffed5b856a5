#include "tools/python_driver.hpp"

namespace moat {

namespace {

// Kept small and dependency-free: it runs on whatever python3 the sandbox's root provides (3.8+).
constexpr std::string_view driver = R"PY(
import ast, os, sys, traceback
nonce = sys.argv[1]
number = int(sys.argv[2])
sys.argv = ['']
channel = os.fdopen(os.dup(0), 'rb', buffering=0)
null = os.open('/dev/null', os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
sys.stdin = open(0, 'r', closefd=False)
cells_dir = '/workspace/.cells'
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
    marker = ('\x1emoat-cell-%s %03d %s %s\n' % (nonce, number, status, kind)).encode()
    os.write(1, marker)
    os.write(2, marker)
)PY";

}  // namespace

std::string_view python_driver_source() {
    return driver;
}

std::string python_cell_marker(std::string_view nonce) {
    std::string marker = "\x1emoat-cell-";
    marker += nonce;
    marker += ' ';
    return marker;
}

}  // namespace moat
