// moat serve's Code Interpreter beside its envd, measured with the official SDKs (not a test: run
// by hand, its numbers go to docs/benchmarks.md): one sandbox of the SDK's default template, then
// N alternations of runCode('1+1') (@e2b/code-interpreter, port 49999) and commands.run('true')
// (e2b, envd's process service) on it, after 5 warm-ups each; p50 and p99 of each in ms.
//
//     node tests/e2b/code_interpreter_bench.mjs build/dev/moat [N]
import { requireSdk, startServe } from './harness.mjs';

await requireSdk();
const { Sandbox } = await import('@e2b/code-interpreter');
const n = Number(process.argv[3] || 100);

function percentile(sorted, p) {
    return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

const serve = await startServe();
const sbx = await Sandbox.create();
try {
    const code = [];
    const command = [];
    for (let i = 0; i < 5; ++i) {
        await sbx.runCode('1+1');
        await sbx.commands.run('true');
    }
    for (let i = 0; i < n; ++i) {
        let start = performance.now();
        const run = await sbx.runCode('1+1');
        if (run.text !== '2') throw new Error(`runCode('1+1') gave ${run.text}`);
        code.push(performance.now() - start);
        start = performance.now();
        await sbx.commands.run('true');
        command.push(performance.now() - start);
    }
    for (const [name, values] of [['runCode(1+1)', code], ["commands.run('true')", command]]) {
        values.sort((a, b) => a - b);
        console.log(`${name}: n ${values.length}, p50 ${percentile(values, 0.5).toFixed(2)} ms, p99 ${percentile(values, 0.99).toFixed(2)} ms`);
    }
} finally {
    await sbx.kill();
    await serve.stop();
}
