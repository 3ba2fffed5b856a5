// moat serve's envd file routes and filesystem service driven by the official e2b SDK, 2.51.0
// and 2.50.0: text and binary round trips, list / exists / makeDir / rename / remove, missing-file
// errors, signed download and upload URLs (and an expired one refused), symlinks planted inside
// that point at host paths, a 100 MiB upload and download with the server's peak RSS read from
// /proc, the per-file cap (413, nothing left, also for a gzip body as it inflates), file metadata
// (X-Metadata-* headers, user.e2b.* attributes) and gzip uploads.
// Run: node tests/e2b/files.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { inSandbox, removeDir, requireSdk, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();

let serve;
let baseline;  // the server's descendants before any sandbox (its helper)
before(async () => {
    serve = await startServe();
    baseline = new Set(serve.descendants().map((p) => p.pid));
});
after(async () => {
    if (serve) assert.equal(await serve.stop(), 0);
});

// The server's peak resident set size so far, in bytes.
function servePeakRss() {
    const status = readFileSync(`/proc/${serve.pid}/status`, 'utf8');
    return Number(/^VmHWM:\s+(\d+) kB$/m.exec(status)[1]) * 1024;
}

// Kills the sandbox and checks from the host that none of its processes is left.
async function killAndCheck(sbx) {
    assert.equal(await sbx.kill(), true);
    const left = await waitFor(() => serve.descendants().every((p) => baseline.has(p.pid)), 10_000);
    assert.ok(left, `processes left after kill: ${JSON.stringify(serve.descendants())}`);
}

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox, FileType } = sdk;
    describe(version, () => {
        test('write and read text and 256 KB of every byte value, list, exists, makeDir, rename, remove', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                const home = (await sbx.files.getInfo('~')).path;
                const info = await sbx.files.write('notes/a.txt', 'hello world\n');
                assert.equal(info.path, `${home}/notes/a.txt`);
                assert.equal(info.name, 'a.txt');
                assert.equal(info.type, FileType.FILE);
                assert.equal(await sbx.files.read('notes/a.txt'), 'hello world\n');
                assert.equal(await sbx.files.read(`${home}/notes/a.txt`), 'hello world\n');
                await sbx.files.write('empty', '');
                assert.equal(await sbx.files.read('empty'), '');

                const bytes = new Uint8Array(256 * 1024);
                for (let i = 0; i < bytes.length; i++) bytes[i] = i % 256;
                await sbx.files.write('bin/all-bytes', bytes.buffer);
                const back = await sbx.files.read('bin/all-bytes', { format: 'bytes' });
                assert.equal(back.length, bytes.length);
                assert.ok(Buffer.from(back).equals(Buffer.from(bytes)), 'binary round trip differs');

                const entry = await sbx.files.getInfo('bin/all-bytes');
                assert.equal(entry.size, bytes.length);
                assert.equal(entry.type, FileType.FILE);
                assert.equal(entry.permissions, '-rw-r--r--');
                assert.equal(entry.mode, 0o644);
                assert.equal(entry.owner, 'user');
                assert.ok(entry.modifiedTime instanceof Date && Math.abs(entry.modifiedTime - Date.now()) < 120_000);

                assert.equal(await sbx.files.exists('notes/a.txt'), true);
                assert.equal(await sbx.files.exists('notes/missing.txt'), false);
                assert.equal(await sbx.files.makeDir('made/deep/er'), true);
                assert.equal(await sbx.files.makeDir('made/deep/er'), false);  // already exists
                assert.equal((await sbx.files.getInfo('made/deep')).type, FileType.DIR);

                const names = (await sbx.files.list('.')).map((e) => e.name).sort();
                for (const n of ['bin', 'empty', 'made', 'notes']) assert.ok(names.includes(n), `list lacks ${n}: ${names}`);
                const deep = await sbx.files.list('made', { depth: 3 });
                assert.deepEqual(deep.map((e) => e.path).sort(), [`${home}/made/deep`, `${home}/made/deep/er`]);
                // In envd's order (its walk's), not the directory's: depth first, names bytewise.
                for (const d of ['order/b', 'order/a/z', 'order/a/y']) await sbx.files.makeDir(d);
                await sbx.files.write('order/a-b', 'x');
                const walked = (await sbx.files.list('order', { depth: 2 })).map((e) => e.path.slice(home.length + 7));
                assert.deepEqual(walked, ['a', 'a/y', 'a/z', 'a-b', 'b']);

                const moved = await sbx.files.rename('notes/a.txt', 'elsewhere/b.txt');
                assert.equal(moved.path, `${home}/elsewhere/b.txt`);
                assert.equal(await sbx.files.exists('notes/a.txt'), false);
                assert.equal(await sbx.files.read('elsewhere/b.txt'), 'hello world\n');

                await sbx.files.remove('made');
                assert.equal(await sbx.files.exists('made'), false);
                await sbx.files.remove('made');  // missing: no error, as envd

                // Multi-file write: the part filenames carry the paths.
                const many = await sbx.files.write([
                    { path: 'multi/one', data: '1' },
                    { path: 'multi/two', data: '2' },
                ]);
                assert.deepEqual(many.map((w) => w.path), [`${home}/multi/one`, `${home}/multi/two`]);
                assert.equal(await sbx.files.read('multi/two'), '2');
            } finally {
                await killAndCheck(sbx);
            }
        });

        test('file metadata is kept as user.e2b.* attributes, returned by write, getInfo and list, replaced by the next write; gzip uploads inflate', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                const meta = { Author: 'ada', note: 'a b&c=d' };
                const kept = { author: 'ada', note: 'a b&c=d' };  // envd lowercases the keys
                const info = await sbx.files.write('meta/a.txt', 'with metadata', { metadata: meta });
                assert.deepEqual(info.metadata, kept);
                assert.deepEqual((await sbx.files.getInfo('meta/a.txt')).metadata, kept);
                const listed = await sbx.files.list('meta');
                assert.deepEqual(listed.map((e) => [e.name, e.metadata]), [['a.txt', kept]]);
                // What the file carries, as code inside the sandbox sees it.
                const xattrs = await inSandbox(sbx, `python3 -I -S -c 'import os; p=os.path.expanduser("~/meta/a.txt"); print(sorted((n, os.getxattr(p, n).decode()) for n in os.listxattr(p)))'`);
                assert.equal(xattrs, "[('user.e2b.author', 'ada'), ('user.e2b.note', 'a b&c=d')]\n");
                // A symlink's entry carries its target's metadata, as envd's.
                await inSandbox(sbx, 'ln -s a.txt ~/meta/link');
                assert.deepEqual((await sbx.files.getInfo('meta/link')).metadata, kept);
                // Every file of a multi-file write gets the same metadata.
                const many = await sbx.files.write([{ path: 'meta/b', data: '1' }, { path: 'meta/c', data: '2' }], { metadata: { k: 'v' } });
                assert.deepEqual(many.map((f) => [f.name, f.metadata]), [['b', { k: 'v' }], ['c', { k: 'v' }]]);
                // Overwriting without metadata clears it.
                const plain = await sbx.files.write('meta/a.txt', 'no metadata now');
                assert.equal(plain.metadata, undefined);
                assert.equal((await sbx.files.getInfo('meta/a.txt')).metadata, undefined);
                assert.equal(await inSandbox(sbx, `python3 -I -S -c 'import os; print(os.listxattr(os.path.expanduser("~/meta/a.txt")))'`), '[]\n');
                // A key past envd's 246 bytes (the SDK does not check the length) is 400, and
                // nothing is written.
                await assert.rejects(sbx.files.write('meta/long', 'x', { metadata: { ['k'.repeat(247)]: 'v' } }),
                    (e) => e.name === 'InvalidArgumentError' && /longer than 246 bytes/.test(e.message));
                assert.equal(await sbx.files.exists('meta/long'), false);
                // gzip: the SDK compresses the body and sends Content-Encoding: gzip.
                const bytes = new Uint8Array(200_000).map((_, i) => (i * 31) % 256);
                const zipped = await sbx.files.write('gz/data.bin', bytes, { gzip: true, metadata: { z: '1' } });
                assert.deepEqual(zipped.metadata, { z: '1' });
                const back = await sbx.files.read('gz/data.bin', { format: 'bytes' });
                assert.deepEqual(Buffer.from(back), Buffer.from(bytes));
            } finally {
                await killAndCheck(sbx);
            }
        });

        test('missing files, directories and other users are the SDK errors envd gives', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                await assert.rejects(sbx.files.read('nope.txt'), sdk.FileNotFoundError);
                await assert.rejects(sbx.files.getInfo('nope.txt'), sdk.FileNotFoundError);
                await assert.rejects(sbx.files.list('nope'), sdk.FileNotFoundError);
                await assert.rejects(sbx.files.rename('nope', 'x'), sdk.FileNotFoundError);
                await sbx.files.makeDir('adir');
                await assert.rejects(sbx.files.read('adir'), sdk.InvalidArgumentError);
                await sbx.files.write('afile', 'x');
                await assert.rejects(sbx.files.list('afile'), sdk.InvalidArgumentError);
                await assert.rejects(sbx.files.makeDir('afile'), sdk.InvalidArgumentError);
                // A user the sandbox does not have is refused; root is one it has (root.test.mjs).
                await assert.rejects(sbx.files.read('afile', { user: 'nobody' }), sdk.AuthenticationError);
                await assert.rejects(sbx.files.getInfo('afile', { user: 'nobody' }), sdk.AuthenticationError);
                await assert.rejects(sbx.files.read('afile', { user: 'root' }), sdk.FileNotFoundError);
                // Watches work now (tests/e2b/watch.test.mjs): a file or a missing directory fails.
                await assert.rejects(sbx.files.watchDir('afile', () => {}), sdk.SandboxError);
                await assert.rejects(sbx.files.watchDir('nope', () => {}), sdk.FileNotFoundError);
            } finally {
                await killAndCheck(sbx);
            }
        });

        test('signed download and upload URLs work without the sandbox header, an expired one is 401', async () => {
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                await sbx.files.write('signed.txt', 'signed content');
                const url = await sbx.downloadUrl('signed.txt');
                assert.match(url, /signature=v1_/);
                let r = await fetch(url);  // no E2b-Sandbox-Id, no X-Access-Token
                assert.equal(r.status, 200);
                assert.equal(await r.text(), 'signed content');

                const expiring = await sbx.downloadUrl('signed.txt', { useSignatureExpiration: 60 });
                r = await fetch(expiring);
                assert.equal(r.status, 200);
                const expired = await sbx.downloadUrl('signed.txt', { useSignatureExpiration: -10 });
                r = await fetch(expired);
                assert.equal(r.status, 401);
                assert.deepEqual(await r.json(), { code: 401, message: 'signature is already expired' });
                // Also without naming the sandbox (the signature finds it) and for an upload.
                r = await fetch(expired, { headers: { 'E2b-Sandbox-Id': '' } });
                assert.equal(r.status, 401);
                const expiredUpload = await sbx.uploadUrl('never.txt', { useSignatureExpiration: -10 });
                const late = new FormData();
                late.append('file', new Blob(['late']), 'never.txt');
                r = await fetch(expiredUpload, { method: 'POST', body: late });
                assert.deepEqual(await r.json(), { code: 401, message: 'signature is already expired' });
                assert.equal(await sbx.files.exists('never.txt'), false);
                // A wrong path or a forged signature is not "expired": nothing says a signature was right.
                r = await fetch(url.replace('signed.txt', 'other.txt'));
                assert.equal(r.status, 401);
                assert.notEqual((await r.json()).message, 'signature is already expired');
                r = await fetch(url.replace(/signature=[^&]+/, 'signature=v1_forged'));
                assert.equal(r.status, 401);

                const upload = await sbx.uploadUrl('up/loaded.txt');
                const form = new FormData();
                form.append('file', new Blob(['uploaded through a signed URL']), 'up/loaded.txt');
                r = await fetch(upload, { method: 'POST', body: form });
                assert.equal(r.status, 200, await r.clone().text());
                const written = await r.json();
                assert.equal(written[0].name, 'loaded.txt');
                assert.equal(await sbx.files.read('up/loaded.txt'), 'uploaded through a signed URL');
                // A read signature does not let a write through.
                r = await fetch(url, { method: 'POST', body: form });
                assert.equal(r.status, 401);
            } finally {
                await killAndCheck(sbx);
            }
        });

        test('symlinks planted inside that point at host paths never reach the host', async () => {
            const hostDir = mkdtempSync(path.join(os.tmpdir(), 'moat-host-'));
            const hostFile = path.join(hostDir, 'secret');
            writeFileSync(hostFile, 'host secret', { mode: 0o666 });
            const sbx = await Sandbox.create({ timeoutMs: 120_000 });
            try {
                const home = (await sbx.files.getInfo('~')).path;
                await inSandbox(sbx, `ln -s ${hostFile} ${home}/flink && ln -s ${hostDir} ${home}/dlink && ln -s / ${home}/root`);
                // Inside, the host paths do not exist: the links dangle.
                await assert.rejects(sbx.files.read('flink'), sdk.FileNotFoundError);
                await assert.rejects(sbx.files.read('dlink/secret'), sdk.FileNotFoundError);
                await assert.rejects(sbx.files.read(`root${hostFile}`), sdk.FileNotFoundError);
                await assert.rejects(sbx.files.read(`../../../..${hostFile}`), sdk.FileNotFoundError);
                // Writing through them lands inside the sandbox, or fails (a parent that is a
                // dangling link is not a directory to create the file in).
                await sbx.files.write('flink', 'replaced the link');
                await assert.rejects(sbx.files.write('dlink/secret', 'inside'), sdk.SandboxError);
                await sbx.files.write(`root${hostDir}/planted`, 'inside too');
                await sbx.files.write(`../../../..${hostDir}/planted2`, 'inside as well');
                assert.equal(await sbx.files.read(`${hostDir}/planted2`), 'inside as well');
                await assert.rejects(sbx.files.rename('dlink/secret', 'dlink/renamed'), sdk.FileNotFoundError);
                await sbx.files.rename(`${hostDir}/planted`, 'dlink/renamed').catch(() => {});
                await sbx.files.remove(`root${hostFile}`);
                await sbx.files.remove('dlink');
                assert.equal(readFileSync(hostFile, 'utf8'), 'host secret');
                assert.deepEqual(readdirSync(hostDir), ['secret']);
                assert.equal(await sbx.files.read('flink'), 'replaced the link');
            } finally {
                await killAndCheck(sbx);
                removeDir(hostDir);
            }
        });
    });
}

describe('e2b 2.51.0 large files', () => {
    const { Sandbox } = sdks['e2b 2.51.0'];
    test('a 100 MiB upload and its download stream through in bounded memory, and a ReadableStream upload works', async () => {
        const sbx = await Sandbox.create({ timeoutMs: 300_000 });
        try {
            const size = 100 * 1024 * 1024;
            const data = new Uint8Array(size);
            for (let i = 0; i < size; i += 4096) data[i] = (i / 4096) % 251;
            const before = servePeakRss();
            let started = Date.now();
            await sbx.files.write('big.bin', data.buffer, { requestTimeoutMs: 300_000 });
            console.log(`100 MiB upload: ${Date.now() - started} ms`);
            const peak = servePeakRss();
            console.log(`moat serve peak RSS: before ${(before / 1048576).toFixed(1)} MiB, after a 100 MiB upload ${(peak / 1048576).toFixed(1)} MiB`);
            // The growth is bounded, not the total: under ASan the server starts near 190 MiB.
            assert.ok(peak - before < 64 * 1024 * 1024,
                `peak RSS grew ${peak - before} bytes (from ${before}): the upload was held in memory`);
            const info = await sbx.files.getInfo('big.bin');
            assert.equal(info.size, size);
            started = Date.now();
            const back = await sbx.files.read('big.bin', { format: 'bytes', requestTimeoutMs: 300_000 });
            console.log(`100 MiB download: ${Date.now() - started} ms`);
            assert.equal(back.length, size);
            assert.ok(Buffer.from(back).equals(Buffer.from(data)), 'the 100 MiB file came back different');
            console.log(`moat serve peak RSS after reading it back: ${(servePeakRss() / 1048576).toFixed(1)} MiB`);

            // A streamed (octet-stream) upload goes the same way.
            const stream = new ReadableStream({
                start(controller) {
                    controller.enqueue(new TextEncoder().encode('streamed '));
                    controller.enqueue(new TextEncoder().encode('body'));
                    controller.close();
                },
            });
            await sbx.files.write('streamed.txt', stream);
            assert.equal(await sbx.files.read('streamed.txt'), 'streamed body');
        } finally {
            await killAndCheck(sbx);
        }
    });
});

describe('the per-file cap', () => {
    test('a file one byte past --max-file-bytes is 413 and leaves nothing, multipart or raw', async () => {
        const small = await startServe({ args: ['--max-file-bytes', '1048576'], setEnv: false });
        try {
            const { Sandbox } = sdks['e2b 2.51.0'];
            const opts = { apiUrl: small.api, sandboxUrl: small.envd, apiKey: small.key };
            const sbx = await Sandbox.create({ ...opts, timeoutMs: 120_000 });
            try {
                const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken };
                const url = (p) => `${small.envd}/files?path=${encodeURIComponent(p)}`;
                const exact = new Uint8Array(1048576).fill(7);
                let r = await fetch(url('cap/exact'), { method: 'POST', headers: { ...headers, 'Content-Type': 'application/octet-stream' }, body: exact });
                assert.equal(r.status, 200, await r.clone().text());
                const over = new Uint8Array(1048577).fill(7);
                r = await fetch(url('cap/raw'), { method: 'POST', headers: { ...headers, 'Content-Type': 'application/octet-stream' }, body: over });
                assert.equal(r.status, 413);
                assert.equal((await r.json()).code, 413);
                const form = new FormData();
                form.append('file', new Blob([over]), 'cap/multi');
                r = await fetch(url('cap/multi'), { method: 'POST', headers, body: form });
                assert.equal(r.status, 413);
                // A gzip body is capped as it inflates: 64 MiB of zeros, sent as about 64 KiB.
                const { gzipSync } = await import('node:zlib');
                const bomb = gzipSync(Buffer.alloc(64 << 20));
                r = await fetch(url('cap/bomb'), { method: 'POST', headers: { ...headers, 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip' }, body: bomb });
                assert.equal(r.status, 413);
                r = await fetch(url('cap/notgzip'), { method: 'POST', headers: { ...headers, 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip' }, body: 'plain text' });
                assert.equal(r.status, 400);
                assert.match((await r.json()).message, /gzip/);
                r = await fetch(url('cap/br'), { method: 'POST', headers: { ...headers, 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'br' }, body: 'x' });
                assert.equal(r.status, 400);
                const names = (await sbx.files.list('cap')).map((e) => e.name);
                assert.deepEqual(names, ['exact']);
                assert.equal((await sbx.files.getInfo('cap/exact')).size, 1048576);
            } finally {
                assert.equal(await sbx.kill(), true);
            }
        } finally {
            assert.equal(await small.stop(), 0);
        }
    });
});
