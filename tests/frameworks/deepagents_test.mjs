// Deep Agents (deepagents, on LangGraph) with moat, driven by a scripted chat model against the
// real `moat mcp`, two ways:
//  - moat's tools beside the built-in ones (`moat mcp --tool-prefix moat_`: the built-ins already
//    use read_file and write_file): a Python exception does not throw out of invoke, with no
//    extra middleware;
//  - moat as the agent's sandbox: a small BaseSandbox backend over moat's tools (execute ->
//    run_shell, uploadFiles / downloadFiles -> write_file / read_file with encoding "base64"):
//    exact round trips of text with \r and of binary data, error codes for missing files and
//    directories, the truncated flag, and the built-in edit_file keeping a CRLF file's bytes.
//
//   node tests/frameworks/deepagents_test.mjs build/dev/moat      (ctest runs it)
import assert from 'node:assert/strict';
import {
    assertNoSandboxLeft, check, finish, mcpSandboxes, moatServer, onCleanup, resultJson, startWatchdog,
} from './support.mjs';

startWatchdog(150);
const { MultiServerMCPClient } = await import('@langchain/mcp-adapters');
const { createDeepAgent, BaseSandbox } = await import('deepagents');
const { HumanMessage } = await import('@langchain/core/messages');
const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = await import('@modelcontextprotocol/sdk/client/stdio.js');
const { ScriptedChatModel, textOf, toolMessages } = await import('./scripted_chat_model.mjs');

const before = new Set(await mcpSandboxes());

// ---- moat's tools in a deep agent

const prefixed = new MultiServerMCPClient({
    mcpServers: { moat: { transport: 'stdio', ...moatServer(['--tool-prefix', 'moat_']), stderr: 'inherit' } },
});
onCleanup(() => prefixed.close());
let moatTools;

await check('without a prefix the built-in tools refuse moat\'s names, with --tool-prefix they fit', async () => {
    const plain = new MultiServerMCPClient({ mcpServers: { moat: { transport: 'stdio', ...moatServer(), stderr: 'inherit' } } });
    try {
        const plainTools = await plain.getTools();
        assert.throws(() => createDeepAgent({ model: new ScriptedChatModel([]), tools: plainTools }),
            /conflict with built-in tools/);
    } finally {
        await plain.close();
    }
    moatTools = await prefixed.getTools();
    assert.deepEqual(moatTools.map((t) => t.name).sort(),
        ['moat_list_files', 'moat_list_processes', 'moat_read_file', 'moat_read_process_output',
            'moat_run_python', 'moat_run_shell', 'moat_start_process', 'moat_stop_process',
            'moat_write_file']);
    const runPython = moatTools.find((t) => t.name === 'moat_run_python');
    assert.ok(!/\brun_shell\b/.test(moatTools.find((t) => t.name === 'moat_read_file').description.replace(/moat_run_shell/g, '')),
        'descriptions name the prefixed tools');
    assert.ok(runPython.description.includes('600'), runPython.description);
});

await check('a Python exception does not throw out of invoke, and the agent goes on', async () => {
    const model = new ScriptedChatModel([
        () => ({ tool: 'moat_run_python', args: { code: 'total = 10\n1/0' } }),
        () => ({ tool: 'moat_run_python', args: { code: 'print(total)' } }),
        () => ({ text: 'fixed it' }),
    ]);
    const agent = createDeepAgent({ model, tools: moatTools });
    const out = await agent.invoke({ messages: [new HumanMessage('divide')] }, { recursionLimit: 30 });
    const [failed, after] = toolMessages(out.messages).slice(-2);
    const r = resultJson(textOf(failed));
    assert.equal(r.status, 'error', textOf(failed));
    assert.equal(r.error_type, 'ZeroDivisionError', textOf(failed));
    assert.equal(resultJson(textOf(after)).stdout, '10\n');
    assert.equal(textOf(out.messages.at(-1)), 'fixed it');
});

await prefixed.close();

// ---- moat as a Deep Agents sandbox backend

// A BaseSandbox over moat's MCP tools. moat runs with --retry-ceiling off: the backend's own
// probes (BaseSandbox runs `test -e` before a delete) are not a model retrying.
class MoatSandbox extends BaseSandbox {
    constructor(client) {
        super();
        this.client = client;
        this.id = 'moat';
    }

    async call(name, args) {
        const result = await this.client.callTool({ name, arguments: args });
        const r = JSON.parse(result.content[0].text);
        if (result.isError) throw new Error(`moat ${name}: ${r.message}`);
        return r;
    }

    async execute(command) {
        const r = await this.call('run_shell', { command });
        if (r.status === 'unavailable') throw new Error(`moat: ${r.message}`);
        const output = [r.stdout, r.stderr].filter((s) => s).join('\n');
        return { output, exitCode: r.exit_code ?? null, truncated: r.truncated === true };
    }

    async uploadFiles(files) {
        const results = [];
        for (const [path, bytes] of files) {
            const r = await this.call('write_file',
                { path, content: Buffer.from(bytes).toString('base64'), encoding: 'base64' });
            results.push({ path, error: r.status === 'ok' ? null : (r.error_code ?? 'invalid_path') });
        }
        return results;
    }

    async downloadFiles(paths) {
        const results = [];
        for (const path of paths) {
            const r = await this.call('read_file', { path, encoding: 'base64' });
            if (r.status === 'ok') {
                results.push({ path, content: new Uint8Array(Buffer.from(r.content, 'base64')), error: null });
            } else {
                results.push({ path, content: null, error: r.error_code ?? 'invalid_path' });
            }
        }
        return results;
    }
}

const transport = new StdioClientTransport({ ...moatServer(['--retry-ceiling', 'off']), stderr: 'inherit' });
const client = new Client({ name: 'moat-deepagents-backend', version: '1.0.0' });
await client.connect(transport);
onCleanup(() => client.close());
const sandbox = new MoatSandbox(client);

await check('text with \\r and control characters and binary data round-trip exactly', async () => {
    const text = Buffer.from('line one\r\nline two\r\n\tbell \x07 escape \x1b[31m red\x1b[0m\r\n');
    const binary = Buffer.from(Array.from({ length: 1024 }, (_, i) => (i * 7) % 256));
    const uploaded = await sandbox.uploadFiles([['/workspace/crlf.txt', text], ['/workspace/data.bin', binary]]);
    assert.deepEqual(uploaded.map((u) => u.error), [null, null]);
    const [gotText, gotBinary] = await sandbox.downloadFiles(['/workspace/crlf.txt', '/workspace/data.bin']);
    assert.equal(gotText.error, null);
    assert.ok(Buffer.from(gotText.content).equals(text), Buffer.from(gotText.content).toString('hex'));
    assert.ok(Buffer.from(gotBinary.content).equals(binary), 'the binary file came back changed');
});

await check('missing files and directories get the protocol\'s error codes', async () => {
    await sandbox.execute('mkdir -p /workspace/adir');
    const [missing, directory] = await sandbox.downloadFiles(['/workspace/missing.txt', '/workspace/adir']);
    assert.equal(missing.error, 'file_not_found');
    assert.equal(missing.content, null);
    assert.equal(directory.error, 'is_directory');
    const [onDirectory, readOnly] = await sandbox.uploadFiles(
        [['/workspace/adir', Buffer.from('x')], ['/usr/evil', Buffer.from('x')]]);
    assert.equal(onDirectory.error, 'is_directory');
    assert.equal(readOnly.error, 'permission_denied');
    const read = await sandbox.read('/workspace/missing.txt');
    assert.ok(read.error, JSON.stringify(read));
    const deleted = await sandbox.delete('/workspace/missing.txt');
    assert.ok(deleted.error?.includes('not found'), JSON.stringify(deleted));
});

await check('execute reports exit codes and the truncated flag', async () => {
    const small = await sandbox.execute('echo hi; exit 3');
    assert.deepEqual(small, { output: 'hi\n', exitCode: 3, truncated: false });
    const big = await sandbox.execute('yes line | head -c 1000000');
    assert.equal(big.exitCode, 0);
    assert.equal(big.truncated, true);
    assert.ok(big.output.length < 10_000, `${big.output.length} characters`);
});

await check('a deep agent on the moat backend edits a CRLF file and keeps its other bytes', async () => {
    const model = new ScriptedChatModel([
        () => ({ tool: 'edit_file', args: { file_path: '/workspace/crlf.txt', old_string: 'line two', new_string: 'line 2' } }),
        () => ({ tool: 'execute', args: { command: 'cat -A /workspace/crlf.txt | head -2' } }),
        () => ({ text: 'edited' }),
    ]);
    const agent = createDeepAgent({ model, backend: sandbox });
    const out = await agent.invoke({ messages: [new HumanMessage('edit it')] }, { recursionLimit: 30 });
    assert.equal(textOf(out.messages.at(-1)), 'edited');
    const [edited] = await sandbox.downloadFiles(['/workspace/crlf.txt']);
    assert.ok(Buffer.from(edited.content).equals(
        Buffer.from('line one\r\nline 2\r\n\tbell \x07 escape \x1b[31m red\x1b[0m\r\n')),
        Buffer.from(edited.content).toString('hex'));
    const shown = textOf(toolMessages(out.messages).at(-1));
    assert.ok(shown.includes('line 2^M$'), shown);
});

await check('closing the clients ends moat mcp and its sandboxes', async () => {
    await client.close();
    await assertNoSandboxLeft(before, 'after close');
});

await finish();
