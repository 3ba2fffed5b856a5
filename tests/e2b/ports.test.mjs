// moat serve's port hosts driven by the official e2b SDK 2.51.0: getHost(port) under --domain
// (the create answer's `domain`, no E2B_DOMAIN), an http.server started with
// commands.run("python -m http.server", {background: true}) fetched through `<port>-<id>.<domain>`, a WebSocket echo
// through the same route, the E2b-Sandbox-Port form, and the refusals: another sandbox's name,
// private ports without their traffic token or with another sandbox's, moat's own port 3128.
// The test resolves `*.moat.test` to the server's loopback address itself (a lookup function),
// as an operator's `*.D` DNS record would.
// Run: node tests/e2b/ports.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

import { pointSdkAt, removeDir, requireSdk, startServe, waitFor, wildcardCertificate } from './harness.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));

const sdks = await requireSdk();
const { Sandbox } = sdks['e2b 2.51.0'];
const domain = 'moat.test';

let serve;
let envdPort;
before(async () => {
    delete process.env.E2B_DOMAIN;
    serve = await startServe({ args: ['--domain', domain] });
    envdPort = Number(new URL(serve.envd).port);
});
after(async () => {
    if (serve) await serve.stop();
});

// `*.moat.test` is the server's loopback address (what a wildcard DNS record would say).
function lookup(hostname, options, callback) {
    if (hostname === 'localhost') {
        if (options && options.all) callback(null, [{ address: '127.0.0.1', family: 4 }]);
        else callback(null, '127.0.0.1', 4);
    } else if (!hostname.endsWith('.' + domain)) {
        callback(new Error(`unexpected name ${hostname}`));
    } else if (options && options.all) {
        callback(null, [{ address: '127.0.0.1', family: 4 }]);
    } else {
        callback(null, '127.0.0.1', 4);
    }
}

// GET through a port host; {status, body, headers}.
function get(host, path = '/', headers = {}) {
    return new Promise((resolve, reject) => {
        const request = http.get({ host, port: envdPort, path, headers, lookup, agent: false }, (response) => {
            let body = '';
            response.setEncoding('utf8');
            response.on('data', (d) => { body += d; });
            response.on('end', () => resolve({ status: response.statusCode, body, headers: response.headers }));
        });
        request.on('error', reject);
        request.setTimeout(20_000, () => request.destroy(new Error('timed out')));
    });
}

// A server the sandbox starts answers once it listens (502 "port is not open" until then).
async function waitUntilServed(host, path, headers = {}) {
    let last;
    await waitFor(async () => {
        last = await get(host, path, headers);
        return last.status !== 502;
    }, 20_000, 100);
    return last;
}

async function startHttpServer(sbx, port) {
    await sbx.files.write('/home/user/site/hello.txt', 'hello from the sandbox\n');
    return sbx.commands.run(`python -m http.server ${port}`, { background: true, cwd: '/home/user/site' });
}

// A WebSocket echo server (RFC 6455, text frames under 126 bytes), Python's standard library only.
const websocketEcho = String.raw`
import base64, hashlib, socket, struct, threading
GUID = b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
def serve(c):
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = c.recv(4096)
        if not chunk:
            return
        data += chunk
    keys = [l.split(b':', 1)[1].strip() for l in data.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key:')]
    if not keys:
        c.sendall(b'HTTP/1.0 200 OK\r\n\r\nnot a websocket request\n')
        c.close()
        return
    key = keys[0]
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + b'\r\n\r\n')
    f = c.makefile('rb')
    while True:
        h = f.read(2)
        if len(h) < 2:
            return
        n = h[1] & 127
        if n == 126:
            n = struct.unpack('>H', f.read(2))[0]
        mask = f.read(4) if h[1] & 128 else b'\0\0\0\0'
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if h[0] & 15 == 8:
            c.sendall(b'\x88\x00')
            return
        reply = b'echo: ' + payload
        c.sendall(bytes([0x81, len(reply)]) + reply)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 8765))
s.listen()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`;

// Opens a WebSocket through `host`, sends each message, and returns the replies.
function websocketRoundTrips(host, messages) {
    return new Promise((resolve, reject) => {
        const key = randomBytes(16).toString('base64');
        const request = http.request({
            host, port: envdPort, path: '/', lookup, agent: false,
            headers: { Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Key': key, 'Sec-WebSocket-Version': '13' },
        });
        request.on('response', (response) => reject(new Error(`no upgrade: ${response.statusCode}`)));
        request.on('error', reject);
        request.on('upgrade', (response, socket, head) => {
            assert.equal(response.statusCode, 101);
            const replies = [];
            let buffer = head;
            const send = (text) => {
                const payload = Buffer.from(text);
                const mask = randomBytes(4);
                const masked = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
                socket.write(Buffer.concat([Buffer.from([0x81, 0x80 | payload.length]), mask, masked]));
            };
            socket.on('data', (d) => {
                buffer = Buffer.concat([buffer, d]);
                while (buffer.length >= 2 && buffer.length >= 2 + buffer[1]) {
                    replies.push(buffer.subarray(2, 2 + buffer[1]).toString());
                    buffer = buffer.subarray(2 + buffer[1]);
                    if (replies.length < messages.length) {
                        send(messages[replies.length]);
                    } else {
                        socket.end();
                        resolve(replies);
                    }
                }
            });
            socket.on('error', reject);
            send(messages[0]);
        });
        request.setTimeout(20_000, () => request.destroy(new Error('timed out')));
        request.end();
    });
}

test('getHost names a port under the server\'s domain, and a background http.server is fetched through it', async () => {
    const sbx = await Sandbox.create();
    try {
        const host = sbx.getHost(8000);
        assert.equal(host, `8000-${sbx.sandboxId}.${domain}`);
        await startHttpServer(sbx, 8000);
        const served = await waitUntilServed(host, '/hello.txt');
        assert.equal(served.status, 200);
        assert.equal(served.body, 'hello from the sandbox\n');
        // Several requests, each on a connection of its own, and a missing file is the
        // server's own 404.
        const again = await Promise.all([get(host, '/hello.txt'), get(host, '/hello.txt'), get(host, '/missing')]);
        assert.deepEqual(again.map((r) => r.status), [200, 200, 404]);
        // The E2b-Sandbox-Port form (what the SDKs send with E2B_SANDBOX_URL) reaches it too.
        const byHeader = await get(`localhost`, '/hello.txt', { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' });
        assert.equal(byHeader.status, 200);
        assert.equal(byHeader.body, 'hello from the sandbox\n');
        // A port nothing listens on, and moat's own port in the sandbox.
        const closed = await get(sbx.getHost(8001), '/');
        assert.equal(closed.status, 502);
        assert.match(closed.body, /port is not open/);
        const proxy = await get(sbx.getHost(3128), '/');
        assert.equal(proxy.status, 403);
        assert.match(proxy.body, /3128/);
    } finally {
        await sbx.kill();
    }
});

test('a WebSocket echo in the sandbox answers through the same route', async () => {
    const sbx = await Sandbox.create();
    try {
        await sbx.files.write('/home/user/echo.py', websocketEcho);
        await sbx.commands.run('python /home/user/echo.py', { background: true });
        const host = sbx.getHost(8765);
        await waitFor(async () => (await get(host, '/')).status !== 502, 20_000, 100);
        const replies = await websocketRoundTrips(host, ['one', 'two', 'three']);
        assert.deepEqual(replies, ['echo: one', 'echo: two', 'echo: three']);
    } finally {
        await sbx.kill();
    }
});

test('a port is reached only through its own sandbox\'s name, and a killed sandbox\'s is gone', async () => {
    const serving = await Sandbox.create();
    const other = await Sandbox.create();
    try {
        await startHttpServer(serving, 8000);
        assert.equal((await waitUntilServed(serving.getHost(8000), '/hello.txt')).status, 200);
        // The other sandbox's name for the same port: its own (empty) port, never the first's.
        const elsewhere = await get(other.getHost(8000), '/hello.txt');
        assert.equal(elsewhere.status, 502);
        assert.match(elsewhere.body, /port is not open/);
        assert.equal(JSON.parse(elsewhere.body).sandboxId, other.sandboxId);
        // A name no sandbox has.
        const unknown = await get(`8000-sb-00000000000000000000.${domain}`, '/');
        assert.equal(unknown.status, 502);
        assert.match(unknown.body, /The sandbox was not found/);
        await other.kill();
        const killed = await get(other.getHost(8000), '/');
        assert.equal(killed.status, 502);
        assert.match(killed.body, /The sandbox was not found/);
    } finally {
        await serving.kill();
    }
});

test('private ports need the sandbox\'s own trafficAccessToken', async () => {
    const first = await Sandbox.create({ network: { allowPublicTraffic: false } });
    const second = await Sandbox.create({ network: { allowPublicTraffic: false } });
    const open = await Sandbox.create();
    try {
        assert.ok(first.trafficAccessToken, 'a private sandbox gets a traffic token');
        assert.ok(second.trafficAccessToken);
        assert.notEqual(first.trafficAccessToken, second.trafficAccessToken);
        assert.equal(open.trafficAccessToken, undefined, 'public ports have none');
        assert.equal((await first.getInfo()).network.allowPublicTraffic, false);
        assert.equal((await open.getInfo()).network.allowPublicTraffic, true);
        await startHttpServer(first, 8000);
        const host = first.getHost(8000);
        const token = { 'E2B-Traffic-Access-Token': first.trafficAccessToken };
        assert.equal((await waitUntilServed(host, '/hello.txt', token)).status, 200);
        const without = await get(host, '/hello.txt');
        assert.equal(without.status, 403);
        assert.match(without.body, /private/);
        const others = await get(host, '/hello.txt', { 'E2B-Traffic-Access-Token': second.trafficAccessToken });
        assert.equal(others.status, 403);
        const envdToken = await get(host, '/hello.txt', { 'E2B-Traffic-Access-Token': first.envdAccessToken ?? 'x' });
        assert.equal(envdToken.status, 403);
        const withToken = await get(host, '/hello.txt', token);
        assert.equal(withToken.status, 200);
        assert.equal(withToken.body, 'hello from the sandbox\n');
    } finally {
        await Promise.all([first.kill(), second.kill(), open.kill()]);
    }
});

// A server that answers each request with the Host line it was sent, as the sandbox saw it.
const hostEcho = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        lines = [k + ': ' + v for k, v in self.headers.items() if k.lower() == 'host']
        body = ('\\n'.join(lines) + '\\n').encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('', 8080), H).serve_forever()
`;

test('network.maskRequestHost replaces the Host a port request carries into the sandbox', async () => {
    const masked = await Sandbox.create({ network: { maskRequestHost: 'custom-host.example.com:${PORT}' } });
    const plain = await Sandbox.create();
    try {
        assert.equal((await masked.getInfo()).network.maskRequestHost, 'custom-host.example.com:${PORT}');
        for (const sbx of [masked, plain]) {
            await sbx.files.write('/tmp/host_echo.py', hostEcho);
            await sbx.commands.run('python3 /tmp/host_echo.py', { background: true });
        }
        const seen = await waitUntilServed(masked.getHost(8080), '/');
        assert.equal(seen.status, 200);
        assert.equal(seen.body, 'Host: custom-host.example.com:8080\n');
        // Without a mask the client's own Host goes through, whatever its case.
        const own = await waitUntilServed(plain.getHost(8080), '/');
        assert.equal(own.body.toLowerCase(), `host: ${plain.getHost(8080)}:${envdPort}\n`.toLowerCase());
        // A mask that could split the head is refused at create, naming the field.
        await assert.rejects(Sandbox.create({ network: { maskRequestHost: 'a\r\nX-Evil: 1' } }),
            (e) => /maskRequestHost/.test(e.message));
    } finally {
        await Promise.all([masked.kill(), plain.kill()]);
    }
});

test('--private-ports makes private the default', async () => {
    const privateServe = await startServe({ args: ['--domain', domain, '--private-ports'] });
    try {
        const sbx = await Sandbox.create();
        try {
            assert.ok(sbx.trafficAccessToken);
            await startHttpServer(sbx, 8000);
            const port = Number(new URL(privateServe.envd).port);
            const fetchFrom = (headers) => new Promise((resolve, reject) => {
                http.get({ host: sbx.getHost(8000), port, path: '/hello.txt', headers, lookup, agent: false }, (r) => {
                    r.resume();
                    r.on('end', () => resolve(r.statusCode));
                }).on('error', reject);
            });
            const token = { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken };
            assert.ok(await waitFor(async () => (await fetchFrom(token)) === 200, 20_000, 100));
            assert.equal(await fetchFrom({}), 403);
            // An explicit allowPublicTraffic: true is honoured.
            const open = await Sandbox.create({ network: { allowPublicTraffic: true } });
            assert.equal(open.trafficAccessToken, undefined);
            await open.kill();
        } finally {
            await sbx.kill();
        }
    } finally {
        await privateServe.stop();
        pointSdkAt(serve);
    }
});

test('over TLS, a port host is served under a wildcard certificate for the domain', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'moat-ports-tls-'));
    const tlsServe = await startServe({ setEnv: false, args: ['--domain', domain, ...(() => {
        const c = wildcardCertificate(dir, domain);
        return ['--tls-cert', c.cert, '--tls-key', c.key];
    })()] });
    try {
        assert.match(tlsServe.envd, /^https:/);
        const port = new URL(tlsServe.envd).port;
        const child = spawnSync(process.execPath, [path.join(here, 'tls_port_client.mjs'), domain, port, path.join(dir, 'ca.pem')], {
            cwd: here,
            encoding: 'utf8',
            timeout: 120_000,
            env: {
                ...process.env,
                NODE_EXTRA_CA_CERTS: path.join(dir, 'ca.pem'),
                E2B_API_URL: tlsServe.api,
                E2B_SANDBOX_URL: tlsServe.envd,
                E2B_API_KEY: tlsServe.key,
            },
        });
        assert.equal(child.status, 0, `the TLS client failed: ${child.stderr}`);
        const answer = JSON.parse(child.stdout.trim().split('\n').pop());
        assert.equal(answer.status, 200);
        assert.equal(answer.body, 'hello over TLS\n');
        assert.match(answer.host, new RegExp(`^8000-sb-[0-9a-f]+\\.${domain.replace('.', '\\.')}$`));
    } finally {
        await tlsServe.stop();
        removeDir(dir);
    }
});
