// LangGraph (@langchain/langgraph's prebuilt ReAct agent) with moat's tools through
// @langchain/mcp-adapters, driven by a scripted chat model against the real `moat mcp`.
//
//   node tests/frameworks/langgraph_test.mjs build/dev/moat      (ctest runs it)
//
// Checks: state across turns of one thread, a Python exception the graph continues after (a
// result, not a ToolException), write_file then cat, a runaway model stopped at the graph's
// recursion limit (the retry-ceiling notice on the way), and nothing left after close.
import assert from 'node:assert/strict';
import {
    assertNoSandboxLeft, check, finish, mcpSandboxes, moatServer, onCleanup, resultJson, startWatchdog,
} from './support.mjs';

startWatchdog(120);
const { MultiServerMCPClient } = await import('@langchain/mcp-adapters');
const { createReactAgent } = await import('@langchain/langgraph/prebuilt');
const { MemorySaver, GraphRecursionError } = await import('@langchain/langgraph');
const { HumanMessage } = await import('@langchain/core/messages');
const { ScriptedChatModel, lastToolMessage, textOf, toolMessages } = await import('./scripted_chat_model.mjs');

const before = new Set(await mcpSandboxes());
const client = new MultiServerMCPClient({ mcpServers: { moat: { transport: 'stdio', ...moatServer(), stderr: 'inherit' } } });
onCleanup(() => client.close());
let tools;

await check('the adapter loads the nine tools from moat mcp', async () => {
    tools = await client.getTools();
    assert.deepEqual(tools.map((t) => t.name).sort(),
        ['list_files', 'list_processes', 'read_file', 'read_process_output', 'run_python',
            'run_shell', 'start_process', 'stop_process', 'write_file']);
});

const checkpointer = new MemorySaver();
const thread = { configurable: { thread_id: 'conversation-1' } };
const ask = (model, text, config = thread) =>
    createReactAgent({ llm: model, tools, checkpointSaver: checkpointer })
        .invoke({ messages: [new HumanMessage(text)] }, config);

await check('Python state persists across turns of one thread', async () => {
    const first = new ScriptedChatModel([
        () => ({ tool: 'run_python', args: { code: 'x = 41' } }),
        () => ({ text: 'defined x' }),
    ]);
    const turn1 = await ask(first, 'define x');
    assert.equal(resultJson(lastToolMessage(turn1.messages)).status, 'ok');
    const second = new ScriptedChatModel([
        () => ({ tool: 'run_python', args: { code: 'print(x + 1)' } }),
        (messages) => ({ text: `x + 1 is ${resultJson(lastToolMessage(messages)).stdout.trim()}` }),
    ]);
    const turn2 = await ask(second, 'add one');
    const r = resultJson(lastToolMessage(turn2.messages));
    assert.equal(r.stdout, '42\n', JSON.stringify(r));
    assert.equal(textOf(turn2.messages.at(-1)), 'x + 1 is 42');
});

await check('a Python exception is a result the graph continues after', async () => {
    const model = new ScriptedChatModel([
        () => ({ tool: 'run_python', args: { code: "{'a': 1}['price']" } }),
        () => ({ tool: 'run_python', args: { code: 'print(x)' } }),
        () => ({ text: 'recovered' }),
    ]);
    const out = await ask(model, 'try a key');
    const [failed, after] = toolMessages(out.messages).slice(-2);
    const text = textOf(failed);
    assert.ok(!text.includes('Please fix your mistakes'), text);
    assert.ok(!text.startsWith('Error'), text);
    assert.notEqual(failed.status, 'error', 'the ToolMessage is not marked as an error');
    const r = resultJson(text);
    assert.equal(r.status, 'error', text);
    assert.equal(r.error_type, 'KeyError', text);
    assert.ok(r.traceback.includes("KeyError: 'price'"), text);
    assert.equal(resultJson(after).stdout, '41\n', 'the variables survived the exception');
    assert.equal(textOf(out.messages.at(-1)), 'recovered');
});

await check('write_file then cat shows the same bytes', async () => {
    const content = 'line one\nline two\n';
    const model = new ScriptedChatModel([
        () => ({ tool: 'write_file', args: { path: 'notes/a.txt', content } }),
        () => ({ tool: 'run_shell', args: { command: 'cat /workspace/notes/a.txt' } }),
        () => ({ text: 'done' }),
    ]);
    const out = await ask(model, 'write and show');
    const [written, shown] = toolMessages(out.messages).slice(-2);
    assert.equal(resultJson(written).bytes, content.length);
    assert.equal(resultJson(shown).stdout, content);
});

await check('a runaway model is stopped at the recursion limit, told to stop on the way', async () => {
    const model = new ScriptedChatModel([() => ({ tool: 'run_python', args: { code: '1/0' } })], { repeat: true });
    const agent = createReactAgent({ llm: model, tools, checkpointSaver: checkpointer });
    const config = { configurable: { thread_id: 'runaway' }, recursionLimit: 12 };
    await assert.rejects(agent.invoke({ messages: [new HumanMessage('loop')] }, config),
        (error) => error instanceof GraphRecursionError || error?.name === 'GraphRecursionError');
    assert.ok(model.position <= 7, `the model was called ${model.position} times`);
    const seen = model.seen.at(-1);
    const notices = toolMessages(seen).flatMap((m) => resultJson(m).notices ?? []);
    assert.ok(notices.some((n) => n.includes('stop retrying')), JSON.stringify(notices));
});

await check('closing the client ends moat mcp and its sandbox', async () => {
    assert.ok((await mcpSandboxes()).some((id) => !before.has(id)), 'no sandbox was running before close');
    await client.close();
    await assertNoSandboxLeft(before, 'after close');
});

await finish();
