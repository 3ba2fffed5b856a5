#include "tools/python_driver.hpp"

namespace moat {

namespace {

// Runs on whatever python3 the sandbox's root provides (3.8+), through IPython when that is
// importable, with the standard library alone otherwise.
constexpr std::string_view driver = R"PY(
import ast, io, os, select, signal, subprocess, sys, traceback
number = int(sys.argv[1])
cells_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.getcwd(), '.cells')
language = sys.argv[3] if len(sys.argv) > 3 else 'python'
sys.argv = ['']
channel = os.fdopen(os.dup(0), 'rb', buffering=0)
null = os.open('/dev/null', os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
os.environ['MPLBACKEND'] = 'Agg'
MAX_REP = 4 << 20
MAX_ERR = 64 << 10

def forward(results, sources, ends, parent, sync, ack):
    # The forwarder: the only writer of the results channel. Frames the cell's output, its
    # structured items and the driver's end records; a cell's bytes are never read as a record.
    # Output is drained before an item or an end record, so each follows what was printed before.
    # The driver waits after each item until the forwarder has passed it on (a byte on `sync`,
    # answered on `ack`), so what the cell prints after an item can never overtake it.
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
    def drain_all(kinds):
        for fd in [fd for fd in sources if sources[fd] in kinds]:
            if not drain(fd):
                del sources[fd]
    for fd in sources:
        os.set_blocking(fd, False)
    pending = b''
    try:
        while sources:
            waits = list(sources) + [fd for fd in (ends, sync) if fd >= 0]
            ready = select.select(waits, [], [], 0.2)[0]
            if any(fd in sources for fd in ready):
                drain_all(b'oe')
                drain_all(b'd')
            if sync >= 0 and sync in ready:
                asked = os.read(sync, 4096)
                if not asked:
                    sync = -1
                else:
                    drain_all(b'oe')
                    drain_all(b'd')
                    os.write(ack, b'a' * len(asked))
            if ends in ready:
                more = os.read(ends, 4096)
                if not more:
                    ends = -1
                pending += more
                while b'\n' in pending:
                    line, pending = pending.split(b'\n', 1)
                    drain_all(b'oe')
                    drain_all(b'd')
                    emit(ord('r'), line[:512] + b'\n')
            if os.getppid() != parent:
                drain_all(b'oed')
                break
    except OSError:
        pass
    os._exit(0)

out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
items_r, items_w = os.pipe()
ends_r, ends_w = os.pipe()
sync_r, sync_w = os.pipe()
ack_r, ack_w = os.pipe()
parent = os.getpid()
if os.fork() == 0:
    for fd in (out_w, err_w, items_w, ends_w, sync_w, ack_r, channel.fileno()):
        os.close(fd)
    forward(1, {out_r: ord('o'), err_r: ord('e'), items_r: ord('d')}, ends_r, parent, sync_r,
            ack_w)
for fd in (out_r, err_r, items_r, ends_r, sync_r, ack_w):
    os.close(fd)
acks_owed = [0]  # acks an interrupted wait left unread
os.dup2(out_w, 1)
os.dup2(err_w, 2)
os.close(out_w)
os.close(err_w)
sys.stdin = open(0, 'r', closefd=False)
if 'MATPLOTLIBRC' not in os.environ and not os.path.exists('/etc/matplotlibrc'):
    # Debian's matplotlib reads its defaults from /etc, which a sandbox's root may not carry.
    if os.path.exists('/usr/share/matplotlib/mpl-data/matplotlibrc'):
        os.environ['MATPLOTLIBRC'] = '/usr/share/matplotlib/mpl-data/matplotlibrc'
os.environ.setdefault('MPLCONFIGDIR', os.path.join(cells_dir, '.matplotlib'))
if 'FONTCONFIG_FILE' not in os.environ and not os.path.exists('/etc/fonts/fonts.conf'):
    # Nor fontconfig's: an empty configuration keeps its complaint out of the first figure's cell
    # (matplotlib draws with its own fonts).
    try:
        os.makedirs(cells_dir, exist_ok=True)
        fonts = os.path.join(cells_dir, '.fonts.conf')
        with open(fonts, 'w') as f:
            f.write('<?xml version="1.0"?>\n<fontconfig></fontconfig>\n')
        os.environ['FONTCONFIG_FILE'] = fonts
    except OSError:
        pass
running = False
error = []
cell_name = ['']

def on_interrupt(signum, frame):
    # The supervisor's interrupt of a cell past its time limit; between cells it is ignored.
    if running:
        raise KeyboardInterrupt

signal.signal(signal.SIGINT, on_interrupt)

def flush():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except Exception:
            pass

def send(data):
    flush()
    while data:
        data = data[os.write(items_w, data):]
    # Wait until the forwarder has passed the item on (see forward()).
    acks_owed[0] += 1
    os.write(sync_w, b's')
    while acks_owed[0] > 0:
        got = os.read(ack_r, acks_owed[0])
        if not got:
            acks_owed[0] = 0
            break
        acks_owed[0] -= len(got)

def is_media_type(t):
    return (isinstance(t, str) and 0 < len(t) < 128 and t.count('/') == 1 and
            not t.startswith('/') and not t.endswith('/') and
            all(c.isascii() and (c.isalnum() or c in '/+-._') for c in t))

def as_bytes(media_type, value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        if media_type in ('image/png', 'image/jpeg', 'image/gif', 'application/pdf'):
            import binascii
            try:
                return binascii.a2b_base64(value)
            except Exception:
                return None
        return value.encode('utf-8', 'replace')
    if media_type == 'application/json' or media_type.endswith('+json'):
        import json
        try:
            return json.dumps(value, default=repr).encode()
        except Exception:
            return None
    return None

def publish(data, main):
    # A display result, its representations cut or dropped at MAX_REP (the host checks again).
    parts = []
    for media_type, value in list(data.items())[:32]:
        raw = as_bytes(media_type, value) if is_media_type(media_type) else None
        if raw is None:
            continue
        kind = media_type.encode()
        if len(raw) <= MAX_REP:
            parts.append(b'+%s %d\n' % (kind, len(raw)) + raw)
        elif media_type == 'text/plain':
            raw = raw[:MAX_REP].decode('utf-8', 'ignore').encode()
            parts.append(b'~%s %d\n' % (kind, len(raw)) + raw)
        else:
            parts.append(b'-%s %d\n' % (kind, len(raw)))
    send(b'R %d %d\n' % (1 if main else 0, len(parts)) + b''.join(parts))

def report(exc):
    # The exception that ended the cell, once, in Python's own format without the frames of the
    # driver or of IPython's machinery.
    if error:
        return
    try:
        te = traceback.TracebackException.from_exception(exc)
        if isinstance(exc, SyntaxError):
            text = ''.join(te.format_exception_only())
        else:
            t = te
            while t is not None:
                t.stack = traceback.StackSummary.from_list(
                    [f for f in t.stack if f.filename != '<string>' and
                     not f.filename.endswith('IPython/core/interactiveshell.py')])
                t = t.__cause__ or t.__context__
            text = ''.join(te.format())
        value = str(exc)
    except BaseException:
        text, value = type(exc).__name__ + '\n', ''
    send_error(type(exc).__name__, value, text)

def send_error(name, value, text):
    error.append(name)
    fields = [s.encode('utf-8', 'replace')[:MAX_ERR] for s in (name, value, text)]
    send(b'E %d %d %d\n' % tuple(len(f) for f in fields) + b''.join(fields))

def figures():
    # matplotlib's open figures as PNG results, then closed: at the end of every cell and on
    # plt.show().
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is None:
        return
    try:
        numbers = plt.get_fignums()
    except Exception:
        return
    for n in numbers:
        try:
            figure = plt.figure(n)
            png = io.BytesIO()
            figure.savefig(png, format='png', bbox_inches='tight')
            publish({'text/plain': repr(figure), 'image/png': png.getvalue()}, False)
        except Exception as e:
            sys.stderr.write('a figure could not be rendered: %s\n' % e)
    try:
        plt.close('all')
    except Exception:
        pass

class PyplotHook:
    # Makes matplotlib.pyplot.show() hand the figures over when pyplot is first imported.
    def find_spec(self, name, path=None, target=None):
        if name != 'matplotlib.pyplot':
            return None
        import importlib.util
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module
        def exec_module(module):
            load(module)
            def show(*args, **kwargs):
                figures()
            show.__doc__ = module.show.__doc__
            module.show = show
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, PyplotHook())

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
    # "<n>\n<code>", or "x<n>\n<JSON: code, env>".
    line = b''
    while not line.endswith(b'\n'):
        c = channel.read(1)
        if not c:
            raise EOFError
        line += c
        if len(line) > 20:
            raise EOFError
    if not line.startswith(b'x'):
        return read_exact(int(line)).decode('utf-8', 'replace'), {}
    import json
    request = json.loads(read_exact(int(line[1:])))
    env = request.get('env') or {}
    return str(request.get('code', '')), {str(k): str(v) for k, v in env.items()}

shell = None
if language == 'python' and os.environ.get('MOAT_PLAIN_PYTHON') != '1':
    try:
        os.makedirs(cells_dir, exist_ok=True)
    except OSError:
        pass
    os.environ.setdefault('IPYTHONDIR', os.path.join(cells_dir, '.ipython'))
    try:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher
        from traitlets.config import Config
    except Exception:
        InteractiveShell = None
    if InteractiveShell is not None:
        class Hook(DisplayHook):
            def start_displayhook(self):
                pass
            def write_output_prompt(self):
                pass
            def write_format_data(self, format_dict, md_dict=None):
                publish(format_dict, True)
            def finish_displayhook(self):
                pass
        class Publisher(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, **kwargs):
                publish(data, False)
            def clear_output(self, wait=False):
                pass
        config = Config()
        config.HistoryManager.enabled = False
        config.InteractiveShell.colors = 'NoColor'
        shell = InteractiveShell.instance(config=config)
        shell.displayhook = Hook(shell=shell, cache_size=shell.cache_size)
        shell.display_trap.hook = shell.displayhook
        shell.display_pub = Publisher(shell=shell)
        shell.compile.get_code_name = lambda raw, transformed, number: cell_name[0]
        shell.system = shell.system_raw  # no pty: stdout and stderr stay apart, as they are
        shell.enable_gui = lambda gui=None: None
        shell.enable_matplotlib = lambda gui=None: (gui, 'agg')
        def on_traceback(etype, value, stb):
            if not (isinstance(value, SystemExit) and value.code in (None, 0)):
                report(value)
        shell._showtraceback = on_traceback

namespace = {'__name__': '__main__', '__builtins__': __builtins__}
count = 0
no_ipython = ('IPython is not installed in this sandbox, so %magic and !command lines cannot '
              'run: use subprocess.run([...]) for commands and os.chdir() for the directory')
representations = (('text/html', '_repr_html_'), ('text/markdown', '_repr_markdown_'),
                   ('image/svg+xml', '_repr_svg_'), ('image/png', '_repr_png_'),
                   ('image/jpeg', '_repr_jpeg_'), ('application/json', '_repr_json_'),
                   ('text/latex', '_repr_latex_'))

def formats(value):
    # What IPython's formatters give, without IPython: the _repr_*_ methods and repr().
    data = {}
    try:
        rich = getattr(value, '_ipython_canary_method_should_not_exist_', None) is None and \
            not isinstance(value, type)
    except Exception:
        rich = False
    if rich:
        for media_type, method in representations:
            try:
                f = getattr(value, method, None)
                made = f() if callable(f) else None
            except Exception:
                continue
            if isinstance(made, tuple):
                made = made[0]
            if made is not None:
                data[media_type] = made
    data['text/plain'] = repr(value)
    return data

def display(*values, **kwargs):
    for value in values:
        publish(formats(value), False)

namespace['display'] = display

def run_plain(name, code):
    global count
    count += 1
    lines = [line for line in code.split('\n') if line.strip() not in ('%matplotlib inline',
                                                                      '%matplotlib')]
    code = '\n'.join(lines)
    try:
        tree = ast.parse(code, name)
    except SyntaxError:
        if any(line.lstrip().startswith(('%', '!')) for line in lines):
            return send_error('UsageError', no_ipython, 'UsageError: ' + no_ipython + '\n')
        raise
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, 'exec'), namespace)
    if last is not None:
        value = eval(compile(last, name, 'eval'), namespace)
        if value is not None and not code.rstrip().endswith(';'):
            namespace['_'] = value
            publish(formats(value), True)

# The javascript context's program: a persistent node process that evaluates each cell in its
# main context (top-level declarations carry over, as in node's REPL), between cells its event
# loop runs. Cells arrive on one descriptor as "<n>\n<JSON {code, name, env}>", and each cell's
# value or error leaves as a JSON line on the other.
node_host = r'''
const vm = require('vm'), fs = require('fs'), util = require('util');
const [codeFd, doneFd] = process.argv.slice(-2).map(Number);
globalThis.require = require;
process.on('SIGINT', () => {});
let pending = Buffer.alloc(0), busy = false;
const reply = (m) => fs.writeSync(doneFd, JSON.stringify(m) + '\n');
const failed = (e) => {
  const error = e instanceof Error ? e : new Error(util.inspect(e));
  reply({ ok: false, name: error.name, value: error.message, stack: String(error.stack) });
};
async function drain() {
  if (busy) return;
  busy = true;
  for (;;) {
    const nl = pending.indexOf(10);
    const size = nl < 0 ? -1 : Number(pending.subarray(0, nl).toString());
    if (nl < 0 || pending.length < nl + 1 + size) break;
    const cell = JSON.parse(pending.subarray(nl + 1, nl + 1 + size).toString());
    pending = pending.subarray(nl + 1 + size);
    const saved = {};
    for (const [k, v] of Object.entries(cell.env || {})) { saved[k] = process.env[k]; process.env[k] = v; }
    try {
      let value = vm.runInThisContext(cell.code, { filename: cell.name, breakOnSigint: true });
      if (value && typeof value.then === 'function') value = await value;
      reply(value === undefined ? { ok: true } : { ok: true, text: util.inspect(value) });
    } catch (e) {
      failed(e);
    }
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
  }
  busy = false;
}
const input = fs.createReadStream(null, { fd: codeFd });
input.on('data', (data) => { pending = Buffer.concat([pending, data]); drain(); });
input.on('end', () => process.exit(0));
'''

hosted = []

def start_hosted():
    # The bash or node process of this context, in a process group of its own (so an interrupt
    # reaches what it runs).
    done_r, done_w = os.pipe()
    if language == 'bash':
        proc = subprocess.Popen(['bash', '--noprofile', '--norc'], stdin=subprocess.PIPE,
                                pass_fds=(done_w,), start_new_session=True)
        feed = proc.stdin
    else:
        code_r, code_w = os.pipe()
        proc = subprocess.Popen(['node', '-e', node_host, '--', str(code_r), str(done_w)],
                                stdin=subprocess.DEVNULL, pass_fds=(code_r, done_w),
                                start_new_session=True)
        os.close(code_r)
        feed = os.fdopen(code_w, 'wb', buffering=0)
    os.close(done_w)
    hosted[:] = [proc, feed, done_r, done_w]

def run_hosted(name, code, env):
    # One cell of bash or javascript; an interrupt goes on to the shell's process group or to
    # node, and the cell's error then says KeyboardInterrupt.
    global count
    if not hosted or hosted[0].poll() is not None:
        start_hosted()
    proc, feed, done_r, done_w = hosted
    count += 1
    if language == 'bash':
        import shlex
        assign = ''.join('%s=%s ' % (k, shlex.quote(v)) for k, v in env.items()
                         if k.isidentifier() and k.isascii())
        line = ("trap 'return 130 2>/dev/null' INT; %s. %s </dev/null; printf '%%d\\n' \"$?\" >&%d; "
                "trap - INT\n" % (assign, shlex.quote(name), done_w)).encode()
    else:
        import json
        payload = json.dumps({'code': code, 'name': name, 'env': env}).encode()
        line = b'%d\n' % len(payload) + payload
    interrupted = False
    answer = b''
    try:
        feed.write(line)
        feed.flush()
        while not answer.endswith(b'\n'):
            try:
                more = os.read(done_r, 65536)
            except KeyboardInterrupt:
                interrupted = True
                try:
                    if language == 'bash':
                        os.killpg(proc.pid, signal.SIGINT)
                    else:
                        os.kill(proc.pid, signal.SIGINT)
                except OSError:
                    pass
                continue
            if not more:
                break
            answer += more
    except OSError:
        answer = b''
    if not answer.endswith(b'\n'):
        del hosted[:]
        return send_error('Exited', 'the %s process ended; the next cell starts a new one' %
                          language, '')
    if interrupted:
        return send_error('KeyboardInterrupt', 'interrupted', 'KeyboardInterrupt\n')
    if language == 'bash':
        status = answer.strip().decode()
        if status != '0':
            send_error('ExitCode', status, 'the cell exited with status %s\n' % status)
        return
    import json
    reply = json.loads(answer)
    if reply.get('ok'):
        if 'text' in reply:
            publish({'text/plain': reply['text']}, True)
        return
    send_error(str(reply.get('name')), str(reply.get('value')), str(reply.get('stack')))

def run(number, code, env):
    global running, count
    name = '%s/%03d.%s' % (cells_dir, number, {'bash': 'sh', 'javascript': 'js'}.get(language, 'py'))
    try:
        os.makedirs(cells_dir, exist_ok=True)
        with open(name, 'w', encoding='utf-8') as f:
            f.write(code)
    except OSError:
        name = '<cell %d>' % number
    del error[:]
    try:
        running = True
        if language != 'python':
            run_hosted(name, code, env)
        elif shell is not None:
            cell_name[0] = name
            count = shell.run_cell(code, store_history=True).execution_count or count
        else:
            run_plain(name, code)
    except SystemExit as e:
        if not (e.code is None or e.code == 0):
            report(e)
    except BaseException as e:
        report(e)
    finally:
        running = False
    figures()
    send(b'C %d\n' % count)
    if error:
        return 'error', error[0]
    return 'ok', '-'

def with_env(env):
    # Sets the cell's variables; returns how to put the environment back after it.
    saved = {}
    for key, value in env.items():
        if key and '=' not in key and '\0' not in key + value:
            saved[key] = os.environ.get(key)
            os.environ[key] = value
    return saved

def restore(saved):
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value

while True:
    try:
        code, env = read_cell()
    except (EOFError, ValueError):
        break
    number += 1
    saved = with_env(env)
    try:
        status, kind = run(number, code, env)
    except BaseException:
        status, kind = 'error', 'KeyboardInterrupt'
    restore(saved)
    flush()
    os.write(ends_w, ('%03d %s %s\n' % (number, status, kind)).encode())
)PY";

}  // namespace

std::string_view python_driver_source() {
    return driver;
}

}  // namespace moat
