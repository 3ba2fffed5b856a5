// Drives `moat mcp` with the official MCP TypeScript SDK client, the way Claude Desktop, Cursor
// and other MCP hosts do: spawn the server, talk JSON-RPC over its stdin/stdout, call the tools.
//
//   node tests/mcp/mcp_client_test.mjs build/dev/moat     (ctest runs it; see tests/CMakeLists.txt)
//
// Prints one line per check and exits non-zero at the first failure, after killing the server and
// destroying the sandboxes it created. A watchdog fails the whole run after 240 s. Needs the
// packages pinned in package-lock.json (scripts/install-deps runs `npm ci` here).
// MOAT_MCP_TEST_VERBOSE=1 also prints every call and its result text.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const here = path.dirname(fileURLToPath(import.meta.url));
if (!existsSync(path.join(here, 'node_modules', '@modelcontextprotocol', 'sdk', 'package.json'))) {
    console.error(`${here}/node_modules is missing: run scripts/install-deps (it runs npm ci there)`);
    process.exit(1);
}
if (process.argv.length !== 3) {
    console.error('usage: node mcp_client_test.mjs <path to the moat binary>');
    process.exit(2);
}
// Imported only now, so that a missing node_modules gets the message above.
const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = await import('@modelcontextprotocol/sdk/client/stdio.js');

const moat = path.resolve(process.argv[2]);
const secret = `moat-secret-${randomBytes(16).toString('hex')}`;
const environment = { ...process.env, MOAT_MCP_TEST_SECRET: secret };
const tools = ['list_files', 'list_processes', 'read_file', 'read_process_output', 'run_python',
    'run_shell', 'start_process', 'stop_process', 'write_file'];
const statuses = ['ok', 'error', 'timeout', 'unavailable'];
const runTools = new Set(['run_python', 'run_shell']);
const csv = 'a,b\n1,2\n';
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Host details no result may contain: the secret and where the moat binary lives.
const hostDetails = new Set([secret, moat, realpathSync(moat)]);
const binaryDirectory = path.dirname(realpathSync(moat));
// Its directory too, unless that is a system one or too short to be telling (/tmp, /opt/moat).
if (binaryDirectory.split('/').length > 3 && !binaryDirectory.startsWith('/usr/')) {
    hostDetails.add(binaryDirectory);
}
const seenTexts = [];

function remember(text) {
    seenTexts.push(text);
    for (const detail of hostDetails) {
        assert.ok(!text.includes(detail), `a result reveals a host detail (${detail}): ${text}`);
    }
}

// ---- the server and its sandboxes

let transport;
let client;
let serverExit;  // resolves with {code, signal} when the server process exits
let sandboxesBefore = new Set();

// Every server this test starts labels its sandboxes with this run's label, so that sandboxes of
// other tests running on the host at the same time are not counted.
const runLabel = `moat.test=mcp-client-${randomBytes(6).toString('hex')}`;

async function mcpSandboxes() {
    const { stdout } = await promisify(execFile)(moat, ['ls', '--label', runLabel, '--json'],
        { env: environment, timeout: 30_000 });
    return JSON.parse(stdout).filter((s) => s.labels?.['moat.client'] === 'mcp' &&
        s.labels?.['moat.test'] === runLabel.split('=')[1]).map((s) => s.id);
}

// The sandboxes labelled moat.client=mcp that appeared since this test started its server.
async function newMcpSandboxes() {
    return (await mcpSandboxes()).filter((id) => !sandboxesBefore.has(id));
}

let failing = false;
// Never returns: kills the server, destroys what it left, exits 1.
async function fail(message) {
    if (failing) return new Promise(() => {});  // the first failure is already exiting
    failing = true;
    console.log(`FAILED: ${message}`);
    setTimeout(() => process.exit(1), 30_000).unref();  // cleanup gets 30 s at most
    try {
        if (transport?.pid) process.kill(transport.pid, 'SIGKILL');
    } catch { /* already gone */ }
    try {
        const leftovers = await newMcpSandboxes();
        if (leftovers.length) {
            await promisify(execFile)(moat, ['destroy', ...leftovers], { env: environment, timeout: 25_000 });
        }
    } catch (error) {
        console.log(`cleanup: ${error.message}`);
    }
    process.exit(1);
}

const watchdog = setTimeout(() => fail('watchdog: the test took longer than 240 s'), 240_000);
process.on('unhandledRejection', (error) => fail(`unhandled rejection: ${error?.stack ?? error}`));

// ---- the runner and the tool call helper

let checkNumber = 0;
async function check(name, fn) {
    const started = Date.now();
    checkNumber += 1;
    try {
        await fn();
    } catch (error) {
        console.log(`not ok ${checkNumber} - ${name}`);
        await fail(error?.stack ?? String(error));
    }
    console.log(`ok ${checkNumber} - ${name} (${Date.now() - started} ms)`);
}

// Calls a tool and returns its result object r, after checking the shape every result has: one
// text block holding JSON, isError exactly for moat's own failures (status "unavailable") and
// invalid arguments (error_code "invalid_arguments") -- a failure of the code (an exception, a
// non-zero exit, a timeout) or a missing file is a result, not an MCP tool error -- and
// well-typed fields.
async function call(name, args, options = undefined) {
    let result;
    try {
        result = await client.callTool({ name, arguments: args }, undefined, options);
    } catch (error) {
        remember(String(error?.message));
        throw error;
    }
    assert.equal(result.content?.[0]?.type, 'text', `${name}: the first content block is text`);
    const text = result.content[0].text;
    if (process.env.MOAT_MCP_TEST_VERBOSE) console.log(`    ${name} ${JSON.stringify(args)} -> ${text}`);
    remember(text);
    let r;
    try {
        r = JSON.parse(text);
    } catch {
        assert.fail(`${name}: the result text is not JSON: ${text}`);
    }
    assert.ok(statuses.includes(r.status), `${name}: status ${r.status}`);
    const toolError = r.status === 'unavailable' || r.error_code === 'invalid_arguments';
    assert.equal(result.isError ?? false, toolError, `${name}: isError only for moat's failures and bad arguments: ${text}`);
    if (runTools.has(name) && (r.status === 'ok' || r.status === 'timeout')) {
        assert.equal(typeof r.exit_code, 'number', `${name}: exit_code: ${text}`);
        assert.equal(typeof r.stdout, 'string', `${name}: stdout: ${text}`);
        assert.equal(typeof r.stderr, 'string', `${name}: stderr: ${text}`);
        assert.equal(typeof r.truncated, 'boolean', `${name}: truncated: ${text}`);
        assert.equal(typeof r.duration_ms, 'number', `${name}: duration_ms: ${text}`);
    }
    if (r.notices !== undefined) {
        assert.ok(Array.isArray(r.notices) && r.notices.every((n) => typeof n === 'string'),
            `${name}: notices is an array of strings: ${text}`);
    }
    r.text = text;
    return r;
}

const python = (code, extra = {}) => call('run_python', { code, ...extra });
const shell = (command, extra = {}) => call('run_shell', { command, ...extra });
const mentions = (r, word) => (r.notices ?? []).some((n) => n.toLowerCase().includes(word));

// Host processes whose command line is exactly `argv` (read from the host's /proc).
function hostProcesses(argv) {
    const wanted = argv.join('\0');
    const found = [];
    for (const pid of readdirSync('/proc').filter((name) => /^\d+$/.test(name))) {
        try {
            if (readFileSync(`/proc/${pid}/cmdline`, 'latin1').replace(/\0$/, '') === wanted) found.push(pid);
        } catch { /* exited meanwhile */ }
    }
    return found;
}

// ---- the checks

await check('the server initializes and says it is moat', async () => {
    sandboxesBefore = new Set(await mcpSandboxes());
    transport = new StdioClientTransport({ command: moat, args: ['mcp', '--label', runLabel], env: environment, stderr: 'inherit' });
    client = new Client({ name: 'moat-mcp-client-test', version: '1.0.0' });
    await client.connect(transport);
    // The SDK hides the child; its exit code is what the disconnect check needs.
    const child = transport._process;
    assert.ok(child, 'the SDK transport exposes its child process');
    serverExit = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    assert.equal(client.getServerVersion()?.name, 'moat');
    assert.ok(client.getServerCapabilities()?.tools, 'the server announces tools');
    assert.deepEqual(await client.ping(), {});
});

let pythonDescription = '';
await check('tools/list gives exactly the nine tools, each with an object input schema', async () => {
    const { tools: listed } = await client.listTools();
    remember(JSON.stringify(listed));
    assert.deepEqual(listed.map((t) => t.name).sort(), tools);
    for (const t of listed) assert.equal(t.inputSchema?.type, 'object', `${t.name}: inputSchema.type`);
    pythonDescription = listed.find((t) => t.name === 'run_python').description ?? '';
});

await check("run_python's description names /workspace/out, persistence and the network", async () => {
    assert.ok(pythonDescription.includes('/workspace/out'), pythonDescription);
    assert.ok(pythonDescription.includes('persist'), pythonDescription);
    assert.ok(pythonDescription.includes('network'), pythonDescription);
});

await check("run_python's description says the last expression is shown and figures are saved", async () => {
    assert.ok(pythonDescription.includes('value of the last expression'), pythonDescription);
    assert.ok(pythonDescription.includes('figures are saved automatically as PNG files under /workspace/out'),
        pythonDescription);
});

await check('run_python keeps variables from one cell to the next', async () => {
    assert.equal((await python('x = 41')).status, 'ok');
    const r = await python('print(x + 1)');
    assert.equal(r.status, 'ok', r.text);
    assert.equal(r.stdout, '42\n');
});

let pid = '';
await check('run_python runs every cell in the same interpreter', async () => {
    const first = await python('import os; print(os.getpid())');
    const second = await python('import os; print(os.getpid())');
    assert.equal(first.status, 'ok', first.text);
    assert.match(first.stdout, /^\d+\n$/);
    assert.equal(second.stdout, first.stdout);
    pid = first.stdout;
});

await check("a cell's last expression shows its value", async () => {
    const r = await python('x * 2');
    assert.equal(r.status, 'ok', r.text);
    assert.ok(r.stdout.includes('82'), r.text);
});

await check("a cell's side effect happens exactly once", async () => {
    const r = await python("open('/workspace/count.txt','a').write('x')");
    assert.equal(r.status, 'ok', r.text);
    const count = await shell('wc -c < /workspace/count.txt');
    assert.equal(count.stdout.trim(), '1', count.text);
});

await check('a Python exception is an error with its type and traceback, and state survives it', async () => {
    const r = await python("{'a': 1}['price']");  // call() checks it is not an MCP tool error
    assert.equal(r.status, 'error', r.text);
    assert.equal(r.error_type, 'KeyError', r.text);
    assert.ok(r.traceback?.includes('price'), r.text);
    const after = await python('print(x)');
    assert.equal(after.status, 'ok', after.text);
    assert.equal(after.stdout, '41\n');
});

await check('a cell with a syntax error reports SyntaxError', async () => {
    const r = await python('def f(:\n    pass');
    assert.equal(r.status, 'error', r.text);
    assert.equal(r.error_type, 'SyntaxError', r.text);
});

await check('a cell that shows nothing gets a notice suggesting print', async () => {
    const r = await python('y = 5');
    assert.equal(r.status, 'ok', r.text);
    assert.ok(mentions(r, 'print'), r.text);
});

await check('long output is clamped with a marker', async () => {
    const r = await python("print('x' * 200000)");
    assert.equal(r.status, 'ok', r.text.slice(0, 500));
    assert.ok(r.stdout.length < 7000, `stdout has ${r.stdout.length} characters`);
    assert.ok(r.stdout.includes('characters omitted'), r.stdout.slice(0, 500));
    assert.equal(r.truncated, true, r.text.slice(0, 500));
    assert.ok(r.omitted_chars?.stdout > 190000, JSON.stringify(r.omitted_chars));
});

await check('a cell past its timeout is interrupted and the variables are kept', async () => {
    const r = await python("print('looping')\nwhile True:\n    __import__('time').sleep(0.05)",
        { timeout_seconds: 1 });
    assert.equal(r.status, 'timeout', r.text);
    assert.equal(r.exit_code, 124, r.text);
    assert.equal(r.error_type, 'KeyboardInterrupt', r.text);
    assert.equal(r.stdout, 'looping\n', r.text);
    assert.ok(!mentions(r, 'restart'), r.text);
    const after = await python('print(x)\nimport os; os.getpid()');
    assert.equal(after.stdout, `41\n${pid}`, after.text);
});

await check('a cell past its timeout that ignores the interrupt is killed and the interpreter restarts empty', async () => {
    const r = await python('import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass',
        { timeout_seconds: 1 });
    assert.equal(r.status, 'timeout', r.text);
    assert.equal(r.exit_code, 124, r.text);
    assert.ok(mentions(r, 'restart'), r.text);
    const after = await python('print(x)');
    assert.equal(after.status, 'error', after.text);
    assert.equal(after.error_type, 'NameError', after.text);
    const newPid = await python('import os; print(os.getpid())');
    assert.equal(newPid.status, 'ok', newPid.text);
    assert.notEqual(newPid.stdout, pid);
});

await check('an interpreter that exits is reported and the next cell works', async () => {
    const r = await python('import os; os._exit(3)');
    assert.equal(r.status, 'error', r.text);
    assert.ok(mentions(r, 'restart'), r.text);
    const after = await python("print('alive')");
    assert.equal(after.status, 'ok', after.text);
    assert.equal(after.stdout, 'alive\n');
});

await check('run_shell reports exit code, stdout and stderr separately', async () => {
    const r = await shell('echo hi; echo oops >&2; exit 3');
    assert.equal(r.status, 'error', r.text);
    assert.equal(r.exit_code, 3, r.text);
    assert.equal(r.stdout, 'hi\n');
    assert.equal(r.stderr, 'oops\n');
});

await check('rm -rf / inside the sandbox leaves the sandbox usable', async () => {
    const r = await shell('rm -rf / 2>/dev/null; echo done');
    assert.ok(r.stdout?.includes('done'), r.text);
    const after = await shell('ls /usr/bin | head -1');
    assert.equal(after.status, 'ok', after.text);
    assert.ok(after.stdout.trim().length > 0, after.text);
});

await check('write_file, read_file and list_files work on /workspace', async () => {
    const written = await call('write_file', { path: '/workspace/notes/a.txt', content: 'hello' });
    assert.equal(written.status, 'ok', written.text);
    assert.equal(written.bytes, 5, written.text);
    const read = await call('read_file', { path: '/workspace/notes/a.txt' });
    assert.equal(read.status, 'ok', read.text);
    assert.equal(read.content, 'hello');
    const listed = await call('list_files', { path: '/workspace/notes' });
    assert.equal(listed.status, 'ok', listed.text);
    assert.ok(Array.isArray(listed.entries), listed.text);
    assert.ok(listed.entries.some((e) => e.name === 'a.txt' && e.type === 'file' && e.size === 5), listed.text);
});

await check('reading a missing file is an error naming the path', async () => {
    const r = await call('read_file', { path: '/workspace/missing.txt' });
    assert.equal(r.status, 'error', r.text);
    assert.equal(r.error_code, 'file_not_found', r.text);
    assert.ok(r.message?.includes('/workspace/missing.txt'), r.text);
});

await check('a relative path is relative to /workspace', async () => {
    const r = await call('write_file', { path: 'notes/b.txt', content: 'b' });
    assert.equal(r.status, 'ok', r.text);
    assert.equal(r.path, '/workspace/notes/b.txt', r.text);
});

await check('a path that climbs out of / reveals nothing of the host', async () => {
    const r = await call('read_file', { path: '/etc/../../workspace/notes/a.txt' });
    if (r.status === 'ok') assert.equal(r.content, 'hello', r.text);
});

await check('missing arguments are an error naming the field', async () => {
    const r = await call('run_python', {});  // call() checks that isError is set
    assert.equal(r.status, 'error', r.text);
    assert.equal(r.error_code, 'invalid_arguments', r.text);
    assert.ok(r.message?.includes('code'), r.text);
});

await check('an unknown tool is refused and the server keeps working', async () => {
    try {
        const result = await client.callTool({ name: 'run_java', arguments: { code: '1' } });
        remember(JSON.stringify(result));
        assert.equal(result.isError, true, JSON.stringify(result));
    } catch (error) {
        remember(String(error?.message));  // a JSON-RPC error is fine too
    }
    const r = await shell('echo still here');
    assert.equal(r.stdout, 'still here\n', r.text);
});

await check('files under /workspace/out are listed as artifacts without their bytes', async () => {
    const r = await python("import os; os.makedirs('/workspace/out', exist_ok=True); " +
        "open('/workspace/out/result.csv','w').write('a,b\\n1,2\\n')");
    assert.equal(r.status, 'ok', r.text);
    assert.ok(Array.isArray(r.artifacts), r.text);
    assert.ok(r.artifacts.some((a) => a.path === 'result.csv' && a.size === csv.length &&
        a.media_type === 'text/csv'), r.text);
    assert.ok(!r.text.includes(Buffer.from(csv).toString('base64').replace(/=+$/, '')), r.text);
});

await check('a matplotlib chart is saved as a PNG artifact, listed by path, media type and size', async () => {
    const r = await python("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nprint('drawn')");
    assert.equal(r.status, 'ok', r.text);
    assert.equal(r.stdout, 'drawn\n', r.text);
    assert.equal(r.images?.length, 1, r.text);
    const [image] = r.images;
    assert.match(image.path, /^figure-\d{3}-1\.png$/, r.text);
    assert.equal(image.media_type, 'image/png', r.text);
    assert.ok(r.artifacts.some((a) => a.path === image.path && a.size === image.size), r.text);
    assert.ok(!r.text.includes('iVBOR'), 'no base64 PNG in the text');
    const read = await client.readResource({ uri: `moat://artifacts/${image.path}` });
    const bytes = Buffer.from(read.contents[0].blob, 'base64');
    assert.equal(bytes.length, image.size);
    assert.deepEqual([...bytes.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
});

await check("a DataFrame as a cell's last expression reaches the model as its text table", async () => {
    const r = await python("import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [7, 9]})");
    assert.equal(r.status, 'ok', r.text);
    assert.match(r.stdout, /city\s+n\n0\s+Oslo\s+7\n1\s+Lima\s+9\n/, r.text);
});

await check('artifacts are MCP resources whose bytes come back exactly', async () => {
    const made = await python("open('/workspace/out/blob.bin','wb').write(bytes(range(256)) * 3)");
    assert.equal(made.status, 'ok', made.text);
    const listed = await client.listResources();
    const names = listed.resources.map((r) => r.uri);
    assert.ok(names.includes('moat://artifacts/result.csv'), JSON.stringify(listed));
    const blob = listed.resources.find((r) => r.uri === 'moat://artifacts/blob.bin');
    assert.ok(blob, JSON.stringify(listed));
    assert.equal(blob.mimeType, 'application/octet-stream');
    const read = await client.readResource({ uri: 'moat://artifacts/blob.bin' });
    const bytes = Buffer.from(read.contents[0].blob, 'base64');
    assert.equal(bytes.length, 768);
    for (let i = 0; i < bytes.length; ++i) assert.equal(bytes[i], i % 256, `byte ${i}`);
    const csvRead = await client.readResource({ uri: 'moat://artifacts/result.csv' });
    assert.equal(Buffer.from(csvRead.contents[0].blob, 'base64').toString(), csv);
    await assert.rejects(client.readResource({ uri: 'moat://artifacts/../sales.csv' }));
    await assert.rejects(client.readResource({ uri: 'moat://artifacts/missing.png' }));
});

await check("the sandbox's environment holds nothing of the host's", async () => {
    const r = await shell('env');
    assert.equal(r.status, 'ok', r.text);
    assert.ok(!r.stdout.includes(secret), 'the host secret is visible inside the sandbox');
});

await check('a long call sends progress notifications carrying its latest output', async () => {
    const messages = [];
    const r = await call('run_shell', { command: 'echo step-one; sleep 2.5; echo ok' },
        { onprogress: (p) => { messages.push(p.message ?? ''); }, timeout: 60_000 });
    assert.equal(r.status, 'ok', r.text);
    assert.equal(r.stdout, 'step-one\nok\n');
    assert.ok(messages.length >= 1, 'no progress notification arrived');
    // Sent while the command still slept: its first line, not yet its last.
    assert.ok(messages.some((m) => m.includes('step-one') && !m.includes('ok')), JSON.stringify(messages));
    const cellMessages = [];
    const cell = await call('run_python', { code: "import time\nprint('cell-step')\ntime.sleep(2.5)" },
        { onprogress: (p) => { cellMessages.push(p.message ?? ''); }, timeout: 60_000 });
    assert.equal(cell.stdout, 'cell-step\n', cell.text);
    assert.ok(cellMessages.some((m) => m.includes('cell-step')), JSON.stringify(cellMessages));
    assert.ok(!cellMessages.some((m) => m.includes('moat-cell')), JSON.stringify(cellMessages));
});

const exactBytes = Buffer.concat([Buffer.from('a\r\nb\x07\x1b[1m\r\n'), Buffer.from(Array.from({ length: 256 }, (_, i) => i))]);
await check('read_file and write_file with encoding base64 keep exact bytes', async () => {
    const bytes = exactBytes;
    const written = await call('write_file', { path: 'exact.bin', content: bytes.toString('base64'), encoding: 'base64' });
    assert.equal(written.status, 'ok', written.text);
    assert.equal(written.bytes, bytes.length, written.text);
    const read = await call('read_file', { path: 'exact.bin', encoding: 'base64' });
    assert.equal(read.status, 'ok', read.text);
    assert.equal(read.encoding, 'base64', read.text);
    assert.ok(Buffer.from(read.content, 'base64').equals(bytes), read.text);
    const bad = await call('write_file', { path: 'x.bin', content: '@@', encoding: 'base64' });
    assert.equal(bad.error_code, 'invalid_arguments', bad.text);
});

await check('any file under /workspace is a resource with exact bytes', async () => {
    const { resourceTemplates } = await client.listResourceTemplates();
    assert.ok(resourceTemplates.some((t) => t.uriTemplate === 'moat://workspace/{path}'), JSON.stringify(resourceTemplates));
    const read = await client.readResource({ uri: 'moat://workspace/exact.bin' });
    assert.ok(Buffer.from(read.contents[0].blob, 'base64').equals(exactBytes), JSON.stringify(read));
    await assert.rejects(client.readResource({ uri: 'moat://workspace/../etc/passwd' }));
    await assert.rejects(client.readResource({ uri: 'moat://workspace/missing.txt' }));
});

await check('--tool-prefix renames the tools, only the prefixed names are tools, and --images adds a figure as image content', async () => {
    const prefixedTransport = new StdioClientTransport({ command: moat, args: ['mcp', '--label', runLabel, '--tool-prefix', 'moat_', '--images'], env: environment, stderr: 'inherit' });
    const prefixed = new Client({ name: 'moat-mcp-client-test-prefixed', version: '1.0.0' });
    await prefixed.connect(prefixedTransport);
    try {
        const { tools: listed } = await prefixed.listTools();
        assert.deepEqual(listed.map((t) => t.name).sort(), tools.map((t) => `moat_${t}`));
        const readDescription = listed.find((t) => t.name === 'moat_read_file').description;
        assert.ok(readDescription.includes('moat_run_shell'), readDescription);
        const ran = await prefixed.callTool({ name: 'moat_run_shell', arguments: { command: 'echo prefixed' } });
        remember(ran.content[0].text);
        assert.equal(JSON.parse(ran.content[0].text).stdout, 'prefixed\n');
        const drawn = await prefixed.callTool({ name: 'moat_run_python',
            arguments: { code: 'import matplotlib.pyplot as plt\nplt.plot([2, 1])\nplt.show()' } });
        remember(drawn.content[0].text);
        assert.equal(drawn.content.length, 2, JSON.stringify(drawn.content.map((c) => c.type)));
        assert.equal(drawn.content[1].type, 'image');
        assert.equal(drawn.content[1].mimeType, 'image/png');
        const png = Buffer.from(drawn.content[1].data, 'base64');
        assert.equal(png.length, JSON.parse(drawn.content[0].text).images[0].size);
        assert.equal(png.subarray(1, 4).toString(), 'PNG');
        const bare = await prefixed.callTool({ name: 'run_shell', arguments: { command: 'true' } });
        remember(bare.content[0].text);
        assert.equal(bare.isError, true, JSON.stringify(bare));
    } finally {
        await prefixed.close();
    }
});

await check('cancelling a call kills its process and the session keeps working', async () => {
    const victim = ['sleep', '1001'];
    const controller = new AbortController();
    const started = Date.now();
    const pending = call('run_shell', { command: 'echo $$ > /workspace/victim.pid; exec sleep 1001' },
        { signal: controller.signal });
    pending.catch(() => {});  // awaited below
    while (hostProcesses(victim).length === 0) {
        assert.ok(Date.now() - started < 20_000, 'the sleep never appeared on the host');
        await sleep(100);
    }
    await sleep(Math.max(0, 1000 - (Date.now() - started)));
    controller.abort();
    await assert.rejects(pending);
    const deadline = Date.now() + 5000;
    while (hostProcesses(victim).length > 0) {
        assert.ok(Date.now() < deadline, `still running 5 s after the cancel: ${hostProcesses(victim)}`);
        await sleep(100);
    }
    const r = await shell('kill -0 $(cat /workspace/victim.pid) 2>/dev/null && echo alive || echo gone');
    assert.equal(r.stdout, 'gone\n', r.text);
    const after = await python("print('after cancel')");
    assert.equal(after.stdout, 'after cancel\n', after.text);
});

await check('start_process runs a server that later calls reach, list_processes shows it, stop_process ends it', async () => {
    await call('write_file', { path: 'site/index.txt', content: 'served\n' });
    const started = await call('start_process', { command: 'exec python3 -u -m http.server 8766 --bind 127.0.0.1', cwd: 'site' });
    assert.equal(started.status, 'ok', started.text);
    assert.equal(started.processes.length, 1, started.text);
    const { id } = started.processes[0];
    assert.equal(started.processes[0].running, true, started.text);
    assert.equal(started.processes[0].cwd, '/workspace/site', started.text);
    const fetch = "for i in $(seq 100); do python3 -c \"import urllib.request; " +
        "print(urllib.request.urlopen('http://127.0.0.1:8766/index.txt').read().decode(), end='')\" " +
        '2>/dev/null && exit 0; sleep 0.1; done; exit 1';
    const fetched = await shell(fetch);
    assert.equal(fetched.stdout, 'served\n', fetched.text);
    // A Python cell reaches it too, in a later call.
    const cell = await python("import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:8766/index.txt').status)");
    assert.equal(cell.stdout, '200\n', cell.text);
    const listed = await call('list_processes', {});
    const entry = listed.processes.find((p) => p.id === id);
    assert.ok(entry?.running && entry.command.includes('http.server'), listed.text);
    const output = await call('read_process_output', { id });
    assert.ok(output.stderr.includes('GET /index.txt'), output.text);
    const stopped = await call('stop_process', { id });
    assert.equal(stopped.status, 'ok', stopped.text);
    assert.equal(stopped.processes[0].running, false, stopped.text);
    assert.equal((await call('list_processes', {})).processes.find((p) => p.id === id).running, false);
    const left = await shell("grep -l 'http[.]server' /proc/[0-9]*/cmdline 2>/dev/null | wc -l");
    assert.equal(left.stdout, '0\n', left.text);
    const unknown = await call('stop_process', { id: 999 });
    assert.equal(unknown.error_code, 'invalid_arguments', unknown.text);
});

await check('no result revealed the host secret or the moat binary path', async () => {
    assert.ok(seenTexts.length > 20, `only ${seenTexts.length} results were seen`);
    for (const text of seenTexts) {
        for (const detail of hostDetails) assert.ok(!text.includes(detail), `${detail} in ${text}`);
    }
});

await check('closing the client ends the server with code 0 and its sandboxes', async () => {
    const live = await newMcpSandboxes();
    assert.ok(live.length >= 1, 'no sandbox labelled moat.client=mcp is running before close');
    await client.close();
    const exited = await Promise.race([serverExit, sleep(10_000).then(() => null)]);
    assert.ok(exited, 'the server was still running 10 s after the client closed');
    assert.deepEqual(exited, { code: 0, signal: null });
    const left = await newMcpSandboxes();
    assert.deepEqual(left, [], `sandboxes left after the server exited (there were ${live.length})`);
});

clearTimeout(watchdog);
console.log(`all ${checkNumber} checks passed`);
process.exit(0);
