// moat serve's terminals driven by the official e2b SDK 2.51.0 (sandbox.pty): a pty of the
// requested size running python3 REPL lines, a resize seen by `stty size`, ^C interrupting a sleep
// without ending the shell, a reattach (pty.connect) after the first client disconnected, and a
// kill that ends it (gone from the host too). On the wire, output comes as `pty` data.
// Run: node tests/e2b/pty.test.mjs build/dev/moat
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { processesBelow, requireSdk, startServe, waitFor } from './harness.mjs';

const sdks = await requireSdk();
const { Sandbox, CommandExitError } = sdks['e2b 2.51.0'];

let serve;
before(async () => {
    serve = await startServe();
});
after(async () => {
    if (serve) await serve.stop();
});


// What a pty printed, decoded as the SDK's users do, with a wait for text.
function screen() {
    const decoder = new TextDecoder();
    const s = {
        text: '',
        onData: (bytes) => { s.text += decoder.decode(bytes, { stream: true }); },
        async until(needle, from = 0) {
            const seen = await waitFor(() => s.text.indexOf(needle, from) >= 0, 20_000);
            assert.ok(seen, `"${needle}" did not appear; the screen: ${JSON.stringify(s.text)}`);
        },
    };
    return s;
}

test('a pty runs REPL lines, resizes, takes ^C, is reattached and killed', async () => {
    const sbx = await Sandbox.create();
    try {
        const first = screen();
        const pty = await sbx.pty.create({ cols: 100, rows: 30, onData: first.onData, timeoutMs: 0 });
        assert.ok(pty.pid > 0);
        const encoder = new TextEncoder();
        const send = (text) => sbx.pty.sendInput(pty.pid, encoder.encode(text));
        // (Expected text that the typed line's own echo does not contain.)
        await send('test -t 0 && echo tty-$((1 + 1)); echo $TERM-$((2 + 2))\n');
        await first.until('tty-2');
        await first.until('xterm-256color-4');
        let from = first.text.length;
        await send('stty size\n');
        await first.until('30 100', from);
        await sbx.pty.resize(pty.pid, { cols: 120, rows: 40 });
        from = first.text.length;
        await send('stty size\n');
        await first.until('40 120', from);

        await send('python3 -q\n');
        await first.until('>>> ');
        from = first.text.length;
        await send('print(6*7)\n');
        await first.until('42', from);
        await send('exit()\n');

        // ^C interrupts the foreground sleep, not the shell.
        await send('sleep 30; echo SLEPT-$((1 + 1))\n');
        await waitFor(() => processesBelow(serve.pid, 'sleep 30').length === 1, 10_000);
        assert.equal(processesBelow(serve.pid, 'sleep 30').length, 1);
        await send('\x03');
        from = first.text.length;
        await send('echo after-$((2 + 2))\n');
        await first.until('after-4', from);
        assert.ok(!first.text.includes('SLEPT-2'));

        // The first client goes; the terminal runs on and is reattached by its pid.
        await pty.disconnect();
        const second = screen();
        const again = await sbx.pty.connect(pty.pid, { onData: second.onData, timeoutMs: 0 });
        assert.equal(again.pid, pty.pid);
        await send('echo reattached-$((3 + 3))\n');
        await second.until('reattached-6');
        assert.ok((await sbx.commands.list()).some((p) => p.pid === pty.pid));

        assert.equal(await sbx.pty.kill(pty.pid), true);
        await assert.rejects(again.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1);
        const gone = await waitFor(() => processesBelow(serve.pid, 'bash -i -l').length === 0, 10_000);
        assert.ok(gone, `host processes left: ${processesBelow(serve.pid, 'bash -i -l')}`);
        assert.equal(await sbx.pty.kill(pty.pid), false);
    } finally {
        await sbx.kill();
    }
});

test('a pty ends with its shell, and pty input or a resize of a plain command is refused', async () => {
    const sbx = await Sandbox.create();
    try {
        const s = screen();
        const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: s.onData, timeoutMs: 0 });
        await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('exit 5\n'));
        await assert.rejects(pty.wait(), (e) => e instanceof CommandExitError && e.exitCode === 5);

        const plain = await sbx.commands.run('sleep 60', { background: true, timeoutMs: 0 });
        await assert.rejects(sbx.pty.sendInput(plain.pid, new TextEncoder().encode('x')), /tty not assigned/);
        await assert.rejects(sbx.pty.resize(plain.pid, { cols: 90, rows: 30 }), /tty not assigned/);
        assert.equal(await sbx.commands.kill(plain.pid), true);
    } finally {
        await sbx.kill();
    }
});
