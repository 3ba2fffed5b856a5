// Google ADK (@google/adk) with moat's tools, driven by a scripted BaseLlm against the real
// `moat mcp`.
//
//   node tests/frameworks/adk_test.mjs build/dev/moat      (ctest runs it)
//
// Stock MCPToolset opens a new MCP session (so a new `moat mcp` and a new sandbox) for every tool
// call, and the Runner closes toolsets after every turn: state is lost between calls. The keyed
// toolset below (the pattern docs/tools.md shows) keeps one MCP session per ADK session, across
// calls and turns, and ends it when the application ends the conversation. (`moat mcp --session
// KEY` comes with shared sessions; until then this is the way.)
import assert from 'node:assert/strict';
import {
    assertNoSandboxLeft, check, finish, mcpSandboxes, moatServer, onCleanup, startWatchdog,
} from './support.mjs';

startWatchdog(150);
const { BaseLlm, BaseToolset, InMemoryRunner, LlmAgent, MCPSessionManager, MCPTool, MCPToolset } =
    await import('@google/adk');

const before = new Set(await mcpSandboxes());
const connection = { type: 'StdioConnectionParams', serverParams: { ...moatServer(), stderr: 'inherit' } };

// ---- the keyed toolset: one moat MCP session per ADK session

// An MCP session kept open across calls and turns until end().
class KeptSession extends MCPSessionManager {
    async createSession() {
        this.session ??= super.createSession();
        return this.session;
    }

    async closeSession() {}  // MCPTool closes after every call: keep it

    async end() {
        const session = this.session;
        this.session = undefined;
        if (session) await super.closeSession(await session);
    }
}

class MoatToolset extends BaseToolset {
    constructor(connectionParams) {
        super([]);
        this.connectionParams = connectionParams;
        this.sessions = new Map();  // "user/session" -> {manager, tools}
    }

    async getTools(context) {
        const key = `${context.userId}/${context.sessionId}`;
        let entry = this.sessions.get(key);
        if (!entry) {
            const manager = new KeptSession(this.connectionParams);
            const tools = manager.createSession()
                .then((client) => client.listTools())
                .then(({ tools: listed }) => listed.map((tool) => new MCPTool(tool, manager)));
            entry = { manager, tools };
            this.sessions.set(key, entry);
        }
        return entry.tools;
    }

    async close() {}  // the Runner calls this after every turn; sessions outlive turns

    // When the conversation is over: its moat mcp exits and destroys its sandbox.
    async endSession(userId, sessionId) {
        const key = `${userId}/${sessionId}`;
        const entry = this.sessions.get(key);
        this.sessions.delete(key);
        await entry?.manager.end();
    }

    async endAll() {
        const entries = [...this.sessions.values()];
        this.sessions.clear();
        await Promise.allSettled(entries.map((entry) => entry.manager.end()));
    }
}

// ---- a scripted model

let nextCallId = 0;
class ScriptedLlm extends BaseLlm {
    constructor(steps) {
        super({ model: 'scripted' });
        this.steps = steps;
        this.position = 0;
    }

    async *generateContentAsync(request) {
        const step = this.steps[this.position];
        if (!step) throw new Error(`the script has no step ${this.position + 1}`);
        this.position += 1;
        const planned = await step(request);
        if (planned.text !== undefined) {
            yield { content: { role: 'model', parts: [{ text: planned.text }] }, turnComplete: true };
            return;
        }
        yield {
            content: {
                role: 'model',
                parts: [{ functionCall: { name: planned.tool, args: planned.args, id: `adk_${++nextCallId}` } }],
            },
        };
    }

    async connect() {
        throw new Error('the scripted model has no live mode');
    }
}

// The result JSON of the last tool call in an LLM request.
function lastResult(request) {
    const responses = request.contents.flatMap((c) => c.parts ?? []).filter((p) => p.functionResponse);
    assert.ok(responses.length > 0, 'no function response in the request');
    const response = responses.at(-1).functionResponse.response;
    const callResult = response.content ? response : response.result;
    assert.equal(callResult.isError ?? false, false, JSON.stringify(callResult));
    return JSON.parse(callResult.content[0].text);
}

async function runTurn(runner, userId, sessionId, text) {
    for await (const event of runner.runAsync({ userId, sessionId, newMessage: { role: 'user', parts: [{ text }] } })) {
        if (event.errorMessage) throw new Error(`ADK: ${event.errorCode} ${event.errorMessage}`);
    }
}

async function runnerWith(model, tools) {
    const agent = new LlmAgent({ name: 'coder', model, instruction: 'Use the tools.', tools: [tools] });
    const runner = new InMemoryRunner({ agent, appName: 'moat-test' });
    return runner;
}

// ---- the checks

await check('stock MCPToolset starts a new moat per call, so variables are lost between calls', async () => {
    const seen = [];
    const model = new ScriptedLlm([
        () => ({ tool: 'run_python', args: { code: 'x = 41' } }),
        (request) => { seen.push(lastResult(request)); return { tool: 'run_python', args: { code: 'print(x)' } }; },
        (request) => { seen.push(lastResult(request)); return { text: 'done' }; },
    ]);
    const stock = new MCPToolset(connection);
    const runner = await runnerWith(model, stock);
    await runner.sessionService.createSession({ appName: 'moat-test', userId: 'u', sessionId: 'stock' });
    await runTurn(runner, 'u', 'stock', 'go');
    assert.equal(seen[0].status, 'ok', JSON.stringify(seen[0]));
    assert.equal(seen[1].error_type, 'NameError', JSON.stringify(seen[1]));
    await stock.close();
    await assertNoSandboxLeft(before, 'after the stock toolset\'s calls');
});

const toolset = new MoatToolset(connection);
onCleanup(() => toolset.endAll());

await check('schema bounds survive ADK\'s Gemini conversion in the description text', async () => {
    const tools = await toolset.getTools({ userId: 'probe', sessionId: 'schema' });
    const python = tools.find((t) => t.name === 'run_python');
    const declaration = python._getDeclaration();
    const timeout = JSON.stringify(declaration.parameters);
    assert.ok(/at most 600/.test(timeout), timeout);
    assert.ok(/at most 600/.test(declaration.description), declaration.description);
    await toolset.endSession('probe', 'schema');
});

await check('the keyed toolset keeps files and variables across calls and turns of one ADK session, ' +
    'and keeps ADK sessions apart', async () => {
    const seen = [];
    const remember = (request) => seen.push(lastResult(request));
    const model = new ScriptedLlm([
        // session A, turn 1: two calls
        () => ({ tool: 'run_python', args: { code: 'x = 41' } }),
        (r) => { remember(r); return { tool: 'write_file', args: { path: 'notes.txt', content: 'kept\n' } }; },
        (r) => { remember(r); return { text: 'turn 1 done' }; },
        // session B, turn 1: a different sandbox
        () => ({ tool: 'run_python', args: { code: 'print(x)' } }),
        (r) => { remember(r); return { text: 'B done' }; },
        // session A, turn 2: after the Runner closed its toolsets
        () => ({ tool: 'run_python', args: { code: 'print(x + 1)' } }),
        (r) => { remember(r); return { tool: 'run_shell', args: { command: 'cat notes.txt' } }; },
        (r) => { remember(r); return { text: 'turn 2 done' }; },
    ]);
    const runner = await runnerWith(model, toolset);
    for (const sessionId of ['a', 'b']) {
        await runner.sessionService.createSession({ appName: 'moat-test', userId: 'u', sessionId });
    }
    await runTurn(runner, 'u', 'a', 'define x and save a note');
    await runTurn(runner, 'u', 'b', 'show x');
    await runTurn(runner, 'u', 'a', 'use x and the note');
    const [defined, written, elsewhere, used, cat] = seen;
    assert.equal(defined.status, 'ok', JSON.stringify(defined));
    assert.equal(written.status, 'ok', JSON.stringify(written));
    assert.equal(elsewhere.error_type, 'NameError', JSON.stringify(elsewhere));
    assert.equal(used.stdout, '42\n', JSON.stringify(used));
    assert.equal(cat.stdout, 'kept\n', JSON.stringify(cat));
    assert.equal((await mcpSandboxes()).filter((id) => !before.has(id)).length, 2, 'one sandbox per ADK session');
});

await check('ending an ADK session ends its moat and sandbox', async () => {
    await toolset.endSession('u', 'b');
    const deadline = Date.now() + 15_000;
    while ((await mcpSandboxes()).filter((id) => !before.has(id)).length !== 1) {
        assert.ok(Date.now() < deadline, 'the ended session\'s sandbox is still running');
        await new Promise((resolve) => setTimeout(resolve, 200));
    }
    await toolset.endAll();
    await assertNoSandboxLeft(before, 'after every session ended');
});

await finish();
