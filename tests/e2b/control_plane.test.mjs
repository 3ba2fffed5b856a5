// moat serve's control plane driven by the official e2b SDK, 2.51.0 (v2 endpoints) and 2.50.0
// (v1 create and connect). Run: node tests/e2b/control_plane.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { isAlive, requireSdk, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();

let serve;
before(async () => {
    serve = await startServe();
});
after(async () => {
    if (serve) await serve.stop();
});

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox } = sdk;
    describe(version, () => {
        test('create with metadata, envs and a timeout, then getInfo and kill', async () => {
            const sbx = await Sandbox.create({
                metadata: { user: 'a b&c=d', app: version },
                envs: { FOO: 'bar' },
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
            assert.equal(await sbx.kill(), true);
            assert.equal(await Sandbox.kill(sbx.sandboxId), false);
        });
    });
}
