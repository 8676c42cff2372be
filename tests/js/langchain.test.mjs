// @langchain/openai (ChatOpenAI) against chaosllm: every shipped openai.chat recording
// replayed by exact match through invoke and stream (tool calls and response_format
// included), and the main faults as LangChain.js meets them.
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import { AIMessage, HumanMessage, SystemMessage, ToolMessage } from "@langchain/core/messages";
import { ChatOpenAI } from "@langchain/openai";

import { recordings, startServer } from "./server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());
beforeEach(async () => server.reset());

const chat = (options = {}) =>
  new ChatOpenAI({
    apiKey: "sk-test",
    maxRetries: 0,
    configuration: { baseURL: `${server.url}/v1` },
    ...options,
  });

/** A recorded conversation as LangChain messages. */
const messages = (list) =>
  list.map((m) => {
    if (m.role === "system") return new SystemMessage(m.content);
    if (m.role === "user") return new HumanMessage(m.content);
    if (m.role === "tool") return new ToolMessage({ content: m.content, tool_call_id: m.tool_call_id });
    return new AIMessage({
      content: m.content ?? "",
      tool_calls: (m.tool_calls ?? []).map((c) => ({
        id: c.id,
        name: c.function.name,
        args: JSON.parse(c.function.arguments),
        type: "tool_call",
      })),
    });
  });

/** The recording's request as a bound ChatOpenAI, its messages and call options. */
function replaying(recording, options = {}) {
  const body = recording.request.body;
  const model = chat({ model: body.model, temperature: body.temperature, ...options });
  return {
    runnable: body.tools ? model.bindTools(body.tools, { tool_choice: body.tool_choice }) : model,
    input: messages(body.messages),
    call: body.response_format ? { response_format: body.response_format } : {},
  };
}

const callsOf = (calls) => calls.map((c) => [c.name, JSON.stringify(c.args)]);

describe("@langchain/openai replays every openai.chat recording exactly", () => {
  for (const recording of recordings("openai.chat")) {
    const message = recording.response.body.choices[0].message;
    const calls = (message.tool_calls ?? []).map((c) => [
      c.function.name,
      JSON.stringify(JSON.parse(c.function.arguments)),
    ]);
    test(`${recording.name}: invoke`, async () => {
      const { runnable, input, call } = replaying(recording);
      const reply = await runnable.invoke(input, call);
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact", JSON.stringify(entry));
      assert.equal(reply.content, message.content ?? "");
      assert.deepEqual(callsOf(reply.tool_calls), calls);
    });
    test(`${recording.name}: stream`, async () => {
      const { runnable, input, call } = replaying(recording);
      let reply;
      for await (const chunk of await runnable.stream(input, call)) {
        reply = reply ? reply.concat(chunk) : chunk;
      }
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact", JSON.stringify(entry));
      assert.equal(reply.content, message.content ?? "");
      assert.deepEqual(callsOf(reply.tool_calls), calls);
    });
  }
});

describe("the main faults, as @langchain/openai meets them", () => {
  const simple = recordings("openai.chat").find((r) => r.name === "simple-chat/0001");
  const answer = simple.response.body.choices[0].message.content;
  const streamed = async (options) => {
    const { runnable, input } = replaying(simple, options);
    let text = "";
    try {
      for await (const chunk of await runnable.stream(input)) text += chunk.content;
    } catch (error) {
      return { error, text };
    }
    return { error: null, text };
  };
  test("http_503 with maxRetries 2: retried, recovers", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const { runnable, input } = replaying(simple, { maxRetries: 2 });
    const reply = await runnable.invoke(input);
    assert.equal(reply.content, answer);
    assert.deepEqual(
      (await server.requests()).map((r) => r.status),
      [503, 200],
    );
  });
  test("http_429 with retry_after, maxRetries 0: a 429 error, MODEL_RATE_LIMIT", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const { runnable, input } = replaying(simple);
    const error = await runnable.invoke(input).catch((e) => e);
    assert.equal(error.status, 429, String(error));
    assert.equal(error.lc_error_code, "MODEL_RATE_LIMIT");
    assert.equal(error.headers?.get?.("retry-after") ?? error.headers?.["retry-after"], "7");
  });
  test("error_in_200 in a stream: an error after the first chunks", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 2 });
    const { error, text } = await streamed();
    assert.ok(error instanceof Error, String(error));
    assert.ok(text.length < answer.length, JSON.stringify(text));
  });
  test("dropped_connection mid-stream: undici's TypeError terminated", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 2 });
    const { error } = await streamed();
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("connection_reset mid-stream: TypeError terminated", async () => {
    await server.arm({ type: "connection_reset", after_chunks: 2 });
    const { error } = await streamed();
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("stall after the head: the timeout covers the head only, held until max_ms", async () => {
    await server.arm({ type: "stall", after_chunks: 1, max_ms: 1500 });
    const started = Date.now();
    const { error } = await streamed({ timeout: 500 });
    const waited = Date.now() - started;
    assert.ok(waited >= 1400, `waited ${waited} ms`);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
});
