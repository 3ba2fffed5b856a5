// moat serve's control plane driven by the official e2b SDK, 2.51.0 (v2 endpoints) and 2.50.0
// (v1 create and connect), against a real moat serve on loopback with real sandboxes. Every case
// also checks from the host that the sandboxes it ended are gone (their pid 1 and `moat ls`).
//
//   node --test-reporter=spec tests/e2b/control_plane.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { isAlive, newApiKey, removeDir, requireSdk, runMoat, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();
const current = sdks['e2b 2.51.0'];

// The host's view of a sandbox (`moat ls --json`), or undefined when the host has no record.
async function onHost(id) {
    const listed = await runMoat(['ls', '--json']);
    assert.equal(listed.code, 0, listed.stderr);
    return JSON.parse(listed.stdout).find((s) => s.id === id);
}

// Waits until the host has neither the sandbox's record nor its pid 1.
async function assertGoneFromHost(id, pid) {
    const gone = await waitFor(async () => !(await onHost(id)) && !(pid && isAlive(pid)), 15_000, 100);
    assert.ok(gone, `sandbox ${id} (pid ${pid}) is still on the host`);
}

async function envdHealth(serve, id, token) {
    const headers = { 'E2b-Sandbox-Id': id };
    if (token !== undefined) headers['X-Access-Token'] = token;
    const response = await fetch(`${serve.envd}/health`, { headers });
    return { status: response.status, body: await response.text() };
}

let serve;
before(async () => {
    // The domain makes 49983-<id>.moat.local a name envd serves (the Host form's test below).
    serve = await startServe({ args: ['--domain', 'moat.local'] });
});
after(async () => {
    if (!serve) return;
    const code = await serve.stop();
    assert.equal(code, 0, `moat serve exited ${code}; stderr: ${serve.stderr()}`);
    assert.ok(!serve.stderr().includes(serve.key), 'the API key appeared in the server log');
    assert.deepEqual(serve.descendants(), []);
    removeDir(serve.workDir);
});

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox } = sdk;
    describe(version, () => {
        test('create with metadata, envs and a timeout; getInfo; kill true then false', async () => {
            const sbx = await Sandbox.create({
                metadata: { user: 'a b&c=d', app: version },
                envs: { FOO: 'bar baz' },
                timeoutMs: 120_000,
            });
            assert.match(sbx.sandboxId, /^sb-[0-9a-f]+$/);
            const info = await sbx.getInfo();
            assert.equal(info.sandboxId, sbx.sandboxId);
            assert.equal(info.templateId, 'base');
            assert.deepEqual(info.metadata, { user: 'a b&c=d', app: version });
            assert.equal(info.state, 'running');
            const lifetime = info.endAt.getTime() - info.startedAt.getTime();
            assert.ok(Math.abs(lifetime - 120_000) < 2_000, `lifetime ${lifetime} ms`);
            // The envs reach the sandbox's commands (seen through the host's own CLI).
            // The envs and E2B's layout (user `user`, home and cwd /home/user) reach the
            // sandbox's commands, seen through the host's own CLI.
            const env = await runMoat(['exec', sbx.sandboxId, '--', 'sh', '-c',
                'printf "%s|%s|%s|%s" "$FOO" "$HOME" "$(pwd)" "$(id -un)"']);
            assert.equal(env.code, 0, env.stderr);
            assert.equal(env.stdout, 'bar baz|/home/user|/home/user|user');
            const host = await onHost(sbx.sandboxId);
            assert.ok(host && host.host_pid, 'the host lists the sandbox');
            assert.equal(await sbx.kill(), true);
            assert.equal(await Sandbox.kill(sbx.sandboxId), false);
            await assert.rejects(Sandbox.getInfo(sbx.sandboxId), sdk.NotFoundError);
            assert.equal((await envdHealth(serve, sbx.sandboxId, 'x')).status, 502);
            await assertGoneFromHost(sbx.sandboxId, host.host_pid);
        });

        test('list filters on metadata with a b&c=d exactly, and pages newest first', async () => {
            const tag = `${version}-${Date.now()}`;
            const matching = await Sandbox.create({ metadata: { user: 'a b&c=d', tag } });
            const near = await Sandbox.create({ metadata: { user: 'a b', tag } });
            const third = await Sandbox.create({ metadata: { user: 'a b&c=d', tag } });
            try {
                const found = await Sandbox.list({ query: { metadata: { user: 'a b&c=d', tag } } }).nextItems();
                assert.deepEqual(found.map((s) => s.sandboxId), [third.sandboxId, matching.sandboxId]);
                assert.deepEqual(found[0].metadata, { user: 'a b&c=d', tag });
                const none = await Sandbox.list({ query: { metadata: { user: 'a b&c=e', tag } } }).nextItems();
                assert.deepEqual(none, []);
                const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 2 });
                const first = await pager.nextItems();
                assert.equal(pager.hasNext, true);
                const second = await pager.nextItems();
                assert.equal(pager.hasNext, false);
                assert.deepEqual([...first, ...second].map((s) => s.sandboxId),
                    [third.sandboxId, near.sandboxId, matching.sandboxId]);
                const paused = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems();
                assert.deepEqual(paused, []);
            } finally {
                for (const s of [matching, near, third]) assert.equal(await s.kill(), true);
            }
        });

        test('setTimeout moves the end either way; a connect never shortens it', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 60_000 });
            const endOf = async () => (await sbx.getInfo()).endAt.getTime();
            await sbx.setTimeout(600_000);
            assert.ok(Math.abs(await endOf() - (Date.now() + 600_000)) < 3_000);
            await sbx.setTimeout(30_000);
            const shortened = await endOf();
            assert.ok(Math.abs(shortened - (Date.now() + 30_000)) < 3_000);
            // A shorter connect timeout leaves the end alone; a longer one extends it.
            await Sandbox.connect(sbx.sandboxId, { timeoutMs: 5_000 });
            assert.equal(await endOf(), shortened);
            await Sandbox.connect(sbx.sandboxId, { timeoutMs: 900_000 });
            assert.ok(Math.abs(await endOf() - (Date.now() + 900_000)) < 3_000);
            assert.equal(await sbx.kill(), true);
        });

        test('a sandbox ends at its timeout: list, getInfo, connect and the host all say so', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 2_000, metadata: { ends: version } });
            const host = await onHost(sbx.sandboxId);
            const end = (await sbx.getInfo()).endAt.getTime();
            const listed = async () => (await Sandbox.list({ query: { metadata: { ends: version } } }).nextItems())
                .some((s) => s.sandboxId === sbx.sandboxId);
            assert.equal(await listed(), true);
            const gone = await waitFor(async () => !isAlive(host.host_pid), 15_000, 50);
            assert.ok(gone, 'pid 1 outlived the timeout');
            console.log(`# ${version}: pid 1 gone ${Date.now() - end} ms after endAt`);
            assert.equal(await listed(), false);
            await assert.rejects(Sandbox.getInfo(sbx.sandboxId), sdk.NotFoundError);
            await assert.rejects(Sandbox.connect(sbx.sandboxId), sdk.NotFoundError);
            assert.equal(await Sandbox.kill(sbx.sandboxId), false);
            assert.equal(await sbx.isRunning(), false);
            await assertGoneFromHost(sbx.sandboxId, host.host_pid);
        });

        test('a second client connects to the same sandbox', async () => {
            const sbx = await Sandbox.create({ metadata: { who: 'first' } });
            const other = await Sandbox.connect(sbx.sandboxId);
            assert.equal(other.sandboxId, sbx.sandboxId);
            assert.deepEqual((await other.getInfo()).metadata, { who: 'first' });
            assert.equal(await other.isRunning(), true);
            assert.equal(await other.kill(), true);
            assert.equal(await sbx.isRunning(), false);
            assert.equal(await sbx.kill(), false);
        });

        test('a wrong API key is refused, and no key reaches the log', async () => {
            const wrong = newApiKey();
            await assert.rejects(Sandbox.create({ apiKey: wrong }), sdk.AuthenticationError);
            await assert.rejects(Sandbox.list({ apiKey: wrong }).nextItems(), sdk.AuthenticationError);
            const raw = await fetch(`${serve.api}/v2/sandboxes`, { headers: { 'X-API-Key': wrong } });
            assert.equal(raw.status, 401);
            assert.equal((await raw.json()).code, 401);
            assert.ok(!serve.stderr().includes(wrong));
            assert.ok(!serve.stderr().includes(serve.key));
        });

        // Pause works since issue 36: tests/e2b/pause.test.mjs.
        test('a template other than base is refused with an error naming it', async () => {
            await assert.rejects(Sandbox.create('no-such-template'), /no-such-template/);
        });
    });
}

describe('metrics', () => {
    test('getMetrics shows CPU, memory and disk over time, by range; the list form and bad queries', async () => {
        const { Sandbox } = current;
        const start = new Date();
        const sbx = await Sandbox.create();
        try {
            // 16 MiB on the workspace's disk, and a busy CPU until the readings show both (CPU
            // is a share between two readings, 5 s apart).
            await sbx.commands.run('head -c 16777216 /dev/zero > fill');
            const busy = await sbx.commands.run('exec python3 -c "while True: pass"', { background: true });
            let metrics = [];
            const seen = await waitFor(async () => {
                metrics = await sbx.getMetrics();
                return metrics.some((m) => m.cpuUsedPct > 50) && metrics.at(-1).diskUsed >= 16 << 20;
            }, 30_000, 500);
            await busy.kill();
            assert.ok(seen, `no busy reading with the file: ${JSON.stringify(metrics)}`);
            const last = metrics.at(-1);
            assert.equal(last.cpuCount, 1);
            assert.equal(last.memTotal, 1 << 30);
            assert.ok(last.memUsed > 0 && last.memUsed < last.memTotal);
            assert.ok(last.diskTotal >= last.diskUsed);
            for (const m of metrics) assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m));
            // In time order, within the range asked for; none before the sandbox.
            const times = metrics.map((m) => m.timestamp.getTime());
            assert.deepEqual([...times].sort((a, b) => a - b), times);
            const ranged = await sbx.getMetrics({ start, end: new Date() });
            assert.ok(ranged.length > 0);
            for (const m of ranged) assert.ok(m.timestamp.getTime() >= Math.floor(start.getTime() / 1000) * 1000);
            assert.deepEqual(await sbx.getMetrics({ start: new Date(start - 3_600_000), end: new Date(start - 1_800_000) }), []);

            const headers = { 'X-API-Key': serve.key };
            const listed = await fetch(`${serve.api}/sandboxes/metrics?sandbox_ids=${sbx.sandboxId},sb-unknown`, { headers });
            assert.equal(listed.status, 200);
            const body = await listed.json();
            assert.deepEqual(Object.keys(body.sandboxes), [sbx.sandboxId]);
            assert.equal(body.sandboxes[sbx.sandboxId].memTotal, 1 << 30);
            for (const query of ['', 'sandbox_ids=', 'sandbox_ids=a,a', 'sandbox_ids=a,,b']) {
                const bad = await fetch(`${serve.api}/sandboxes/metrics?${query}`, { headers });
                assert.equal(bad.status, 400, query);
            }
            for (const query of ['start=x', 'end=-1', 'start=20&end=10']) {
                const bad = await fetch(`${serve.api}/sandboxes/${sbx.sandboxId}/metrics?${query}`, { headers });
                assert.equal(bad.status, 400, query);
                assert.match((await bad.json()).message, /start|end/);
            }
            const unknown = await fetch(`${serve.api}/sandboxes/sb-unknown/metrics`, { headers });
            assert.equal(unknown.status, 404);
            const keyless = await fetch(`${serve.api}/sandboxes/${sbx.sandboxId}/metrics`);
            assert.equal(keyless.status, 401);
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });
});

describe('scope', () => {
    test("the application's own sandbox is invisible through serve", async () => {
        const made = await runMoat(['create', '--ttl', '120', '--label', 'who=app']);
        assert.equal(made.code, 0, made.stderr);
        const id = made.stdout.trim().split('\n').pop();
        try {
            const { Sandbox } = current;
            const all = await Sandbox.list().nextItems();
            assert.ok(!all.some((s) => s.sandboxId === id));
            await assert.rejects(Sandbox.getInfo(id), current.NotFoundError);
            await assert.rejects(Sandbox.connect(id), current.NotFoundError);
            assert.equal(await Sandbox.kill(id), false);
            assert.equal((await envdHealth(serve, id, '')).status, 502);
            assert.ok(await onHost(id), 'serve left the application sandbox alone');
        } finally {
            const destroyed = await runMoat(['destroy', id]);
            assert.equal(destroyed.code, 0, destroyed.stderr);
        }
    });

    test('refreshes extend only, the v1 list filters, and bad list queries are 400 naming the field', async () => {
        const { Sandbox } = current;
        const sbx = await Sandbox.create({ timeoutMs: 600_000, metadata: { raw: 'yes' } });
        try {
            const headers = { 'X-API-Key': serve.key, 'Content-Type': 'application/json' };
            const before = (await sbx.getInfo()).endAt.getTime();
            const refreshed = await fetch(`${serve.api}/sandboxes/${sbx.sandboxId}/refreshes`, {
                method: 'POST', headers, body: '{"duration":60}',
            });
            assert.equal(refreshed.status, 204);
            assert.equal((await sbx.getInfo()).endAt.getTime(), before, 'a refresh shortened the end');
            const v1 = await fetch(`${serve.api}/sandboxes?metadata=${encodeURIComponent('raw=yes')}`, { headers });
            assert.equal(v1.status, 200);
            assert.deepEqual((await v1.json()).map((s) => s.sandboxID), [sbx.sandboxId]);
            for (const [query, named] of [['order=sideways', 'order'], ['nextToken=bm9wZQ', 'next token'],
                ['state=frozen', 'frozen'], ['metadata=novalue', 'metadata'], ['limit=abc', 'limit'],
                ['startedAfter=yesterday', 'startedAfter']]) {
                const response = await fetch(`${serve.api}/v2/sandboxes?${query}`, { headers });
                assert.equal(response.status, 400, query);
                const body = await response.json();
                assert.equal(body.code, 400);
                assert.match(body.message, new RegExp(named, 'i'), query);
            }
            const started = (await sbx.getInfo()).startedAt;
            const since = async (query) => (await (await fetch(`${serve.api}/v2/sandboxes?${query}`, { headers })).json())
                .some((s) => s.sandboxID === sbx.sandboxId);
            const earlier = new Date(started.getTime() - 1_000).toISOString();
            const later = new Date(started.getTime() + 1_000).toISOString();
            assert.equal(await since(`startedAfter=${encodeURIComponent(earlier)}`), true);
            assert.equal(await since(`startedAfter=${encodeURIComponent(later)}`), false);
            assert.equal(await since('template=base'), true);
            assert.equal(await since('template=other'), false);
            assert.equal(await since('order=asc&limit=100'), true);
            const missing = await fetch(`${serve.api}/v2/sandboxes/sb-00000000000000000000/connect`, {
                method: 'POST', headers, body: '{}',
            });
            assert.equal(missing.status, 404);
            assert.equal((await missing.json()).code, 404);
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });

    test("envd also finds the sandbox in a 49983-<id>.<domain> Host under --domain, and refuses other Hosts", async () => {
        const sbx = await current.Sandbox.create();
        try {
            const token = (await (await fetch(`${serve.api}/sandboxes/${sbx.sandboxId}`,
                { headers: { 'X-API-Key': serve.key } })).json()).envdAccessToken;
            const { hostname, port } = new URL(serve.envd);
            const get = (host, headers = {}) => new Promise((resolve, reject) => {
                const request = http.get({ hostname, port, path: '/health', headers: { Host: host, ...headers } },
                    (response) => { response.resume(); resolve(response.statusCode); });
                request.on('error', reject);
            });
            assert.equal(await get(`49983-${sbx.sandboxId}.moat.local`, { 'X-Access-Token': token }), 204);
            assert.equal(await get(`49983-${sbx.sandboxId}.moat.local:443`, { 'X-Access-Token': 'wrong' }), 401);
            assert.equal(await get('49983-sb-00000000000000000000.moat.local', { 'X-Access-Token': token }), 502);
            assert.equal(await get('evil.example', { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': token }), 421);
            // Another domain is a DNS-rebinding name, however well-formed.
            assert.equal(await get(`49983-${sbx.sandboxId}.evil.example`, { 'X-Access-Token': token }), 421);
        } finally {
            assert.equal(await sbx.kill(), true);
        }
    });

    test('GET /health answers 200 on the control plane and needs no key', async () => {
        const response = await fetch(`${serve.api}/health`);
        assert.equal(response.status, 200);
        const unsupported = await fetch(`${serve.api}/snapshots`, { headers: { 'X-API-Key': serve.key } });
        assert.equal(unsupported.status, 501);
        assert.match((await unsupported.json()).message, /snapshots/);
        // For one sandbox, an id the server does not hold is 404 before the 501 (as E2B answers
        // a fork of a killed sandbox).
        for (const route of ['snapshots', 'fork']) {
            const unknown = await fetch(`${serve.api}/sandboxes/sb-00000000000000000000/${route}`, {
                method: 'POST', headers: { 'X-API-Key': serve.key },
            });
            assert.equal(unknown.status, 404, route);
        }
    });
});

describe('lifecycle of the server', () => {
    test('after a restart, connect works and the old token still verifies', async () => {
        const first = await startServe({ setEnv: false });
        let second;
        try {
            const options = { apiUrl: first.api, sandboxUrl: first.envd, apiKey: first.key };
            const sbx = await current.Sandbox.create({ ...options, metadata: { keep: 'me' }, timeoutMs: 120_000 });
            const created = await fetch(`${first.api}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-Key': first.key } });
            const token = (await created.json()).envdAccessToken;
            assert.match(token, /^[0-9a-f]{64}$/);
            const host = await onHost(sbx.sandboxId);
            assert.equal(await first.stop(), 0, first.stderr());
            assert.ok(isAlive(host.host_pid), 'the sandbox outlived the server');
            second = await startServe({ setEnv: false, stateDir: first.stateDir, key: first.key, workDir: first.workDir });
            const again = { apiUrl: second.api, sandboxUrl: second.envd, apiKey: second.key };
            const connected = await current.Sandbox.connect(sbx.sandboxId, again);
            assert.deepEqual((await connected.getInfo()).metadata, { keep: 'me' });
            assert.equal((await envdHealth(second, sbx.sandboxId, token)).status, 204);
            assert.equal((await envdHealth(second, sbx.sandboxId, 'f'.repeat(64))).status, 401);
            const older = await sdks['e2b 2.50.0'].Sandbox.connect(sbx.sandboxId, again);
            assert.equal(await older.isRunning(), true);
            assert.equal(await connected.kill(), true);
            await assertGoneFromHost(sbx.sandboxId, host.host_pid);
        } finally {
            if (second) assert.equal(await second.stop(), 0, second.stderr());
            removeDir(first.workDir);
        }
    });

    test('SIGINT or SIGTERM stop it with exit 0, a stalled in-flight request included; after SIGKILL a restart adopts', async () => {
        const first = await startServe({ setEnv: false });
        const options = { apiUrl: first.api, sandboxUrl: first.envd, apiKey: first.key };
        const sbx = await current.Sandbox.create({ ...options, timeoutMs: 120_000 });
        const host = await onHost(sbx.sandboxId);
        // A create whose body never finishes is in flight when the stop comes: the server waits
        // its grace, then closes it.
        const { port } = new URL(first.api);
        const socket = net.connect(Number(port), '127.0.0.1');
        await new Promise((resolve) => socket.on('connect', resolve));
        socket.write(`POST /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nX-API-Key: ${first.key}\r\n` +
            'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"templ');
        const closed = new Promise((resolve) => socket.on('close', resolve));
        socket.on('error', () => {});
        await new Promise((r) => setTimeout(r, 200));
        assert.equal(await first.stop('SIGTERM'), 0, first.stderr());
        await closed;
        assert.ok(isAlive(host.host_pid));
        let second;
        let third;
        try {
            second = await startServe({ setEnv: false, stateDir: first.stateDir, key: first.key, workDir: first.workDir });
            assert.equal(await second.stop('SIGKILL'), 128 + 9);
            assert.ok(isAlive(host.host_pid), 'the sandbox died with a killed server');
            third = await startServe({ setEnv: false, stateDir: first.stateDir, key: first.key, workDir: first.workDir });
            const again = { apiUrl: third.api, sandboxUrl: third.envd, apiKey: third.key };
            const connected = await current.Sandbox.connect(sbx.sandboxId, again);
            assert.equal(await connected.isRunning(), true);
            assert.equal(await connected.kill(), true);
            await assertGoneFromHost(sbx.sandboxId, host.host_pid);
            assert.equal(await third.stop('SIGINT'), 0, third.stderr());
        } finally {
            if (third) await third.stop();
            removeDir(first.workDir);
        }
    });

    test('a sandbox that ended while no server ran is released by the next start', async () => {
        const first = await startServe({ setEnv: false });
        const options = { apiUrl: first.api, sandboxUrl: first.envd, apiKey: first.key };
        const sbx = await current.Sandbox.create({ ...options, timeoutMs: 1_000 });
        const host = await onHost(sbx.sandboxId);
        const sidecar = path.join(first.stateDir, 'sandboxes', `${sbx.sandboxId}.json`);
        assert.ok(existsSync(sidecar));
        assert.equal(await first.stop(), 0, first.stderr());
        assert.ok(await waitFor(() => !isAlive(host.host_pid), 15_000), 'pid 1 outlived its timeout');
        const second = await startServe({ setEnv: false, stateDir: first.stateDir, key: first.key, workDir: first.workDir });
        try {
            await assertGoneFromHost(sbx.sandboxId, host.host_pid);
            assert.ok(!existsSync(sidecar), 'the sidecar record was left behind');
        } finally {
            assert.equal(await second.stop(), 0, second.stderr());
            removeDir(first.workDir);
        }
    });

    test('--destroy-on-exit destroys every sandbox it created, confirmed from the host', async () => {
        const server = await startServe({ setEnv: false, args: ['--destroy-on-exit'] });
        try {
            const options = { apiUrl: server.api, sandboxUrl: server.envd, apiKey: server.key };
            const made = [await current.Sandbox.create(options), await sdks['e2b 2.50.0'].Sandbox.create(options)];
            const hosts = [];
            for (const s of made) hosts.push(await onHost(s.sandboxId));
            assert.equal(await server.stop(), 0, server.stderr());
            for (const [i, s] of made.entries()) {
                assert.equal(await onHost(s.sandboxId), undefined, 'still recorded on the host');
                assert.equal(isAlive(hosts[i].host_pid), false, 'pid 1 still alive');
            }
        } finally {
            removeDir(server.workDir);
        }
    });

    test('--max-sandboxes 2: the third create is the SDK rate-limit error', async () => {
        const server = await startServe({ setEnv: false, args: ['--max-sandboxes', '2'] });
        try {
            const options = { apiUrl: server.api, sandboxUrl: server.envd, apiKey: server.key };
            const a = await current.Sandbox.create(options);
            const b = await sdks['e2b 2.50.0'].Sandbox.create(options);
            await assert.rejects(current.Sandbox.create(options), current.RateLimitError);
            await assert.rejects(sdks['e2b 2.50.0'].Sandbox.create(options), sdks['e2b 2.50.0'].RateLimitError);
            const raw = await fetch(`${server.api}/v2/sandboxes`, {
                method: 'POST', headers: { 'X-API-Key': server.key, 'Content-Type': 'application/json' },
                body: '{"templateID":"base"}',
            });
            assert.equal(raw.status, 429);
            assert.equal(raw.headers.get('retry-after'), null);
            assert.equal(await a.kill(), true);
            const c = await current.Sandbox.create(options);
            for (const s of [b, c]) assert.equal(await s.kill(), true);
            assert.equal(await server.stop(), 0, server.stderr());
            assert.deepEqual(server.descendants(), []);
        } finally {
            removeDir(server.workDir);
        }
    });
});

describe('TLS', () => {
    test('with --tls-cert and --tls-key both listeners speak HTTPS to the SDK', async () => {
        const workDir = mkdtempSync(path.join(os.tmpdir(), 'moat-e2b-tls-'));
        const cert = path.join(workDir, 'cert.pem');
        const key = path.join(workDir, 'key.pem');
        execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1',
            '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1',
            '-keyout', key, '-out', cert], { stdio: 'ignore' });
        const server = await startServe({ setEnv: false, workDir, args: ['--tls-cert', cert, '--tls-key', key] });
        try {
            assert.match(server.api, /^https:\/\/127\.0\.0\.1:\d+$/);
            assert.match(server.envd, /^https:\/\/127\.0\.0\.1:\d+$/);
            // The SDK in a child node that trusts the test certificate (NODE_EXTRA_CA_CERTS is
            // read at start only).
            const script = `
                import { Sandbox } from 'e2b';
                const sbx = await Sandbox.create({ metadata: { over: 'tls' } });
                const info = await sbx.getInfo();
                const running = await sbx.isRunning();
                const killed = await sbx.kill();
                console.log(JSON.stringify({ id: sbx.sandboxId, over: info.metadata.over, running, killed }));`;
            const here = path.dirname(fileURLToPath(import.meta.url));
            const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
                cwd: here, encoding: 'utf8', timeout: 60_000,
                env: { ...process.env, NODE_EXTRA_CA_CERTS: cert, E2B_API_URL: server.api,
                    E2B_SANDBOX_URL: server.envd, E2B_API_KEY: server.key },
            });
            assert.equal(child.status, 0, child.stderr);
            const outcome = JSON.parse(child.stdout.trim().split('\n').pop());
            assert.equal(outcome.over, 'tls');
            assert.equal(outcome.running, true);
            assert.equal(outcome.killed, true);
            // Plain HTTP on a TLS listener gets nowhere.
            await assert.rejects(fetch(server.api.replace('https:', 'http:') + '/health', { signal: AbortSignal.timeout(5_000) }));
            assert.equal(await server.stop(), 0, server.stderr());
            assert.deepEqual(server.descendants(), []);
        } finally {
            await server.stop();
            removeDir(workDir);
        }
    });
});
