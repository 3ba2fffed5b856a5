// The official e2b JS SDK's side of `moat bench e2b` (src/cli/bench/e2b_bench.hpp): against the
// moat serve that E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY name, create one sandbox, run
// `--warmup` commands, then `--n` commands `--concurrency` at a time through
// sandbox.commands.run(), and print one JSON line: this node process's own CPU time during the
// measured commands (process.cpuUsage(): user and system microseconds, every thread of node),
// their wall time and per-command latencies. The sandbox is killed at the end.
//
//     node e2b_bench.mjs --sdk-dir tests/e2b --n 200 --concurrency 4 --command 'echo hello'
//
// --sdk-dir is the directory whose node_modules holds e2b (tests/e2b, npm ci by
// scripts/install-deps). Exit 0 with the JSON even when commands failed (they are counted);
// exit 2 for bad arguments, 1 when the sandbox could not be created.
import { createRequire } from 'node:module';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

function parseArgs(argv) {
    const o = { sdkDir: '', n: 200, concurrency: 4, warmup: 5, command: 'echo hello' };
    for (let i = 0; i < argv.length; i += 2) {
        const [flag, value] = [argv[i], argv[i + 1]];
        if (value === undefined) throw new Error(`${flag}: missing value`);
        if (flag === '--sdk-dir') o.sdkDir = value;
        else if (flag === '--n') o.n = Number(value);
        else if (flag === '--concurrency') o.concurrency = Number(value);
        else if (flag === '--warmup') o.warmup = Number(value);
        else if (flag === '--command') o.command = value;
        else throw new Error(`unexpected argument ${flag}`);
    }
    for (const k of ['n', 'concurrency', 'warmup']) {
        if (!Number.isInteger(o[k]) || o[k] < (k === 'warmup' ? 0 : 1)) throw new Error(`--${k}: expected a positive integer`);
    }
    if (!o.sdkDir) throw new Error('--sdk-dir is required');
    return o;
}

// Runs `count` commands, `concurrency` at a time; latencies in ms of the successful ones.
async function runCommands(sbx, command, count, concurrency) {
    const latencies = [];
    let failures = 0;
    let firstFailure = '';
    let next = 0;
    async function worker() {
        while (next < count) {
            ++next;
            const start = performance.now();
            try {
                const r = await sbx.commands.run(command, { timeoutMs: 60_000, requestTimeoutMs: 60_000 });
                if (r.exitCode !== 0) throw new Error(`exit code ${r.exitCode}`);
                latencies.push(performance.now() - start);
            } catch (e) {
                ++failures;
                if (!firstFailure) firstFailure = String(e && e.message ? e.message : e).split('\n')[0].slice(0, 200);
            }
        }
    }
    await Promise.all(Array.from({ length: concurrency }, worker));
    return { latencies, failures, firstFailure };
}

let options;
try {
    options = parseArgs(process.argv.slice(2));
} catch (e) {
    console.error(`e2b_bench.mjs: ${e.message}`);
    process.exit(2);
}
const require = createRequire(path.join(path.resolve(options.sdkDir), 'package.json'));
const sdk = await import(pathToFileURL(require.resolve('e2b')).href);

let sbx;
try {
    sbx = await sdk.Sandbox.create({ timeoutMs: 600_000 });
} catch (e) {
    console.error(`e2b_bench.mjs: Sandbox.create: ${e.message}`);
    process.exit(1);
}
try {
    await runCommands(sbx, options.command, options.warmup, 1);
    const cpuBefore = process.cpuUsage();
    const wallStart = performance.now();
    const measured = await runCommands(sbx, options.command, options.n, options.concurrency);
    const wallMs = performance.now() - wallStart;
    const cpu = process.cpuUsage(cpuBefore);
    console.log(JSON.stringify({
        sdk: 'e2b',
        sdk_version: JSON.parse((await import('node:fs')).readFileSync(require.resolve('e2b/package.json'), 'utf8')).version,
        node: process.versions.node,
        n: options.n,
        concurrency: options.concurrency,
        ok: measured.latencies.length,
        failures: measured.failures,
        first_failure: measured.firstFailure,
        cpu_user_us: cpu.user,
        cpu_system_us: cpu.system,
        wall_ms: wallMs,
        latencies_ms: measured.latencies,
    }));
} finally {
    await sbx.kill().catch(() => {});
}
