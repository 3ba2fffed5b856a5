// moat serve's pause and resume driven by the official e2b SDK 2.51.0, against a real moat serve
// on loopback with real sandboxes: pause, the paused state in listings (filters and pages across
// running and paused), connect and resume, a background process and a Python value kept across
// the pause, autoPause at the timeout, --max-sandboxes counting paused ones.
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
});
