// The Vercel AI SDK as its users run it against the gateway: a tool loop with generateText or
// streamText, through Responses (the default OpenAI model) or Chat Completions.
//   node ai_sdk.mjs BASE_URL responses|chat store|nostore|force generate|stream PROMPT
// (nostore: store false; force: store false, and the SDK told the model reasons, so it asks for
// reasoning.encrypted_content itself, as it does for model names it knows)
// Prints one JSON line: the answer, the steps, the SDK's warnings, the tool's calls.
import { generateText, streamText, tool, stepCountIs } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { z } from 'zod';

const [baseURL, api, storing, how, prompt] = process.argv.slice(2);
globalThis.AI_SDK_LOG_WARNINGS = false; // they are printed in the result instead
const provider = createOpenAI({ baseURL, apiKey: process.env.HARMONYKIT_API_KEY });
const model = api === 'chat' ? provider.chat('gpt-oss-20b') : provider('gpt-oss-20b');
const calls = [];
const tools = {
  lookup: tool({
    description: 'Find a customer by name.',
    inputSchema: z.object({ q: z.string() }),
    execute: async ({ q }) => { calls.push(q); return `found ${q}`; },
  }),
};
const providerOptions = { store: undefined, nostore: { openai: { store: false } },
                          force: { openai: { store: false, forceReasoning: true } } }[storing];
const options = { model, prompt, tools, stopWhen: stepCountIs(4), providerOptions };
let out;
if (how === 'stream') {
  const s = streamText({ ...options, onError: ({ error }) => { throw error; } });
  let streamed = '';
  for await (const piece of s.textStream) streamed += piece;
  out = { text: await s.text, streamed, steps: (await s.steps).length, warnings: (await s.steps).flatMap(x => x.warnings ?? []) };
} else {
  const r = await generateText(options);
  out = { text: r.text, steps: r.steps.length, warnings: r.steps.flatMap(x => x.warnings ?? []) };
}
console.log(JSON.stringify({ ...out, calls }));
