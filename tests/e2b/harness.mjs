// The SDK harness: starts a real `moat serve` (ports 0, a fresh API key file, its own state
// directory), points the official e2b SDK at it (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY),
// lists the host processes descended from it, and stops it. One node:test file per area
// (control_plane.test.mjs, commands.test.mjs, files.test.mjs) imports it:
//
//     import { requireSdk, startServe } from './harness.mjs';
//     const sdks = await requireSdk();               // { 'e2b 2.51.0': module, 'e2b 2.50.0': module }
//     const serve = await startServe();              // sets the three env vars
//     const sbx = await sdks['e2b 2.51.0'].Sandbox.create();
//     ...
//     assert.equal(await serve.stop(), 0);           // SIGTERM, exit code
//
// The moat binary comes from argv[2] or $MOAT_BIN. Without node_modules (scripts/install-deps
// runs npm ci here) a test file exits 77, which ctest reports as skipped; with
// MOAT_REQUIRE_NAMESPACES=1 (CI) it fails instead.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

export const moatBinary = process.argv[2] || process.env.MOAT_BIN || '';

// Exits (77: skipped, or 1 under CI) unless the SDK packages and the moat binary are present.
export async function requireSdk() {
    const missing = [];
    for (const name of ['e2b', 'e2b-2-50']) {
        if (!existsSync(path.join(here, 'node_modules', name, 'package.json'))) missing.push(name);
    }
    const [major, minor, patch] = process.versions.node.split('.').map(Number);
    const oldNode = major < 20 || (major === 20 && (minor < 18 || (minor === 18 && patch < 1)));
    let why = '';
    if (oldNode) why = `node ${process.versions.node} is older than 20.18.1, which the e2b SDK needs`;
    else if (missing.length) why = `${here}/node_modules lacks ${missing.join(', ')}: run scripts/install-deps (npm ci there)`;
    else if (!moatBinary || !existsSync(moatBinary)) why = 'no moat binary: pass its path as the first argument or set MOAT_BIN';
    if (why) {
        console.error(`skipped: ${why}`);
        process.exit(process.env.MOAT_REQUIRE_NAMESPACES === '1' ? 1 : 77);
    }
    const current = await import('e2b');
    const previous = await import('e2b-2-50');
    return { 'e2b 2.51.0': current, 'e2b 2.50.0': previous };
}

// An API key in E2B's format: e2b_ and 40 hex digits.
export function newApiKey() {
    return 'e2b_' + randomBytes(20).toString('hex');
}

// Starts `moat serve`. Options: stateDir (reuse one to test a restart), key, args (extra flags),
// env (extra environment), setEnv (default true: point the SDK at it).
export async function startServe(options = {}) {
    const workDir = options.workDir || mkdtempSync(path.join(os.tmpdir(), 'moat-e2b-'));
    const stateDir = options.stateDir || path.join(workDir, 'state');
    const key = options.key || newApiKey();
    const keyFile = path.join(workDir, 'api-key');
    writeFileSync(keyFile, key + '\n', { mode: 0o600 });
    const args = ['serve', '--listen', '127.0.0.1:0', '--envd-listen', '127.0.0.1:0',
        '--api-key-file', keyFile, '--state-dir', stateDir, ...(options.args || [])];
    const child = spawn(moatBinary, args, {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, ...(options.env || {}) },
    });
    let stdout = '';
    let stderr = '';
    child.stderr.on('data', (d) => { stderr += d; });
    const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve(code ?? 128 + (os.constants.signals[signal] || 0))));
    const urls = await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`moat serve printed no listeners in 30 s; stderr: ${stderr}`)), 30_000);
        child.stdout.on('data', (d) => {
            stdout += d;
            const api = /^api (\S+)$/m.exec(stdout);
            const envd = /^envd (\S+)$/m.exec(stdout);
            if (api && envd) {
                clearTimeout(timer);
                resolve({ api: api[1], envd: envd[1] });
            }
        });
        exited.then((code) => {
            clearTimeout(timer);
            reject(new Error(`moat serve exited ${code} before listening; stderr: ${stderr}`));
        });
    });
    const serve = {
        ...urls,
        key,
        keyFile,
        stateDir,
        workDir,
        pid: child.pid,
        child,
        exited,
        stderr: () => stderr,
        stdout: () => stdout,
        // SIGTERM (or `signal`) and the exit code; SIGKILL after `timeoutMs`.
        async stop(signal = 'SIGTERM', timeoutMs = 30_000) {
            if (child.exitCode === null && child.signalCode === null) child.kill(signal);
            const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
            const code = await exited;
            clearTimeout(timer);
            return code;
        },
        // The process ids descended from the server, right now (its sandboxd helper, the
        // sandboxes' processes).
        descendants() {
            return descendantsOf(child.pid);
        },
    };
    if (options.setEnv !== false) pointSdkAt(serve);
    return serve;
}

export function pointSdkAt(serve) {
    process.env.E2B_API_URL = serve.api;
    process.env.E2B_SANDBOX_URL = serve.envd;
    process.env.E2B_API_KEY = serve.key;
    delete process.env.E2B_DEBUG;
}

// Every live process below `pid` on this host ({pid, command}), read from /proc.
export function descendantsOf(pid) {
    const children = new Map();
    for (const entry of readdirSync('/proc')) {
        if (!/^\d+$/.test(entry)) continue;
        let stat;
        try {
            stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
        } catch {
            continue;  // gone meanwhile
        }
        const close = stat.lastIndexOf(')');
        const fields = stat.slice(close + 2).split(' ');
        if (fields[0] === 'Z') continue;  // a zombie has ended
        const parent = Number(fields[1]);
        if (!children.has(parent)) children.set(parent, []);
        children.get(parent).push({ pid: Number(entry), command: stat.slice(stat.indexOf('(') + 1, close) });
    }
    const out = [];
    const queue = [pid];
    while (queue.length) {
        for (const c of children.get(queue.shift()) || []) {
            out.push(c);
            queue.push(c.pid);
        }
    }
    return out;
}

// Whether a process is still alive (not a zombie).
export function isAlive(pid) {
    try {
        const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
        return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
    } catch {
        return false;
    }
}

// Polls `check` until it returns truthy or `timeoutMs` passes; returns the last value.
// Host pids below `pid` (a server's) whose command line contains `needle`.
export function processesBelow(pid, needle) {
    const found = [];
    for (const p of descendantsOf(pid)) {
        let cmdline = '';
        try {
            cmdline = readFileSync(`/proc/${p.pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
        } catch {
            continue;
        }
        if (cmdline.includes(needle)) found.push(p.pid);
    }
    return found;
}

export async function waitFor(check, timeoutMs = 10_000, intervalMs = 50) {
    const end = Date.now() + timeoutMs;
    for (;;) {
        const value = await check();
        if (value || Date.now() >= end) return value;
        await new Promise((r) => setTimeout(r, intervalMs));
    }
}

// Runs the moat CLI itself (moat create / ls / destroy ...) and returns {code, stdout, stderr}.
export function runMoat(args, timeoutMs = 60_000) {
    return new Promise((resolve) => {
        const child = spawn(moatBinary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (d) => { stdout += d; });
        child.stderr.on('data', (d) => { stderr += d; });
        const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
        child.on('exit', (code) => {
            clearTimeout(timer);
            resolve({ code, stdout, stderr });
        });
    });
}

export function removeDir(dir) {
    rmSync(dir, { recursive: true, force: true });
}

// Runs a shell command inside the sandbox (through the moat CLI, which attaches to it) and
// returns its stdout; fails the test when it exits non-zero.
export async function inSandbox(sbx, command) {
    const r = await runMoat(['exec', sbx.sandboxId, '--', '/bin/sh', '-c', command]);
    if (r.code !== 0) throw new Error(`in-sandbox command failed: ${command}: ${r.stderr}`);
    return r.stdout;
}

// A CA and a certificate for `*.<domain>` (and 127.0.0.1, where E2B_SANDBOX_URL may point), as an
// operator would get for their sandbox domain, written to `dir`: {ca, cert, key} paths.
export function wildcardCertificate(dir, domain) {
    const openssl = (...args) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
    openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
        '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=moat test CA');
    openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes',
        '-keyout', 'server.key', '-out', 'server.csr', '-subj', `/CN=*.${domain}`);
    writeFileSync(path.join(dir, 'san.cnf'), `subjectAltName=DNS:*.${domain},DNS:localhost,IP:127.0.0.1\n`);
    openssl('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key',
        '-CAcreateserial', '-out', 'server.pem', '-days', '2', '-extfile', 'san.cnf');
    return { ca: path.join(dir, 'ca.pem'), cert: path.join(dir, 'server.pem'), key: path.join(dir, 'server.key') };
}
