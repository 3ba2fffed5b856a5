// The sandbox's root and sudo under moat serve, driven by the official e2b SDK, 2.51.0 and 2.50.0:
// commands as user root (uid 0, root's exact capability set), files written and read as root
// (root-owned, in /root, which the sandbox's user cannot change), signed URLs for root, sudo
// (exit code, stdin, the command-scoped variables it does not see), and what stays closed to root
// (pid 1's /proc files, raw sockets, mounts).
// Run: node tests/e2b/root.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { requireSdk, startServe } from './harness.mjs';

const sdks = await requireSdk();
const serve = await startServe();
after(async () => assert.equal(await serve.stop(), 0));

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox, CommandExitError } = sdk;
    describe(version, () => {
        let sbx;
        before(async () => {
            sbx = await Sandbox.create({ timeoutMs: 300_000 });
        });
        after(async () => {
            if (sbx) await sbx.kill();
        });

        test('commands run as root with root\'s environment and capabilities', async () => {
            const id = await sbx.commands.run('id -u; id -g; echo $USER $HOME; pwd', { user: 'root' });
            assert.equal(id.stdout, '0\n0\nroot /root\n/home/user\n');
            const caps = await sbx.commands.run('grep -E "^Cap(Eff|Bnd|Amb)" /proc/self/status', { user: 'root' });
            assert.equal(caps.stdout, 'CapEff:\t00000000000005fb\nCapBnd:\t00000000000005fb\nCapAmb:\t0000000000000000\n');
            const user = await sbx.commands.run('id -u; grep CapEff /proc/self/status');
            assert.equal(user.stdout, '1000\nCapEff:\t0000000000000000\n');
            // cwd "~" is root's home for root.
            const home = await sbx.commands.run('pwd', { user: 'root', cwd: '~' });
            assert.equal(home.stdout, '/root\n');
            // A background command as root, and another user refused.
            const handle = await sbx.commands.run('sleep 0.2; id -u', { user: 'root', background: true });
            assert.equal((await handle.wait()).stdout, '0\n');
            await assert.rejects(sbx.commands.run('id', { user: 'nobody' }), sdk.AuthenticationError);
        });

        test('root owns what it writes, and the user cannot change it', async () => {
            const info = await sbx.files.write('hello.txt', 'hello world', { user: 'root' });
            assert.equal(info.path, '/root/hello.txt');
            assert.equal(await sbx.files.read('hello.txt', { user: 'root' }), 'hello world');
            assert.equal(await sbx.files.read('/root/hello.txt'), 'hello world');
            const owner = await sbx.commands.run('stat -c "%u:%g" /root/hello.txt');
            assert.equal(owner.stdout, '0:0\n');
            await assert.rejects(sbx.commands.run('echo changed > /root/hello.txt'), CommandExitError);
            await assert.rejects(sbx.files.write('/root/other.txt', 'x'), sdk.SandboxError);
            // The filesystem service as root: paths resolve against /root, and it makes root's.
            await sbx.files.makeDir('made', { user: 'root' });
            const made = await sbx.files.getInfo('made', { user: 'root' });
            assert.equal(made.path, '/root/made');
            assert.equal(made.owner, 'root');
            const listed = await sbx.files.list('/root', { user: 'root' });
            assert.deepEqual(listed.map((e) => e.name), ['hello.txt', 'made']);
            // A command as root writes where the user cannot: the sandbox's own root (a copy-up
            // over the template), never the host's /usr.
            await sbx.commands.run('echo root > /etc/moat-test', { user: 'root' });
            assert.equal(await sbx.files.read('/etc/moat-test'), 'root\n');
            await assert.rejects(sbx.commands.run('echo user > /etc/moat-test'), CommandExitError);
            await assert.rejects(sbx.commands.run('touch /usr/moat-test', { user: 'root' }), CommandExitError);
        });

        test('signed URLs for root read and upload as root', async () => {
            await sbx.files.write('signed.txt', 'hello world', { user: 'root' });
            const url = await sbx.downloadUrl('signed.txt', { user: 'root', useSignatureExpiration: 10_000 });
            let r = await fetch(url);
            assert.equal(r.status, 200);
            assert.equal(await r.text(), 'hello world');
            const upload = await sbx.uploadUrl('up.txt', { user: 'root', useSignatureExpiration: 10_000 });
            const form = new FormData();
            form.append('file', 'file content');
            r = await fetch(upload, { method: 'POST', body: form });
            assert.equal(r.status, 200);
            assert.deepEqual(await r.json(), [{ name: 'up.txt', path: '/root/up.txt', type: 'file' }]);
            const owner = await sbx.commands.run('stat -c %u /root/up.txt; cat /root/up.txt');
            assert.equal(owner.stdout, '0\nfile content');
            const expired = await sbx.downloadUrl('signed.txt', { user: 'root', useSignatureExpiration: -10 });
            r = await fetch(expired);
            assert.equal(r.status, 401);
            assert.deepEqual(await r.json(), { code: 401, message: 'signature is already expired' });
        });

        test('sudo runs as root: exit code, stdin, and no variable scoped to another command', async () => {
            assert.equal((await sbx.commands.run('sudo id -u')).stdout, '0\n');
            assert.equal((await sbx.commands.run('echo piped | sudo cat')).stdout, 'piped\n');
            await assert.rejects(sbx.commands.run('sudo sh -c "exit 5"'), (e) => {
                assert.ok(e instanceof CommandExitError, `got ${e}`);
                assert.equal(e.exitCode, 5);
                return true;
            });
            const scoped = await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } });
            assert.equal(scoped.stdout, 'bar\n');
            const later = await sbx.commands.run('sudo echo "$FOO"');
            assert.equal(later.stdout, '\n');
            const kept = await sbx.commands.run('sudo -E sh -c "echo $FOO"', { envs: { FOO: 'kept' } });
            assert.equal(kept.stdout, 'kept\n');
            const file = await sbx.commands.run('sudo touch /root/by-sudo && stat -c %u /root/by-sudo', { user: 'root' });
            assert.equal(file.stdout, '0\n');
        });

        test('root cannot read pid 1, open raw sockets or mount', async () => {
            const probe = await sbx.commands.run(
                'for f in /proc/1/mem /proc/1/environ /proc/1/fd/3; do cat $f >/dev/null 2>&1 && echo open $f; done; ' +
                'python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)" 2>/dev/null && echo raw; ' +
                'mount -t tmpfs none /tmp 2>/dev/null && echo mounted; echo done',
                { user: 'root' });
            assert.equal(probe.stdout, 'done\n');
        });
    });
}
