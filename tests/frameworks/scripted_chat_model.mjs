// A LangChain chat model that plays a script instead of calling a model API: each step is a
// function of the conversation so far that returns a tool call ({tool, args}), several
// ({calls: [...]}) or a final answer ({text}). It records every message it was shown, so a test
// can read what the tools returned. `repeat` makes the last step run forever (a runaway model).
import { BaseChatModel } from '@langchain/core/language_models/chat_models';
import { AIMessage } from '@langchain/core/messages';

let nextCallId = 0;

export class ScriptedChatModel extends BaseChatModel {
    constructor(steps, { repeat = false } = {}) {
        super({});
        this.steps = steps;
        this.repeat = repeat;
        this.position = 0;
        this.seen = [];  // the messages of every model call, in order
        this.boundTools = [];
    }

    _llmType() {
        return 'scripted';
    }

    // The agent binds its tools; the script already knows which ones it calls.
    bindTools(tools) {
        this.boundTools = tools.map((t) => t.name ?? t.function?.name);
        return this;
    }

    async _generate(messages) {
        this.seen.push(messages);
        if (this.position >= this.steps.length && !this.repeat) {
            throw new Error(`the script has no step ${this.position + 1}`);
        }
        const step = this.steps[Math.min(this.position, this.steps.length - 1)];
        this.position += 1;
        const planned = await step(messages);
        let message;
        if (planned.text !== undefined) {
            message = new AIMessage({ content: planned.text });
        } else {
            const calls = planned.calls ?? [planned];
            message = new AIMessage({
                content: '',
                tool_calls: calls.map((c) => ({
                    name: c.tool, args: c.args, id: `call_${++nextCallId}`, type: 'tool_call',
                })),
            });
        }
        return { generations: [{ message, text: typeof message.content === 'string' ? message.content : '' }] };
    }
}

// The ToolMessages in a conversation, newest last.
export function toolMessages(messages) {
    return messages.filter((m) => (m._getType?.() ?? m.type) === 'tool');
}

export function lastToolMessage(messages) {
    const found = toolMessages(messages);
    return found[found.length - 1];
}

export function textOf(message) {
    const content = message.content;
    if (typeof content === 'string') return content;
    return content.map((b) => (typeof b === 'string' ? b : b.text ?? '')).join('');
}
