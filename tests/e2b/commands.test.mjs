// moat serve's envd process service driven by the official e2b SDK, 2.51.0 and 2.50.0: run with
// stdout, stderr, exit codes and CommandExitError; streaming callbacks before the end; timeouts
// that kill; background commands listed, killed, waited and reconnected; stdin; a killed sandbox
// ending its live streams. Every case checks from the host that what it ended is gone.
// Run: node tests/e2b/commands.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { processesBelow, requireSdk, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();

let serve;
before(async () => {
    serve = await startServe();
});
after(async () => {
    if (serve) await serve.stop();
});

// Host pids below the server whose command line contains `needle`.
function hostProcesses(needle) {
    return processesBelow(serve.pid, needle);
}

async function assertGoneFromHost(needle) {
    const left = await waitFor(() => hostProcesses(needle).length === 0, 10_000);
    assert.ok(left, `host processes still running with "${needle}": ${hostProcesses(needle)}`);
}

// A Connect server-stream call: one enveloped request; the response's envelopes, parsed.
async function connectStream(url, headers, message) {
    const json = Buffer.from(JSON.stringify(message));
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(json.length, 1);
    const response = await fetch(url, { method: 'POST', headers, body: Buffer.concat([prefix, json]) });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get('content-type'), 'application/connect+json');
    const body = Buffer.from(await response.arrayBuffer());
    const frames = [];
    for (let at = 0; at < body.length;) {
        const flags = body[at];
        const length = body.readUInt32BE(at + 1);
        frames.push({ flags, message: JSON.parse(body.subarray(at + 5, at + 5 + length).toString()) });
        at += 5 + length;
    }
    return frames;
}

// A unique marker per case, so that host checks never see another case's processes.
let counter = 0;
function marker(version) {
    counter += 1;
    return `${4000 + counter}${version.endsWith('2.51.0') ? 1 : 0}`;
}

for (const [version, sdk] of Object.entries(sdks)) {
    const { Sandbox, CommandExitError, TimeoutError, InvalidArgumentError } = sdk;
    describe(version, () => {
        let sbx;
        before(async () => {
            sbx = await Sandbox.create({ envs: { FROM_CREATE: 'c', OVERRIDDEN: 'create' } });
        });
        after(async () => {
            if (sbx) await sbx.kill();
        });

        test('run returns stdout, stderr and exit codes, and a failure is a CommandExitError', async () => {
            const ok = await sbx.commands.run('echo out; echo err >&2');
            assert.equal(ok.exitCode, 0);
            assert.equal(ok.stdout, 'out\n');
            assert.equal(ok.stderr, 'err\n');

            await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), (e) => {
                assert.ok(e instanceof CommandExitError, `got ${e}`);
                assert.equal(e.exitCode, 3);
                assert.equal(e.message, 'exit status 3');
                assert.equal(e.stdout, 'partial\n');
                assert.equal(e.stderr, 'bad\n');
                return true;
            });

            // envd's environment: HOME, USER, LOGNAME, then the sandbox's, then the request's.
            const env = await sbx.commands.run('echo "$USER $LOGNAME $FROM_CREATE $OVERRIDDEN $FROM_RUN"; pwd', {
                envs: { OVERRIDDEN: 'run', FROM_RUN: 'r' },
                cwd: '/tmp',
            });
            assert.equal(env.stdout, 'user user c run r\n/tmp\n');

            await assert.rejects(sbx.commands.run('true', { cwd: '/no/such/dir' }), (e) => {
                assert.ok(e instanceof InvalidArgumentError, `got ${e}`);
                assert.match(e.message, /cwd '\/no\/such\/dir' does not exist/);
                return true;
            });

            // sudo works as on E2B (moat's shim asks pid 1; tests/e2b/root.test.mjs has more).
            const sudo = await sbx.commands.run('sudo id -u');
            assert.equal(sudo.stdout, '0\n');
        });

        test('a live stream gets every byte of a command that prints faster than it is read', async () => {
            // 8 MiB, eight times the process's output buffer: a client that is attached must get
            // it all (the process waits for it), in order.
            const result = await sbx.commands.run('seq 1 1200000');
            assert.equal(result.stdout.length, 8_488_896);
            const lines = result.stdout.split('\n');
            assert.equal(lines[0], '1');
            assert.equal(lines[1199999], '1200000');
        });

        test('onStdout and onStderr arrive while the command still runs', async () => {
            const flag = `/tmp/go-${marker(version)}`;
            const events = [];
            let created;
            // The command cannot print "done" until the file exists, and the file is made only
            // once the first callback has fired: "done" proves the callback came first.
            const cmd = `echo ready; echo warming >&2; for i in $(seq 200); do [ -e ${flag} ] && break; sleep 0.05; done; [ -e ${flag} ] && echo done`;
            const result = await sbx.commands.run(cmd, {
                onStdout: (s) => {
                    events.push(`out:${s}`);
                    if (s.includes('ready') && !created) created = sbx.commands.run(`touch ${flag}`);
                },
                onStderr: (s) => events.push(`err:${s}`),
            });
            await created;
            assert.equal(result.stdout, 'ready\ndone\n');
            assert.ok(events.includes('err:warming\n'), JSON.stringify(events));
            assert.ok(events.indexOf('out:ready\n') < events.indexOf('out:done\n'), JSON.stringify(events));
        });

        test('a command past its timeout is killed and reported as a timeout', async () => {
            const m = marker(version);
            await assert.rejects(sbx.commands.run(`exec sleep ${m}`, { timeoutMs: 1500 }), (e) => {
                assert.ok(e instanceof TimeoutError, `got ${e}`);
                return true;
            });
            await assertGoneFromHost(`sleep ${m}`);
            // The SDK gives up at its own timer, while the server's kill and the reaping of
            // the killed process may still be in flight (a zombie has no cmdline, so the host
            // check above already passes then): the entry has to leave the list, within a bound.
            const listedWithout = () => sbx.commands.list()
                .then((listed) => !listed.some((p) => p.args.join(' ').includes(`sleep ${m}`)));
            assert.ok(await waitFor(listedWithout, 10_000), `sleep ${m} is still listed`);
        });

        test('background commands are listed, killed and waited, and a dead pid is not found', async () => {
            const m = marker(version);
            const handle = await sbx.commands.run(`exec sleep ${m}`, { background: true });
            assert.ok(handle.pid > 0);
            const listed = await sbx.commands.list();
            const entry = listed.find((p) => p.pid === handle.pid);
            assert.ok(entry, JSON.stringify(listed));
            assert.equal(entry.cmd, '/bin/bash');
            assert.ok(entry.args.join(' ').includes(`sleep ${m}`));
            assert.equal(hostProcesses(`sleep ${m}`).length, 1);

            assert.equal(await sbx.commands.kill(handle.pid), true);
            await assert.rejects(handle.wait(), (e) => {
                assert.ok(e instanceof CommandExitError, `got ${e}`);
                assert.equal(e.exitCode, -1);
                assert.equal(e.error, 'signal: killed');
                return true;
            });
            await assertGoneFromHost(`sleep ${m}`);
            assert.ok(!(await sbx.commands.list()).some((p) => p.pid === handle.pid));
            assert.equal(await sbx.commands.kill(handle.pid), false);
        });

        test('kill answers once the process is gone: kill -0 right after fails, every time', async () => {
            // envd answers a SIGKILL once the process has exited and been reaped; E2B's suite
            // checks with `kill -0` at once (it used to succeed now and then under load).
            for (let round = 0; round < 10; round++) {
                const handle = await sbx.commands.run('sleep 30', { background: true });
                assert.equal(await sbx.commands.kill(handle.pid), true);
                await assert.rejects(sbx.commands.run(`kill -0 ${handle.pid}`), CommandExitError);
            }
        });

        test('a disconnected command runs on, and connect replays its output and its end', async () => {
            const m = marker(version);
            const flag = `/tmp/resume-${m}`;
            let sawFirst;
            const first = new Promise((resolve) => { sawFirst = resolve; });
            const cmd = `echo first; for i in $(seq 200); do [ -e ${flag} ] && break; sleep 0.05; done; echo second; echo third >&2; exit 7`;
            const handle = await sbx.commands.run(cmd, {
                background: true,
                onStdout: (s) => { if (s.includes('first')) sawFirst(); },
            });
            await first;
            await handle.disconnect();
            await sbx.commands.run(`touch ${flag}`);
            // It finishes while nobody listens; its output waits in the process's buffer, which
            // replays its recent output whether a client saw it or not (nothing is lost to the
            // stream that was going away).
            const reattached = await sbx.commands.connect(handle.pid);
            await assert.rejects(reattached.wait(), (e) => {
                assert.ok(e instanceof CommandExitError, `got ${e}`);
                assert.equal(e.exitCode, 7);
                assert.equal(e.stdout, 'first\nsecond\n');
                assert.equal(e.stderr, 'third\n');
                return true;
            });
            // Its end is retained: a later connect gets start and the end again.
            const again = await sbx.commands.connect(handle.pid);
            await assert.rejects(again.wait(), (e) => e instanceof CommandExitError && e.exitCode === 7);
            await assertGoneFromHost(`resume-${m}`);
        });

        test('stdin: sendStdin feeds a command and closeStdin ends its input', async () => {
            const handle = await sbx.commands.run('read first; echo "got $first"; cat; echo eof', {
                background: true,
                stdin: true,
            });
            await sbx.commands.sendStdin(handle.pid, 'hello\n');
            await sbx.commands.sendStdin(handle.pid, 'more\n');
            await sbx.commands.closeStdin(handle.pid);
            const result = await handle.wait();
            assert.equal(result.stdout, 'got hello\nmore\neof\n');
            await assert.rejects(sbx.commands.sendStdin(handle.pid, 'late'), /not found/);
        });

        test('on the wire: keepalives while quiet, one end, the end-stream frame, and envd errors', async () => {
            // The SDK asks for a keepalive every 50 s; a raw Connect call asks for one per second.
            const headers = {
                'content-type': 'application/connect+json',
                'connect-protocol-version': '1',
                'keepalive-ping-interval': '1',
                'e2b-sandbox-id': sbx.sandboxId,
                'x-access-token': sbx.envdAccessToken,
            };
            const start = { process: { cmd: '/bin/bash', args: ['-c', 'sleep 2.5; echo late'] }, stdin: false };
            const frames = await connectStream(`${serve.envd}/process.Process/Start`, headers, start);
            const kinds = frames.map((f) => (f.flags === 2 ? 'end-stream' : Object.keys(f.message.event)[0]));
            assert.equal(kinds[0], 'start');
            assert.ok(kinds.indexOf('keepalive') > 0 && kinds.indexOf('keepalive') < kinds.indexOf('data'), kinds.join());
            assert.deepEqual(kinds.slice(-2), ['end', 'end-stream']);
            assert.equal(kinds.filter((k) => k === 'end').length, 1);
            assert.deepEqual(frames.at(-2).message.event.end, { exited: true, status: 'exit status 0' });
            assert.deepEqual(frames.at(-1).message, {});

            // A pty's output is one stream of `pty` data (tests/e2b/pty.test.mjs drives the SDK).
            const pty = await connectStream(`${serve.envd}/process.Process/Start`, headers,
                { process: { cmd: '/bin/bash', args: ['-c', 'stty size'] }, pty: { size: { cols: 80, rows: 24 } } });
            const ptyKinds = pty.map((f) => (f.flags === 2 ? 'end-stream' : Object.keys(f.message.event)[0]));
            assert.deepEqual([ptyKinds[0], ...ptyKinds.slice(-2)], ['start', 'end', 'end-stream']);
            const ptyData = pty.filter((f) => f.flags === 0 && f.message.event.data).map((f) => f.message.event.data);
            assert.ok(ptyData.length > 0 && ptyData.every((d) => Object.keys(d).join() === 'pty'));
            assert.equal(Buffer.concat(ptyData.map((d) => Buffer.from(d.pty, 'base64'))).toString(), '24 80\r\n');

            await assert.rejects(sbx.commands.connect(999999), /process with pid 999999 not found/);

            // Connect-Timeout-Ms on Connect bounds that stream only: the process runs on.
            const m = marker(version);
            const sleeper = await sbx.commands.run(`exec sleep ${m}`, { background: true, timeoutMs: 0 });
            const bounded = await connectStream(`${serve.envd}/process.Process/Connect`,
                { ...headers, 'connect-timeout-ms': '700' }, { process: { pid: sleeper.pid } });
            assert.equal(Object.keys(bounded[0].message.event)[0], 'start');
            assert.equal(bounded.at(-1).flags, 2);
            assert.equal(bounded.at(-1).message.error.code, 'deadline_exceeded');
            assert.equal(hostProcesses(`sleep ${m}`).length, 1);
            assert.equal(await sbx.commands.kill(sleeper.pid), true);
            await assertGoneFromHost(`sleep ${m}`);
        });

        test("host secrets and the host's loopback services are out of reach from inside", async () => {
            // moat serve itself listens on the host's loopback: from inside, 127.0.0.1 is the
            // sandbox's own loopback, so both ports are closed there. The key file, the server
            // secret and moat's state are host paths the sandbox's root does not contain.
            const ports = [serve.api, serve.envd].map((u) => new URL(u).port);
            const probe = await sbx.commands.run(
                `for p in ${ports.join(' ')}; do python3` + '  -c "import socket,sys; s=socket.socket(); s.settimeout(2)\n' +
                    'try:\n s.connect((\'127.0.0.1\', int(sys.argv[1]))); print(\'open\')\n' +
                    'except OSError as e: print(\'closed\', e.errno)" "$p"; done; ' +
                    'for f in "$KEY" "$SECRET" /run/moat; do [ -e "$f" ] && echo "visible $f" || echo "absent"; done; true',
                { envs: { KEY: serve.keyFile, SECRET: `${serve.stateDir}/secret` } },
            );
            const lines = probe.stdout.trim().split('\n');
            assert.equal(lines.length, 5, probe.stdout);
            for (const line of lines.slice(0, 2)) assert.match(line, /^closed /);
            assert.deepEqual(lines.slice(2), ['absent', 'absent', 'absent']);
            // The probe's own loopback works, so "closed" is not a broken network stack.
            const own = await sbx.commands.run(
                'python3 -c "import socket; a=socket.socket(); a.bind((\'127.0.0.1\', 0)); a.listen(); ' +
                    'b=socket.socket(); b.connect(a.getsockname()); print(\'ok\')"',
            );
            assert.equal(own.stdout, 'ok\n');
            assert.ok(!probe.stdout.includes(serve.key) && !serve.stderr().includes(serve.key));
        });

        test('killing the sandbox ends its live streams at once and its processes with it', async () => {
            const own = await Sandbox.create();
            const m = marker(version);
            const handle = await own.commands.run(`exec sleep ${m}`, { background: true, timeoutMs: 0 });
            // Exactly one, once bash has exec'd it (while a process execs, its cmdline can read
            // empty for a moment).
            assert.ok(await waitFor(() => hostProcesses(`sleep ${m}`).length === 1, 10_000),
                `sleep ${m}: ${hostProcesses(`sleep ${m}`)}`);
            const ended = handle.wait().then(() => 'resolved', (e) => e);
            const killedAt = Date.now();
            assert.equal(await own.kill(), true);
            const outcome = await ended;
            // As on E2B: the stream is cut off (not ended by the process's death), the SDK asks
            // /health, hears 502 and says what happened.
            assert.ok(outcome instanceof TimeoutError, `wait() ${outcome}`);
            assert.match(outcome.message, /sandbox was killed or reached its end of life/);
            assert.ok(Date.now() - killedAt < 10_000, 'the stream outlived its sandbox');
            await assertGoneFromHost(`sleep ${m}`);
        });
    });
}
