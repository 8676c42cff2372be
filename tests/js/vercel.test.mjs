// The Vercel AI SDK (`ai` with @ai-sdk/openai, @ai-sdk/anthropic, @ai-sdk/google) against
// chaosllm: shipped recordings replayed by exact match through generateText and
// streamText, and the main faults.
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import { createAnthropic } from "@ai-sdk/anthropic";
import { createGoogleGenerativeAI } from "@ai-sdk/google";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

import { recordings, startServer } from "./server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());
beforeEach(async () => server.reset());

const recording = (provider, name) => recordings(provider).find((r) => r.name === name);
const openai = () => createOpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-test" });
const anthropic = () => createAnthropic({ baseURL: `${server.url}/v1`, apiKey: "sk-ant-test" });
const google = () => createGoogleGenerativeAI({ baseURL: `${server.url}/v1beta`, apiKey: "test" });

/** The AI SDK's arguments for a recorded conversation (system, then the turns). */
function prompt(messages) {
  const system = messages.find((m) => m.role === "system")?.content;
  return { system, messages: messages.filter((m) => m.role !== "system") };
}

const CASES = [
  {
    name: "openai.chat simple-chat/0001",
    model: () => openai().chat("gpt-4o-mini"),
    recorded: recording("openai.chat", "simple-chat/0001"),
    args: (r) => ({ ...prompt(r.request.body.messages), temperature: 0.7 }),
    text: (r) => r.response.body.choices[0].message.content,
  },
  {
    name: "openai.responses responses-streaming/0001 (openai()'s default API)",
    model: () => openai()("gpt-4.1-mini"),
    recorded: recording("openai.responses", "responses-streaming/0001"),
    args: (r) => ({ prompt: r.request.body.input[0].content }),
    text: (r) =>
      r.response.body.output.find((i) => i.type === "message").content[0].text,
  },
  {
    name: "anthropic.messages anthropic-text/0001",
    model: () => anthropic()("claude-sonnet-4-6"),
    recorded: recording("anthropic.messages", "anthropic-text/0001"),
    args: (r) => ({
      system: r.request.body.system,
      messages: r.request.body.messages,
      maxOutputTokens: r.request.body.max_tokens,
    }),
    text: (r) => r.response.body.content[0].text,
  },
  {
    name: "gemini gemini-text/0001",
    model: () => google()("gemini-2.5-flash"),
    recorded: recording("gemini.generate_content", "gemini-text/0001"),
    args: (r) => ({ prompt: r.request.body.contents[0].parts[0].text }),
    text: (r) => r.response.body.candidates[0].content.parts.map((p) => p.text).join(""),
  },
];

describe("the AI SDK replays shipped recordings exactly", () => {
  for (const c of CASES) {
    test(`${c.name}: generateText`, async () => {
      const { text } = await generateText({ model: c.model(), ...c.args(c.recorded) });
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact", JSON.stringify(entry));
      assert.equal(text, c.text(c.recorded));
    });
    test(`${c.name}: streamText`, async () => {
      const result = streamText({ model: c.model(), ...c.args(c.recorded) });
      let text = "";
      for await (const piece of result.textStream) text += piece;
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact", JSON.stringify(entry));
      assert.equal(text, c.text(c.recorded));
    });
  }
});

describe("the main faults, as the AI SDK meets them", () => {
  const [chat] = CASES;
  test("http_503: retried (maxRetries 2 by default), recovers", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const { text } = await generateText({ model: chat.model(), ...chat.args(chat.recorded) });
    assert.equal(text, chat.text(chat.recorded));
    assert.deepEqual(
      (await server.requests()).map((r) => r.status),
      [503, 200],
    );
  });
  test("http_429 with retry_after and maxRetries 0: APICallError 429", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const error = await generateText({
      model: chat.model(),
      maxRetries: 0,
      ...chat.args(chat.recorded),
    }).catch((e) => e);
    assert.equal(error.statusCode, 429, String(error));
    assert.equal(error.responseHeaders["retry-after"], "7");
  });
  test("dropped_connection mid-stream: the stream errors", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 2 });
    const result = streamText({ model: chat.model(), maxRetries: 0, ...chat.args(chat.recorded) });
    const error = await (async () => {
      for await (const _ of result.fullStream) {
        if (_.type === "error") throw _.error;
      }
    })().catch((e) => e);
    assert.ok(error instanceof Error, String(error));
  });
});
