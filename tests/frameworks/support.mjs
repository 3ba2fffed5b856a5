// What the framework tests share: the moat binary from argv, no network beyond loopback (telemetry
// off, and every outbound connection checked), a watchdog, numbered checks, and the sandboxes
// `moat mcp` leaves behind.
//
// Import it first: it sets the environment before any framework is loaded (the frameworks are
// imported dynamically by each test, after this module ran).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

export const here = path.dirname(fileURLToPath(import.meta.url));
if (Number(process.versions.node.split('.')[0]) < 20) {
    console.error(`node ${process.versions.node} is too old: @langchain/core and langchain need node 20 or later`);
    process.exit(1);
}
if (!existsSync(path.join(here, 'node_modules', '@langchain', 'mcp-adapters', 'package.json'))) {
    console.error(`${here}/node_modules is missing: run scripts/install-deps (it runs npm ci there)`);
    process.exit(1);
}
if (process.argv.length !== 3) {
    console.error(`usage: node ${path.basename(process.argv[1])} <path to the moat binary>`);
    process.exit(2);
}
export const moat = path.resolve(process.argv[2]);

// Telemetry and tracing off (LangSmith, OpenTelemetry as ADK uses it), and no credentials that
// would make a framework try a real model.
for (const name of Object.keys(process.env)) {
    if (/^(OTEL_EXPORTER_OTLP|LANGCHAIN_API_KEY|LANGSMITH_API_KEY|GOOGLE_API_KEY|GEMINI_API_KEY)/.test(name)) {
        delete process.env[name];
    }
}
Object.assign(process.env, {
    LANGCHAIN_TRACING_V2: 'false',
    LANGCHAIN_TRACING: 'false',
    LANGSMITH_TRACING: 'false',
    LANGSMITH_TRACING_V2: 'false',
    OTEL_SDK_DISABLED: 'true',
    ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS: 'false',
});

// Every TCP connection this process opens must go to loopback; anything else is recorded (and
// refused) and fails the test at its end. Unix sockets and pipes (the stdio MCP transport) pass.
export const outboundAttempts = [];
const loopback = (host) =>
    host === undefined || host === 'localhost' || host === '::1' || /^127\./.test(host);
const connect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function guardedConnect(...args) {
    const first = Array.isArray(args[0]) ? args[0][0] : args[0];
    let host;
    if (first && typeof first === 'object') {
        host = first.path ? undefined : (first.host ?? 'localhost');
    } else if (typeof first === 'number' || /^\d+$/.test(String(first))) {
        host = typeof args[1] === 'string' ? args[1] : 'localhost';
    }
    if (!loopback(host)) {
        outboundAttempts.push(host);
        throw new Error(`the test tried to reach ${host}: only loopback is allowed`);
    }
    return connect.apply(this, args);
};
const realFetch = globalThis.fetch;
globalThis.fetch = async (input, init) => {
    const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
    if (!loopback(url.hostname.replace(/^\[|\]$/g, ''))) {
        outboundAttempts.push(url.hostname);
        throw new Error(`the test tried to fetch ${url.href}: only loopback is allowed`);
    }
    return realFetch(input, init);
};

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// This run's label on every sandbox its moat mcp servers create, so that other tests running on
// the host at the same time are not counted.
const runLabel = `moat.test=${path.basename(process.argv[1], '.mjs')}-${randomBytes(6).toString('hex')}`;

// The moat mcp command line, with the run's label.
export function moatServer(extraArgs = []) {
    return { command: moat, args: ['mcp', '--label', runLabel, ...extraArgs], env: { ...process.env } };
}

// The running sandboxes this run's servers made.
export async function mcpSandboxes() {
    const { stdout } = await promisify(execFile)(moat, ['ls', '--label', runLabel, '--json'],
        { timeout: 30_000 });
    const [key, value] = runLabel.split('=');
    return JSON.parse(stdout).filter((s) => s.labels?.['moat.client'] === 'mcp' && s.labels?.[key] === value)
        .filter((s) => s.state === 'running').map((s) => s.id);
}

// Waits (bounded) until no running mcp sandbox is left beyond those in `before`.
export async function assertNoSandboxLeft(before, what) {
    const deadline = Date.now() + 15_000;
    for (;;) {
        const left = (await mcpSandboxes()).filter((id) => !before.has(id));
        if (left.length === 0) return;
        assert.ok(Date.now() < deadline, `${what}: sandboxes still running 15 s later: ${left}`);
        await sleep(200);
    }
}

let checkNumber = 0;
let cleanups = [];
export function onCleanup(fn) {
    cleanups.push(fn);
}

async function cleanUp() {
    const pending = cleanups.reverse();
    cleanups = [];
    for (const fn of pending) {
        try {
            await fn();
        } catch { /* best effort */ }
    }
}

export function startWatchdog(seconds) {
    const timer = setTimeout(async () => {
        console.log(`FAILED: watchdog: the test took longer than ${seconds} s`);
        setTimeout(() => process.exit(1), 10_000).unref();
        await cleanUp();
        process.exit(1);
    }, seconds * 1000);
    timer.unref();
}

export async function check(name, fn) {
    const started = Date.now();
    checkNumber += 1;
    try {
        await fn();
    } catch (error) {
        console.log(`not ok ${checkNumber} - ${name}`);
        console.log(`FAILED: ${error?.stack ?? String(error)}`);
        setTimeout(() => process.exit(1), 20_000).unref();
        await cleanUp();
        process.exit(1);
    }
    console.log(`ok ${checkNumber} - ${name} (${Date.now() - started} ms)`);
}

export async function finish() {
    await check('nothing tried to reach the network beyond loopback', async () => {
        assert.deepEqual(outboundAttempts, []);
    });
    await cleanUp();
    console.log(`all ${checkNumber} checks passed`);
    process.exit(0);
}

// A tool result's JSON, from whatever a framework hands back (a string, a content-block array, a
// ToolMessage, an MCP CallToolResult).
export function resultJson(value) {
    if (value === undefined || value === null) assert.fail('no tool result');
    if (typeof value === 'string') return JSON.parse(value);
    if (Array.isArray(value)) return resultJson(value.map((b) => (typeof b === 'string' ? b : b.text ?? '')).join(''));
    if (value.content !== undefined) return resultJson(value.content);
    if (value.text !== undefined) return JSON.parse(value.text);
    assert.fail(`not a tool result: ${JSON.stringify(value)}`);
}
