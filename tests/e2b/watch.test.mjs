// moat serve's directory watches driven by the official e2b SDK, 2.51.0 and 2.50.0:
// files.watchDir (recursive events in order, a directory made after the watch, a write through
// the SDK reported as envd reports it, a missing directory's and a file's errors, stop() ending
// the stream), and envd's polling RPCs (CreateWatcher, GetWatcherEvents, RemoveWatcher), which the
// JS SDK does not call, by raw Connect JSON over fetch; includeEntry in both. Also prints the watch event latency
// (a write in the sandbox to its event at the SDK), p50/p99, for docs/benchmarks.md.
// Run: node tests/e2b/watch.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { inSandbox, requireSdk, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();

let serve;
before(async () => {
    serve = await startServe();
});
after(async () => {
    if (serve) assert.equal(await serve.stop(), 0);
});

// One unary envd RPC as Connect JSON; {status, body}.
async function envdRpc(sbx, method, message) {
    const response = await fetch(`${serve.envd}/filesystem.Filesystem/${method}`, {
        method: 'POST',
        headers: {
            'Content-Type': 'application/json',
            'Connect-Protocol-Version': '1',
            'E2b-Sandbox-Id': sbx.sandboxId,
            'E2b-Sandbox-Port': '49983',
            'X-Access-Token': sbx.envdAccessToken,
        },
        body: JSON.stringify(message),
    });
    return { status: response.status, body: await response.json() };
}

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox, FilesystemEventType, FileNotFoundError, SandboxError } = sdk;
    describe(version, () => {
        test('watchDir reports recursive events in order, directories made later, SDK writes, and stop() ends it', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                await sbx.files.makeDir('w/old');
                const events = [];
                const handle = await sbx.files.watchDir('w', (e) => { events.push(`${e.type} ${e.name}`); },
                    { recursive: true });
                await inSandbox(sbx, 'cd ~/w && echo a > old/f && mv old/f old/g && chmod 600 old/g && rm old/g');
                assert.ok(await waitFor(() => events.length >= 6, 10_000), events.join('\n'));
                assert.deepEqual(events.slice(0, 6), [
                    `${FilesystemEventType.CREATE} old/f`, `${FilesystemEventType.WRITE} old/f`,
                    `${FilesystemEventType.RENAME} old/f`, `${FilesystemEventType.CREATE} old/g`,
                    `${FilesystemEventType.CHMOD} old/g`, `${FilesystemEventType.REMOVE} old/g`,
                ]);
                // A directory made after the watch, then a file in it: both reported.
                events.length = 0;
                await sbx.files.makeDir('w/new');
                assert.ok(await waitFor(() => events.includes(`${FilesystemEventType.CREATE} new`), 10_000), events.join('\n'));
                await sbx.files.write('w/new/file.txt', 'hello');
                // The SDK's write (moat writes atomically) is reported as envd's in-place write is.
                assert.ok(await waitFor(() => events.includes(`${FilesystemEventType.WRITE} new/file.txt`), 10_000), events.join('\n'));
                assert.ok(!events.some((e) => e.includes('.moat-')), events.join('\n'));
                await handle.stop();
                events.length = 0;
                await inSandbox(sbx, 'touch ~/w/after');
                await new Promise((resolve) => setTimeout(resolve, 500));
                assert.deepEqual(events, []);
            } finally {
                await sbx.kill();
            }
        });

        test('watching a missing directory is FileNotFoundError, a file a SandboxError', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                await assert.rejects(sbx.files.watchDir('missing_dir', () => {}), FileNotFoundError);
                await sbx.files.write('plain.txt', 'x');
                await assert.rejects(sbx.files.watchDir('plain.txt', () => {}), SandboxError);
            } finally {
                await sbx.kill();
            }
        });

        test('includeEntry: each event carries its entry while the path exists, in the stream and the polling RPCs', async () => {
            const { FileType } = sdk;
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                const home = (await sbx.commands.run('echo -n $HOME')).stdout;
                await sbx.files.makeDir('e/sub');
                const events = [];
                const handle = await sbx.files.watchDir('e', (e) => { events.push(e); },
                    { recursive: true, includeEntry: true });
                await sbx.files.write('e/sub/f.txt', 'twelve bytes');
                // The write's event (and so its entry) before the file goes.
                assert.ok(await waitFor(() => events.some((e) => e.type === FilesystemEventType.WRITE), 10_000),
                    JSON.stringify(events));
                await inSandbox(sbx, 'mkdir ~/e/d && rm ~/e/sub/f.txt');
                assert.ok(await waitFor(() => events.some((e) => e.type === FilesystemEventType.REMOVE), 10_000),
                    JSON.stringify(events));
                await handle.stop();
                const write = events.find((e) => e.type === FilesystemEventType.WRITE && e.name === 'sub/f.txt');
                assert.ok(write, JSON.stringify(events));
                assert.ok(write.entry, JSON.stringify(write));
                assert.equal(write.entry.name, 'f.txt');
                assert.equal(write.entry.path, `${home}/e/sub/f.txt`);
                assert.equal(write.entry.type, FileType.FILE);
                assert.equal(write.entry.size, 12);
                const dir = events.find((e) => e.type === FilesystemEventType.CREATE && e.name === 'd');
                assert.ok(dir, JSON.stringify(events));
                if (dir.entry) assert.equal(dir.entry.type, FileType.DIR);
                const removal = events.find((e) => e.type === FilesystemEventType.REMOVE);
                assert.equal(removal.name, 'sub/f.txt');
                assert.equal(removal.entry, undefined, 'a removed path has no entry');

                // The polling RPCs carry the entry as EntryInfo JSON.
                const created = await envdRpc(sbx, 'CreateWatcher', { path: 'e', includeEntry: true });
                assert.equal(created.status, 200, JSON.stringify(created.body));
                await sbx.files.write('e/g.txt', 'x');
                let got = [];
                assert.ok(await waitFor(async () => {
                    const polled = await envdRpc(sbx, 'GetWatcherEvents', { watcherId: created.body.watcherId });
                    got = got.concat(polled.body.events || []);
                    return got.some((e) => e.type === 'EVENT_TYPE_WRITE');
                }, 10_000, 200), JSON.stringify(got));
                const polledWrite = got.find((e) => e.type === 'EVENT_TYPE_WRITE');
                assert.equal(polledWrite.name, 'g.txt');
                assert.equal(polledWrite.entry.path, `${home}/e/g.txt`);
                assert.equal(polledWrite.entry.type, 'FILE_TYPE_FILE');
                assert.equal(polledWrite.entry.size, '1');
            } finally {
                await sbx.kill();
            }
        });

        test('the polling watcher RPCs: create, events in order, remove, unknown ids, missing directory, the cap', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                await sbx.files.makeDir('p');
                const created = await envdRpc(sbx, 'CreateWatcher', { path: 'p', recursive: false });
                assert.equal(created.status, 200, JSON.stringify(created.body));
                const id = created.body.watcherId;
                assert.match(id, /^w[0-9a-f]{24}$/);
                await inSandbox(sbx, 'cd ~/p && echo a > f && rm f');
                let got = [];
                assert.ok(await waitFor(async () => {
                    const polled = await envdRpc(sbx, 'GetWatcherEvents', { watcherId: id });
                    assert.equal(polled.status, 200, JSON.stringify(polled.body));
                    got = got.concat(polled.body.events || []);
                    return got.length >= 3;
                }, 10_000, 200), JSON.stringify(got));
                assert.deepEqual(got, [
                    { name: 'f', type: 'EVENT_TYPE_CREATE' },
                    { name: 'f', type: 'EVENT_TYPE_WRITE' },
                    { name: 'f', type: 'EVENT_TYPE_REMOVE' },
                ]);
                const empty = await envdRpc(sbx, 'GetWatcherEvents', { watcherId: id });
                assert.deepEqual(empty.body, { events: [] });
                const removed = await envdRpc(sbx, 'RemoveWatcher', { watcherId: id });
                assert.equal(removed.status, 200);
                const gone = await envdRpc(sbx, 'GetWatcherEvents', { watcherId: id });
                assert.equal(gone.status, 404);
                assert.equal(gone.body.code, 'not_found');
                const missing = await envdRpc(sbx, 'CreateWatcher', { path: 'nowhere' });
                assert.equal(missing.status, 404);
                assert.equal(missing.body.code, 'not_found');
                // At most 32 watchers per sandbox: one more is resource_exhausted until one goes.
                const ids = [];
                for (let i = 0; i < 32; i++) {
                    const made = await envdRpc(sbx, 'CreateWatcher', { path: 'p' });
                    assert.equal(made.status, 200, JSON.stringify(made.body));
                    ids.push(made.body.watcherId);
                }
                assert.equal(new Set(ids).size, 32);
                const refused = await envdRpc(sbx, 'CreateWatcher', { path: 'p' });
                assert.equal(refused.status, 429);
                assert.equal(refused.body.code, 'resource_exhausted');
                assert.equal((await envdRpc(sbx, 'RemoveWatcher', { watcherId: ids.pop() })).status, 200);
                assert.equal((await envdRpc(sbx, 'CreateWatcher', { path: 'p' })).status, 200);
            } finally {
                await sbx.kill();
            }
        });

        test('watch event latency, a write in the sandbox to its event at the SDK', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                await sbx.files.makeDir('lat');
                // A program in the sandbox writes a file every 20 ms and prints when, by the
                // host's clock (CLOCK_REALTIME is not namespaced); the SDK notes when each first
                // write event arrives, by the same clock.
                const count = 200;
                const events = new Map();
                const handle = await sbx.files.watchDir('lat', (e) => {
                    if (e.type === FilesystemEventType.WRITE && !events.has(e.name)) {
                        events.set(e.name, performance.timeOrigin + performance.now());
                    }
                });
                const out = await inSandbox(sbx, `cd ~/lat && python3 -c "
import time
for i in range(${count}):
    t = time.time_ns()
    with open('f%d' % i, 'w') as f: f.write('x')
    print(i, t)
    time.sleep(0.02)
"`);
                assert.ok(await waitFor(() => events.size >= count, 10_000), `${events.size} of ${count}`);
                const latencies = out.trim().split('\n').map((line) => {
                    const [i, t] = line.split(' ');
                    return events.get(`f${i}`) - Number(t) / 1e6;
                }).sort((x, y) => x - y);
                const p = (q) => latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))];
                console.log(`watch event latency (${version}, ${count} writes): p50 ${p(0.5).toFixed(2)} ms, p99 ${p(0.99).toFixed(2)} ms`);
                await handle.stop();
            } finally {
                await sbx.kill();
            }
        });
    });
}
