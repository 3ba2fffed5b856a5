// moat serve's live network rules driven by the official e2b SDK 2.51.0: Sandbox.updateNetwork
// (PUT /sandboxes/{id}/network) narrows a running sandbox's egress and widens it within the
// operator's network (--allow-host a.test --allow-host b.test), which every update stays inside:
// a name past it is refused naming it, {} gives the operator's whole network, allowInternetAccess
// false turns egress off and a later update on again; a sandbox created without network access
// cannot get it. Two HTTP servers on host loopback addresses (127.0.0.x:80, named a.test and
// b.test with --resolve) are the only destinations: nothing leaves the machine.
// Run: node tests/e2b/network.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';

import { requireSdk, startServe } from './harness.mjs';

const sdks = await requireSdk();
const { Sandbox, SandboxNotFoundError } = sdks['e2b 2.51.0'];

// An HTTP server answering `name` on port 80 of a free loopback address.
async function loopbackServer(name) {
    for (let attempt = 0; attempt < 50; ++attempt) {
        const address = `127.0.${Math.floor(Math.random() * 200) + 20}.${Math.floor(Math.random() * 250) + 2}`;
        const server = http.createServer((request, response) => response.end(name));
        const ok = await new Promise((resolve) => {
            server.once('error', () => resolve(false));
            server.listen(80, address, () => resolve(true));
        });
        if (ok) return { server, address };
    }
    throw new Error('no free loopback address for port 80');
}

let serve;
let a;
let b;
before(async () => {
    a = await loopbackServer('A');
    b = await loopbackServer('B');
    serve = await startServe({
        args: ['--allow-host', 'a.test', '--allow-host', 'b.test',
            '--resolve', `a.test=${a.address}`, '--resolve', `b.test=${b.address}`,
            '--allow-address', `${a.address}/32`, '--allow-address', `${b.address}/32`],
    });
});
after(async () => {
    if (serve) await serve.stop();
    a?.server.close();
    b?.server.close();
});

// What the sandbox gets from `host` through its proxy: "A", "B", or the refusal's status.
async function reach(sbx, host) {
    const r = await sbx.commands.run(
        `curl -s --max-time 20 -x http://127.0.0.1:3128 -w ' %{http_code}' http://${host}/ || true`);
    const [body, code] = r.stdout.trim().split(/ (?=\d+$)/);
    return code === '200' ? body : code;
}

const denyAll = ['0.0.0.0/0'];

test('updateNetwork narrows a running sandbox and widens it within the operator\'s network', async () => {
    const sbx = await Sandbox.create({ network: { allowOut: ['a.test'], denyOut: denyAll } });
    try {
        assert.equal(await reach(sbx, 'a.test'), 'A');
        assert.equal(await reach(sbx, 'b.test'), '403');

        await sbx.updateNetwork({ allowOut: ['b.test'], denyOut: denyAll });
        assert.equal(await reach(sbx, 'a.test'), '403');
        assert.equal(await reach(sbx, 'b.test'), 'B');
        const info = await sbx.getInfo();
        assert.deepEqual(info.network?.allowOut, ['b.test']);

        // Omitting every field clears the rules: the operator's whole network.
        await sbx.updateNetwork({});
        assert.equal(await reach(sbx, 'a.test'), 'A');
        assert.equal(await reach(sbx, 'b.test'), 'B');

        // Off, and on again: the sandbox keeps its proxy endpoint meanwhile.
        await sbx.updateNetwork({ allowInternetAccess: false });
        assert.equal(await reach(sbx, 'a.test'), '403');
        assert.equal((await sbx.getInfo()).allowInternetAccess, false);
        await Sandbox.updateNetwork(sbx.sandboxId, { allowOut: ['a.test'], denyOut: denyAll });
        assert.equal(await reach(sbx, 'a.test'), 'A');
    } finally {
        await sbx.kill();
    }
});

test('an update past the operator\'s network is refused naming the host, and changes nothing', async () => {
    const sbx = await Sandbox.create({ network: { allowOut: ['a.test'], denyOut: denyAll } });
    try {
        await assert.rejects(
            sbx.updateNetwork({ allowOut: ['a.test', 'evil.test'], denyOut: denyAll }),
            (e) => /403/.test(e.message) && /evil\.test/.test(e.message) && /outside/.test(e.message));
        await assert.rejects(sbx.updateNetwork({ allowOut: ['py*pi'], denyOut: denyAll }),
            (e) => /400/.test(e.message) && /py\*pi/.test(e.message));
        assert.equal(await reach(sbx, 'a.test'), 'A');
        assert.equal(await reach(sbx, 'b.test'), '403');
    } finally {
        await sbx.kill();
    }
});

test('a sandbox created without network access cannot get it, and an unknown one is 404', async () => {
    const sbx = await Sandbox.create({ allowInternetAccess: false });
    try {
        await assert.rejects(sbx.updateNetwork({}), (e) => /409/.test(e.message) && /network none/.test(e.message));
        // Narrowing what it has (nothing) works.
        await sbx.updateNetwork({ allowInternetAccess: false });
    } finally {
        await sbx.kill();
    }
    await assert.rejects(Sandbox.updateNetwork(sbx.sandboxId, {}), SandboxNotFoundError);
    await assert.rejects(Sandbox.updateNetwork(sbx.sandboxId, {}, { apiKey: 'e2b_' + '0'.repeat(40) }),
        (e) => /401|[Aa]uthentication|API key/.test(e.message));
});
