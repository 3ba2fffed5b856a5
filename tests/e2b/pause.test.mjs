// moat serve's pause and resume driven by the official e2b SDK 2.51.0, against a real moat serve
// on loopback with real sandboxes: pause, the paused state in listings (filters and pages across
// running and paused), connect and resume, a background process and a Python value kept across
// the pause, autoPause at the timeout, --max-sandboxes counting paused ones, and autoResume:
// traffic to a paused sandbox (a port request, a command) resumes it, without it the paused
// sandbox is answered as gone.
//
//   node --test-reporter=spec tests/e2b/pause.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { removeDir, requireSdk, runMoat, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();
const { Sandbox } = sdks['e2b 2.51.0'];

async function onHost(id) {
    const listed = await runMoat(['ls', '--json']);
    assert.equal(listed.code, 0, listed.stderr);
    return JSON.parse(listed.stdout).find((s) => s.id === id);
}

// GET / of a sandbox's port through moat serve's port proxy (the E2b-Sandbox-Id form); never
// waits more than 15 s.
async function portGet(id, port) {
    const res = await fetch(serve.envd + '/', {
        headers: { 'E2b-Sandbox-Id': id, 'E2b-Sandbox-Port': String(port) },
        signal: AbortSignal.timeout(15_000),
    });
    return { status: res.status, body: await res.text() };
}

let serve;
before(async () => {
    serve = await startServe({ args: ['--max-sandboxes', '3'] });
});
after(async () => {
    if (!serve) return;
    const code = await serve.stop();
    assert.equal(code, 0, `moat serve exited ${code}; stderr: ${serve.stderr()}`);
    assert.deepEqual(serve.descendants(), []);
    removeDir(serve.workDir);
});

describe('pause', () => {
    test('pause keeps a background process and a Python value; connect resumes', async () => {
        const sbx = await Sandbox.create({ timeoutMs: 60_000 });
        try {
            const keeper = 'python3 -c \'import os,time\nvalue="kept-%d" % os.getpid()\n' +
                'open("/tmp/value","w").write(value)\nwhile True:\n' +
                '    time.sleep(0.1)\n    open("/tmp/seen","w").write(value)\'';
            await sbx.commands.run(keeper, { background: true, timeoutMs: 0 });
            assert.ok(await waitFor(async () =>
                (await sbx.commands.run('cat /tmp/value || true')).stdout.startsWith('kept-'), 10_000, 100));
            const value = (await sbx.commands.run('cat /tmp/value')).stdout;

            assert.equal(await sbx.pause(), true);
            assert.equal(await sbx.isRunning(), false);
            assert.equal((await onHost(sbx.sandboxId)).state, 'paused');
            assert.equal((await sbx.getInfo()).state, 'paused');
            // Pausing a paused sandbox is a conflict (409), which the SDK reports as false.
            assert.equal(await sbx.pause(), false);

            const resumed = await Sandbox.connect(sbx.sandboxId);
            assert.equal(await resumed.isRunning(), true);
            assert.equal((await resumed.getInfo()).state, 'running');
            // The same process runs on, with its value.
            await resumed.commands.run('rm -f /tmp/seen');
            assert.ok(await waitFor(async () =>
                (await resumed.commands.run('cat /tmp/seen || true')).stdout === value, 10_000, 100));
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });

    test('list shows paused sandboxes, filters by state and pages across both', async () => {
        const tag = `pause-${Date.now()}`;
        const running = await Sandbox.create({ metadata: { tag } });
        const paused = await Sandbox.create({ metadata: { tag } });
        try {
            await paused.pause();
            const onlyPaused = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems();
            assert.deepEqual(onlyPaused.map((s) => [s.sandboxId, s.state]), [[paused.sandboxId, 'paused']]);
            const onlyRunning = await Sandbox.list({ query: { metadata: { tag }, state: ['running'] } }).nextItems();
            assert.deepEqual(onlyRunning.map((s) => s.sandboxId), [running.sandboxId]);
            const pager = Sandbox.list({ limit: 1, query: { metadata: { tag }, state: ['running', 'paused'] } });
            const first = await pager.nextItems();
            assert.equal(pager.hasNext, true);
            const second = await pager.nextItems();
            assert.equal(pager.hasNext, false);
            assert.deepEqual([...first, ...second].map((s) => [s.sandboxId, s.state]),
                [[paused.sandboxId, 'paused'], [running.sandboxId, 'running']]);
            // Paused sandboxes count against --max-sandboxes (3 here).
            const third = await Sandbox.create({ metadata: { tag } });
            try {
                await assert.rejects(Sandbox.create({ metadata: { tag } }), /max-sandboxes|429|at most/);
            } finally {
                assert.equal(await third.kill(), true);
            }
            // A paused sandbox can be killed.
            assert.equal(await paused.kill(), true);
        } finally {
            await running.kill();
            await paused.kill();
        }
    });

    test('autoPause pauses at the timeout instead of killing, and connect resumes', async () => {
        const sbx = await Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } });
        try {
            await sbx.commands.run('echo kept > /tmp/mark');
            const pausedAtEnd = await waitFor(async () => (await sbx.getInfo()).state === 'paused', 15_000, 200);
            assert.ok(pausedAtEnd, 'the sandbox was not paused at its timeout');
            assert.equal(await sbx.isRunning(), false);
            const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 });
            assert.equal((await resumed.commands.run('cat /tmp/mark')).stdout, 'kept\n');
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });

    test('autoResume: a port request and a command resume a paused sandbox', async () => {
        const sbx = await Sandbox.create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true } });
        try {
            assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true });
            await sbx.commands.run('python3 -m http.server 8000', { background: true, timeoutMs: 0 });
            assert.ok(await waitFor(async () => (await sbx.getInfo()).state === 'paused', 15_000, 200),
                'the sandbox was not paused at its timeout');
            // The first request resumes it; until the server listens the port answers 502.
            let res;
            assert.ok(await waitFor(async () => {
                res = await portGet(sbx.sandboxId, 8000);
                return res.status === 200;
            }, 20_000, 100), `the port answered ${res && res.status}`);
            let info = await sbx.getInfo();
            assert.equal(info.state, 'running');
            // Its timeout runs again: the create's, at least 5 minutes (as E2B).
            assert.ok(info.endAt.getTime() > Date.now() + 240_000, `endAt ${info.endAt.toISOString()}`);

            // Paused again: a command resumes it, and two requests at once both get through.
            assert.equal(await sbx.pause(), true);
            assert.equal((await sbx.commands.run('echo awake')).stdout, 'awake\n');
            assert.equal((await sbx.getInfo()).state, 'running');
            assert.equal(await sbx.pause(), true);
            const both = await Promise.all([portGet(sbx.sandboxId, 8000), portGet(sbx.sandboxId, 8000)]);
            assert.deepEqual(both.map((r) => r.status), [200, 200]);
            info = await sbx.getInfo();
            assert.equal(info.state, 'running');
            assert.equal(await sbx.isRunning(), true);
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });

    test('without autoResume a paused sandbox answers as gone, at once', async () => {
        const sbx = await Sandbox.create({ timeoutMs: 60_000 });
        try {
            assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'kill', autoResume: false });
            await sbx.commands.run('python3 -m http.server 8000', { background: true, timeoutMs: 0 });
            assert.ok(await waitFor(async () => (await portGet(sbx.sandboxId, 8000)).status === 200, 20_000, 100));
            assert.equal(await sbx.pause(), true);
            const res = await portGet(sbx.sandboxId, 8000);
            assert.equal(res.status, 502);
            assert.deepEqual(JSON.parse(res.body),
                { sandboxId: sbx.sandboxId, message: 'The sandbox was not found', code: 502 });
            await assert.rejects(sbx.commands.run('echo awake', { requestTimeoutMs: 10_000 }));
            assert.equal((await sbx.getInfo()).state, 'paused');
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });
});
