// Node's own HTTP clients against moat's HTTP server (tests/http_server_test.cpp starts the
// server and runs this): `node node_client.mjs <mode> <port>`. Prints one JSON line with what it
// saw and exits 0, or prints the failure and exits 1. Every wait is bounded (AbortSignal.timeout).
import http from 'node:http';

const [mode, port] = process.argv.slice(2);
const base = `http://127.0.0.1:${port}`;
const bound = AbortSignal.timeout(15000);

function done(result) {
    console.log(JSON.stringify(result));
    process.exit(0);
}

// http.request with a body written in pieces and no Content-Length: Node sends it chunked.
function chunkedUpload() {
    return new Promise((resolve, reject) => {
        const req = http.request(`${base}/echo`, { method: 'POST', signal: bound,
            headers: { 'Content-Type': 'application/json' } }, (res) => {
            let body = '';
            res.setEncoding('utf8');
            res.on('data', (d) => { body += d; });
            res.on('end', () => resolve({ status: res.statusCode, body,
                chunked: req.getHeader('transfer-encoding') ?? 'chunked' }));
        });
        req.on('error', reject);
        for (let i = 0; i < 50; i++) req.write(`{"piece":${i}}`);
        req.end();
    });
}

// Two requests on one keep-alive agent: the second reuses the connection.
async function keepAlive() {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const get = () => new Promise((resolve, reject) => {
        http.get(`${base}/hello`, { agent, signal: bound }, (res) => {
            let body = '';
            res.on('data', (d) => { body += d; });
            res.on('end', () => resolve({ status: res.statusCode, body, socket: res.socket }));
        }).on('error', reject);
    });
    const a = await get();
    const b = await get();
    agent.destroy();
    return { status: [a.status, b.status], body: [a.body, b.body], reused: a.socket === b.socket };
}

// fetch with a streamed request body (duplex: 'half'): undici sends it chunked.
async function fetchStreamUpload() {
    const pieces = 64;
    const piece = 'x'.repeat(1000);
    const body = new ReadableStream({
        start(controller) {
            for (let i = 0; i < pieces; i++) controller.enqueue(new TextEncoder().encode(piece));
            controller.close();
        },
    });
    const res = await fetch(`${base}/count`, { method: 'POST', body, duplex: 'half', signal: bound });
    return { status: res.status, body: await res.json() };
}

// fetch reading a streamed response frame by frame: the server writes the next frame only after
// this client has asked for it (POST /next), so a server that buffered frames would never finish.
async function fetchStreamRead() {
    const res = await fetch(`${base}/stream`, { signal: bound });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    const frames = [];
    let text = '';
    for (;;) {
        const { value, done: finished } = await reader.read();
        if (finished) break;
        text += decoder.decode(value, { stream: true });
        while (text.includes('\n')) {
            const line = text.slice(0, text.indexOf('\n'));
            text = text.slice(text.indexOf('\n') + 1);
            frames.push(line);
            const next = await fetch(`${base}/next`, { method: 'POST', signal: bound });
            await next.text();
        }
    }
    return { status: res.status, encoding: res.headers.get('transfer-encoding'), frames };
}

// A JSON error body as the e2b SDK reads it.
async function fetchErrors() {
    const missing = await fetch(`${base}/nowhere`, { signal: bound });
    const wrong = await fetch(`${base}/hello`, { method: 'DELETE', signal: bound });
    return { missing: [missing.status, await missing.json()],
             wrong: [wrong.status, wrong.headers.get('allow'), await wrong.json()] };
}

const modes = { chunkedUpload, keepAlive, fetchStreamUpload, fetchStreamRead, fetchErrors };
try {
    done(await modes[mode]());
} catch (e) {
    console.log(`FAILED ${mode}: ${e && e.stack ? e.stack : e}`);
    process.exit(1);
}
