// moat serve's templateID driven by the official e2b SDK, 2.51.0 and 2.50.0: a template built
// with `moat template build` (a static busybox root this test makes) is what Sandbox.create(name)
// runs, writable by copy-up; "base" and E2B's default names are the default root; an unknown
// name is a clear 400 (the SDK's error names it).
// Run: node tests/e2b/templates.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { moatBinary, requireSdk, startServe } from './harness.mjs';

const sdks = await requireSdk();
const busybox = '/bin/busybox';  // Debian's busybox-static (scripts/install-deps)

// A busybox root: /bin/sh and the applets the test runs, /bin/bash as the SDK calls it
// (`/bin/bash -l -c CMD`, here busybox's sh), an /etc/motd and a /data everyone may write.
function makeRoot(dir) {
    mkdirSync(path.join(dir, 'bin'), { recursive: true });
    mkdirSync(path.join(dir, 'etc'), { recursive: true });
    mkdirSync(path.join(dir, 'data'), { recursive: true });
    chmodSync(path.join(dir, 'data'), 0o777);
    copyFileSync(busybox, path.join(dir, 'bin/busybox'));
    chmodSync(path.join(dir, 'bin/busybox'), 0o755);
    for (const applet of ['sh', 'ls', 'cat', 'id', 'echo', 'true', 'env', 'stat']) {
        symlinkSync('busybox', path.join(dir, 'bin', applet));
    }
    writeFileSync(path.join(dir, 'bin/bash'), '#!/bin/sh\nexec /bin/sh "$@"\n', { mode: 0o755 });
    writeFileSync(path.join(dir, 'etc/motd'), 'from the template\n');
}

let serve;
let work;
before(async () => {
    if (!existsSync(busybox)) throw new Error(`${busybox} is missing: run scripts/install-deps`);
    work = mkdtempSync(path.join(os.tmpdir(), 'moat-e2b-templates-'));
    const dataDir = path.join(work, 'data');
    makeRoot(path.join(work, 'root'));
    execFileSync(moatBinary, ['template', 'build', 'bb', '--from-dir', path.join(work, 'root')],
        { env: { ...process.env, MOAT_DATA_DIR: dataDir } });
    serve = await startServe({ env: { MOAT_DATA_DIR: dataDir } });
});
after(async () => {
    if (serve) assert.equal(await serve.stop(), 0);
    if (work) rmSync(work, { recursive: true, force: true });
});

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox } = sdk;
    describe(version, () => {
        test('Sandbox.create(name) runs a template of the data directory, writable by copy-up', async () => {
            const sbx = await Sandbox.create('bb', { timeoutMs: 120_000 });
            try {
                const info = await sbx.getInfo();
                assert.equal(info.templateId, 'bb');
                const r = await sbx.commands.run('cat /etc/motd; ls /usr 2>/dev/null || echo no-usr; id -un');
                assert.equal(r.stdout, 'from the template\nno-usr\nuser\n');
                await sbx.files.write('/data/note.txt', 'written through the SDK');
                assert.equal(await sbx.files.read('/data/note.txt'), 'written through the SDK');
                const owner = await sbx.commands.run('stat -c %U /data/note.txt');
                assert.equal(owner.stdout, 'user\n');
                await assert.rejects(sbx.commands.run('echo x > /etc/motd'));
            } finally {
                await sbx.kill();
            }
        });

        test('"base" and E2B\'s default names are the default root; an unknown name is refused, naming it', async () => {
            for (const name of ['base', 'code-interpreter-v1']) {
                const sbx = await Sandbox.create(name, { timeoutMs: 60_000 });
                try {
                    const r = await sbx.commands.run('test -d /usr/bin && echo host-root');
                    assert.equal(r.stdout, 'host-root\n');
                } finally {
                    await sbx.kill();
                }
            }
            await assert.rejects(Sandbox.create('no-such-template', { timeoutMs: 60_000 }),
                (e) => /template 'no-such-template' not found/.test(e.message));
        });
    });
}
