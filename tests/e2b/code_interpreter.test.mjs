// moat serve's E2B Code Interpreter (port 49999, answered by serve over the sandbox's resident
// interpreter) driven by the official @e2b/code-interpreter 2.8.0: Sandbox.create() with the
// SDK's default template, state across runCode calls, the last expression's text, `!` and `%`
// lines, stdout streamed before the call returns, an exception's name, value and traceback, a
// matplotlib chart as a PNG, a DataFrame as text and HTML, envs that do not leak, contexts with
// their own state and cwd, bash and javascript contexts, a 5 MB print, and a killed sandbox.
// Run: node tests/e2b/code_interpreter.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';

import { requireSdk, startServe } from './harness.mjs';

await requireSdk();
const { Sandbox } = await import('@e2b/code-interpreter');

let serve;
let sbx;
before(async () => {
    serve = await startServe();
    sbx = await Sandbox.create();
});
after(async () => {
    if (sbx) await sbx.kill().catch(() => {});
    if (serve) {
        const code = await serve.stop();
        if (code !== 0) console.error(`moat serve exited ${code}: ${serve.stderr()}`);
        assert.equal(code, 0);
    }
});

function residentKiB(pid) {
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    return Number(/^VmRSS:\s+(\d+) kB/m.exec(status)[1]);
}

test('the default template runs cells that keep their state and show the last expression', async () => {
    assert.equal(Sandbox.defaultTemplate, 'code-interpreter-v1');
    const first = await sbx.runCode('x = 41');
    assert.equal(first.error, undefined);
    assert.equal(first.text, undefined);
    const second = await sbx.runCode('x + 1');
    assert.equal(second.text, '42');
    assert.equal(second.results.length, 1);
    assert.equal(second.results[0].isMainResult, true);
    assert.ok(second.executionCount > first.executionCount, `${second.executionCount} after ${first.executionCount}`);
});

test('! lines and % magics run as in Jupyter', async () => {
    const run = await sbx.runCode('!echo hello from a shell\n%pwd');
    assert.deepEqual(run.logs.stdout, ['hello from a shell\n']);
    assert.equal(run.text, '/home/user');
});

test('stdout reaches onStdout while the cell still runs', async () => {
    const seen = [];
    const started = Date.now();
    const run = await sbx.runCode('import time\nprint("first", flush=True)\ntime.sleep(2)\nprint("second")', {
        onStdout: (m) => seen.push({ line: m.line, at: Date.now() - started }),
    });
    const ended = Date.now() - started;
    assert.deepEqual(seen.map((s) => s.line), ['first\n', 'second\n']);
    assert.ok(seen[0].at < ended - 1000, `first line at ${seen[0].at} ms, the call ended at ${ended} ms`);
    assert.deepEqual(run.logs.stdout, ['first\n', 'second\n']);
});

test('an exception is reported by name, value and traceback, and the next cell runs', async () => {
    const failed = await sbx.runCode('def f():\n    return {}["price"]\nf()');
    assert.equal(failed.error.name, 'KeyError');
    assert.equal(failed.error.value, "'price'");
    assert.match(failed.error.traceback, /Traceback \(most recent call last\)/);
    assert.match(failed.error.traceback, /in f/);
    const next = await sbx.runCode('1 + 1');
    assert.equal(next.error, undefined);
    assert.equal(next.text, '2');
});

test('a matplotlib chart arrives as a PNG', async () => {
    const run = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title("chart")\nplt.show()');
    assert.equal(run.error, undefined);
    const charts = run.results.filter((r) => r.png);
    assert.equal(charts.length, 1);
    const png = Buffer.from(charts[0].png, 'base64');
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    assert.equal(png.subarray(12, 16).toString(), 'IHDR');
    assert.ok(png.readUInt32BE(16) > 100 && png.readUInt32BE(20) > 100, 'a real image size');
    assert.equal(charts[0].isMainResult, false);
});

test('a pandas DataFrame is text and HTML', async (t) => {
    const probe = await sbx.runCode('import importlib.util\nimportlib.util.find_spec("pandas") is not None');
    if (probe.text !== 'True') {
        t.skip('pandas is not in this sandbox (scripts/install-deps installs python3-pandas)');
        return;
    }
    const run = await sbx.runCode('import pandas as pd\npd.DataFrame({"price": [1.5, 2.5], "item": ["a", "b"]})');
    assert.equal(run.error, undefined);
    assert.match(run.text, /price/);
    assert.match(run.text, /item/);
    assert.match(run.results[0].html, /<table/);
});

test('envs apply to one cell and do not leak into the next', async () => {
    const withEnv = await sbx.runCode('import os\nos.environ.get("MOAT_TEST_VAR", "unset")', { envs: { MOAT_TEST_VAR: 'set' } });
    assert.equal(withEnv.text, 'set');
    const after = await sbx.runCode('import os\nos.environ.get("MOAT_TEST_VAR", "unset")');
    assert.equal(after.text, 'unset');
});

test('two contexts keep their own state and working directory', async () => {
    const a = await sbx.createCodeContext({ cwd: '/tmp' });
    const b = await sbx.createCodeContext();
    assert.equal(a.language, 'python');
    assert.equal(a.cwd, '/tmp');
    await sbx.runCode('only_in_a = 1', { context: a });
    assert.equal((await sbx.runCode('"only_in_a" in dir()', { context: b })).text, 'False');
    assert.equal((await sbx.runCode('"only_in_a" in dir()', { context: a })).text, 'True');
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: a })).text, '/tmp');
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: b })).text, '/home/user');
    const listed = (await sbx.listCodeContexts()).map((c) => c.id);
    assert.ok(listed.includes(a.id) && listed.includes(b.id), JSON.stringify(listed));
    await sbx.restartCodeContext(a);
    assert.equal((await sbx.runCode('"only_in_a" in dir()', { context: a })).text, 'False');
    await sbx.removeCodeContext(b);
    assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(b.id));
    await assert.rejects(sbx.runCode('1', { context: b }), /not found|404/i);
});

test('a bash context keeps its working directory and exports', async () => {
    const shell = await sbx.createCodeContext({ language: 'bash' });
    await sbx.runCode('cd /tmp && export GREETING=hi', { context: shell });
    const run = await sbx.runCode('pwd; echo $GREETING', { context: shell });
    assert.deepEqual(run.logs.stdout.join(''), '/tmp\nhi\n');
});

test('a javascript context keeps a variable', async () => {
    await sbx.runCode('var kept = 20', { language: 'js' });
    const run = await sbx.runCode('kept + 22', { language: 'javascript' });
    assert.equal(run.error, undefined);
    assert.equal(run.text, '42');
});

test('a cell past the client\'s timeout is interrupted and its context kept', async () => {
    await sbx.runCode('kept_through_interrupt = 7');
    await assert.rejects(sbx.runCode('import time\nwhile True:\n    time.sleep(0.1)', { timeoutMs: 2000 }),
        (err) => err.name === 'TimeoutError');
    // The server learns of the client's end at its next write, interrupts the cell, and the
    // next cell waits for it (at most 30 s).
    const next = await sbx.runCode('kept_through_interrupt', { timeoutMs: 60_000 });
    assert.equal(next.text, '7');
});

test('a cell that ignores the interrupt is killed, and the next cell says its context restarted', async () => {
    await sbx.runCode('lost_with_the_kill = 1');
    const stubborn = 'import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.1)';
    await assert.rejects(sbx.runCode(stubborn, { timeoutMs: 2000 }), (err) => err.name === 'TimeoutError');
    const next = await sbx.runCode('"lost_with_the_kill" in dir()', { timeoutMs: 60_000 });
    assert.match(next.logs.stderr.join(''), /restarted/);
    assert.equal(next.text, 'False');
});

test('a 5 MB print arrives, serve stays small, and the next cell runs', async () => {
    const before = residentKiB(serve.pid);
    const run = await sbx.runCode('print("x" * (5 * 1024 * 1024))', { timeoutMs: 120_000 });
    const printed = run.logs.stdout.join('');
    const notice = run.logs.stderr.join('');
    const whole = printed.length === 5 * 1024 * 1024 + 1;
    assert.ok(whole || /dropped|truncated|omitted/.test(notice + printed),
        `neither whole (${printed.length} bytes) nor capped with a notice: ${notice.slice(0, 200)}`);
    const grown = residentKiB(serve.pid) - before;
    console.log(`5 MB print: ${printed.length} bytes delivered, serve's RSS grew ${grown} KiB`);
    assert.ok(grown <= 64 * 1024, `serve grew ${grown} KiB`);
    assert.equal((await sbx.runCode('2 + 2')).text, '4');
});

test('bad requests get the answers the SDK maps, and only /execute needs the access token', async () => {
    const headers = { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' };
    const withToken = { ...headers, 'X-Access-Token': sbx.envdAccessToken };
    const post = (path, body, h = withToken) => fetch(serve.envd + path, { method: 'POST', headers: h, body });
    assert.equal((await post('/execute', JSON.stringify({ code: 1 }))).status, 422);
    assert.equal((await post('/execute', 'not json')).status, 422);
    assert.equal((await post('/execute', JSON.stringify({ code: '1', context_id: 'default', language: 'python' }))).status, 400);
    const unknown = await post('/execute', JSON.stringify({ code: '1', context_id: 'no-such-context' }));
    assert.equal(unknown.status, 404);
    assert.match(await unknown.text(), /no-such-context/);
    assert.equal((await post('/execute', JSON.stringify({ code: '1' }), headers)).status, 401);
    const listed = await fetch(serve.envd + '/contexts', { headers });
    assert.equal(listed.status, 200);
    assert.ok((await listed.json()).some((c) => c.id === 'default' && c.language === 'python'));
    assert.equal((await fetch(serve.envd + '/no-such-route', { headers })).status, 404);
});

test('a killed sandbox answers with a clear error', async () => {
    const doomed = await Sandbox.create();
    assert.equal((await doomed.runCode('1')).text, '1');
    await doomed.kill();
    await assert.rejects(doomed.runCode('1'), (err) => {
        assert.equal(err.name, 'TimeoutError');
        assert.match(err.message, /sandbox was not found|timeout/i);
        return true;
    });
});
