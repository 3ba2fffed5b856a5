// Runs E2B's own JS SDK test suite (packages/js-sdk/tests of an e2b-dev/E2B checkout, against that
// checkout's SDK source) against a `moat serve` this script starts, and prints what passed and
// failed: the server cases, and apart from them the client cases (the files that mock E2B's API
// with msw, run without moat serve's URLs). A dev tool, not part of scripts/test: the suite is not in this repository and CI has no
// network to fetch it.
//
//     npm ci --prefix tests/e2b/upstream        # once: vitest and the SDK source's dependencies
//     node tests/e2b/upstream/run.mjs build/dev/moat ~/src/E2B [test files or name filters...]
//
// The checkout's packages/js-sdk/{src,tests} are copied to a temporary directory; nothing is
// written to the checkout. The summary (one line per test: pass, fail or skip, with the first
// line of a failure) goes to stdout, and the whole vitest JSON report to
// $MOAT_UPSTREAM_REPORT when set. Exit code: vitest's.
import { spawn } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const [checkout, ...filters] = process.argv.slice(3);
const sdkDir = checkout ? path.join(checkout, 'packages', 'js-sdk') : '';
if (!checkout || !existsSync(path.join(sdkDir, 'tests', 'setup.ts'))) {
    console.error('usage: node run.mjs MOAT_BINARY E2B_CHECKOUT [test files or name filters...]');
    process.exit(2);
}
if (!existsSync(path.join(here, 'node_modules', 'vitest'))) {
    console.error(`no ${here}/node_modules: run npm ci --prefix ${here}`);
    process.exit(2);
}
const { startServe, wildcardCertificate } = await import('../harness.mjs');

const work = mkdtempSync(path.join(os.tmpdir(), 'moat-upstream-'));
for (const part of ['src', 'tests', 'package.json', 'tsconfig.json']) {
    if (existsSync(path.join(sdkDir, part))) cpSync(path.join(sdkDir, part), path.join(work, part), { recursive: true });
}
cpSync(path.join(here, 'vitest.config.mts'), path.join(work, 'vitest.moat.mts'));
cpSync(path.join(here, 'sandbox_hosts.setup.ts'), path.join(work, 'tests', 'moat_sandbox_hosts.setup.ts'));
symlinkSync(path.join(here, 'node_modules'), path.join(work, 'node_modules'));

// The files that mock E2B's API with msw test the client alone: they run in a pass of their own
// without moat serve's URLs (which would send their requests past the mocks). The rest talk to
// the server this script starts.
const testFiles = readdirSync(path.join(work, 'tests'), { recursive: true })
    .filter((f) => f.endsWith('.test.ts') && !/^(runtimes|template)\//.test(f))
    .map((f) => path.join('tests', f));
const mocked = testFiles.filter((f) => /from ['"]msw/.test(readFileSync(path.join(work, f), 'utf8')));
const chosen = (files) => files.filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)));
const vitest = path.join(here, 'node_modules', 'vitest', 'vitest.mjs');

async function pass(files, env, report) {
    if (files.length === 0) return 0;
    const child = spawn(process.execPath, [vitest, 'run', '--config', 'vitest.moat.mts', '--reporter=json',
        `--outputFile=${report}`, ...files], { cwd: work, stdio: ['ignore', 'ignore', 'inherit'], env });
    return await new Promise((resolve) => child.on('exit', (c) => resolve(c ?? 128)));
}

function summarize(label, report) {
    const counts = { passed: 0, failed: 0, skipped: 0 };
    if (!existsSync(report)) return counts;
    const json = JSON.parse(readFileSync(report, 'utf8'));
    for (const file of json.testResults) {
        const name = path.relative(work, file.name);
        if (file.assertionResults.length === 0 && file.status === 'failed') {
            counts.failed++;
            console.log(`fail  [${label}] ${name}: ${(file.message || '').split('\n')[0]}`);
        }
        for (const t of file.assertionResults) {
            const status = t.status === 'passed' ? 'pass' : t.status === 'failed' ? 'fail' : 'skip';
            counts[status === 'pass' ? 'passed' : status === 'fail' ? 'failed' : 'skipped']++;
            const why = status === 'fail' ? ': ' + (t.failureMessages[0] || '').split('\n')[0].slice(0, 300) : '';
            console.log(`${status}  [${label}] ${name} > ${t.fullName}${why}`);
        }
    }
    return counts;
}

const clientEnv = { ...process.env };
for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_DOMAIN']) delete clientEnv[name];
const clientReport = path.join(work, 'client.json');
const clientCode = await pass(chosen(mocked), clientEnv, clientReport);

// The suite builds URLs and host names from E2B_DOMAIN and reaches each sandbox over https at
// <port>-<id>.<domain>, as on E2B: serve answers them for --domain, with a wildcard certificate
// the test workers trust, and sandbox_hosts.setup.ts sends those names to serve's envd listener
// (the wildcard DNS record of a real deployment). No E2B_SANDBOX_URL: envd calls go by name too.
const domain = 'moat.test';
const certificates = wildcardCertificate(mkdtempSync(path.join(work, 'tls-')), domain);
const serve = await startServe({ setEnv: false,
    args: ['--domain', domain, '--tls-cert', certificates.cert, '--tls-key', certificates.key] });
const serverEnv = { ...process.env, E2B_DOMAIN: domain, E2B_API_URL: serve.api, E2B_API_KEY: serve.key,
    NODE_EXTRA_CA_CERTS: certificates.ca, MOAT_UPSTREAM_SANDBOX_HOSTS: new URL(serve.envd).host };
delete serverEnv.E2B_SANDBOX_URL;
delete serverEnv.E2B_DEBUG;
const serverReport = path.join(work, 'server.json');
const serverCode = await pass(chosen(testFiles.filter((f) => !mocked.includes(f))), serverEnv, serverReport);
const served = await serve.stop();

const client = summarize('client', clientReport);
const server = summarize('server', serverReport);
if (process.env.MOAT_UPSTREAM_REPORT) {
    for (const [label, report] of [['client', clientReport], ['server', serverReport]]) {
        if (existsSync(report)) cpSync(report, `${process.env.MOAT_UPSTREAM_REPORT}.${label}.json`);
    }
}
console.log(`server cases: ${server.passed} passed, ${server.failed} failed, ${server.skipped} skipped (moat serve exited ${served})`);
console.log(`client cases (API mocked, no server): ${client.passed} passed, ${client.failed} failed, ${client.skipped} skipped`);
rmSync(work, { recursive: true, force: true });
process.exit(serverCode || clientCode);
