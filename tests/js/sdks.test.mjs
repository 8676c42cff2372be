// openai-node (Chat Completions and Responses) and @anthropic-ai/sdk against chaosllm:
// every shipped recording of their protocols replayed by exact match (JSON and streamed,
// tools included), and the main faults as each SDK meets them.
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import Anthropic from "@anthropic-ai/sdk";
import OpenAI, { AzureOpenAI } from "openai";

import { recordings, startServer } from "./server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());
beforeEach(async () => server.reset());

const openai = (options = {}) =>
  new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "sk-test", maxRetries: 0, ...options });
const anthropic = (options = {}) =>
  new Anthropic({ baseURL: server.url, apiKey: "sk-ant-test", maxRetries: 0, ...options });

function chatRequest(recording) {
  const { stream, stream_options, ...body } = recording.request.body;
  return body;
}

describe("openai-node replays every openai.chat recording exactly", () => {
  for (const recording of recordings("openai.chat")) {
    const message = recording.response.body.choices[0].message;
    test(`${recording.name} as JSON`, async () => {
      const { data, response } = await openai()
        .chat.completions.create(chatRequest(recording))
        .withResponse();
      assert.equal(response.headers.get("x-chaosllm-match"), "exact");
      assert.match(data._request_id, /^req_[0-9a-f]{32}$/);
      const got = data.choices[0].message;
      assert.equal(got.content, message.content ?? null);
      assert.deepEqual(
        (got.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
        (message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
      );
    });
    test(`${recording.name} streamed`, async () => {
      const stream = await openai().chat.completions.create({
        ...chatRequest(recording),
        stream: true,
      });
      let content = "";
      const calls = {};
      for await (const chunk of stream) {
        const delta = chunk.choices[0]?.delta ?? {};
        content += delta.content ?? "";
        for (const call of delta.tool_calls ?? []) {
          calls[call.index] ??= ["", ""];
          calls[call.index][0] += call.function?.name ?? "";
          calls[call.index][1] += call.function?.arguments ?? "";
        }
      }
      assert.equal(content, message.content ?? "");
      assert.deepEqual(
        Object.values(calls),
        (message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
      );
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
    });
  }
});

/** What a Responses answer says: its text and its function calls (`output_text` is the
SDK's own, set by `create` only: read from the output items). */
const said = (response) => ({
  text: response.output
    .filter((i) => i.type === "message")
    .flatMap((i) => i.content.map((c) => c.text))
    .join(""),
  calls: response.output
    .filter((i) => i.type === "function_call")
    .map((i) => [i.name, i.arguments, i.call_id]),
});

describe("openai-node replays every openai.responses recording exactly", () => {
  for (const recording of recordings("openai.responses")) {
    const { stream, ...body } = recording.request.body;
    const expected = said(recording.response.body);
    test(`${recording.name} as JSON`, async () => {
      const { data, response } = await openai().responses.create(body).withResponse();
      assert.equal(response.headers.get("x-chaosllm-match"), "exact");
      assert.match(data._request_id, /^req_[0-9a-f]{32}$/);
      assert.deepEqual(said(data), expected);
      assert.equal(data.output_text, expected.text);
    });
    test(`${recording.name} streamed (events, then the final response)`, async () => {
      const events = await openai().responses.create({ ...body, stream: true });
      let text = "";
      const sequence = [];
      let completed;
      for await (const event of events) {
        sequence.push(event.sequence_number);
        if (event.type === "response.output_text.delta") text += event.delta;
        if (event.type === "response.completed") completed = event.response;
      }
      assert.equal(text, expected.text);
      assert.deepEqual(said(completed), expected);
      assert.deepEqual(
        sequence,
        sequence.map((_, i) => i),
      );
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
    });
    test(`${recording.name} through responses.stream().finalResponse()`, async () => {
      const final = await openai().responses.stream(body).finalResponse();
      assert.deepEqual(said(final), expected);
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
    });
  }
});

const azure = () =>
  new AzureOpenAI({
    endpoint: server.url,
    apiKey: "azure-test",
    apiVersion: "2024-10-21",
    deployment: "gpt-4o-mini",
    maxRetries: 0,
  });

describe("openai-node's AzureOpenAI replays every azure.chat and azure.responses recording", () => {
  for (const recording of recordings("azure.chat")) {
    const message = recording.response.body.choices[0].message;
    const calls = (message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]);
    test(`${recording.name} as JSON`, async () => {
      const { data, response } = await azure()
        .chat.completions.create(chatRequest(recording))
        .withResponse();
      assert.equal(response.headers.get("x-chaosllm-match"), "exact");
      assert.ok(response.headers.get("apim-request-id"));
      assert.equal(data.choices[0].message.content, message.content ?? null);
      assert.deepEqual(
        (data.choices[0].message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
        calls,
      );
    });
    test(`${recording.name} streamed`, async () => {
      const stream = await azure().chat.completions.create({
        ...chatRequest(recording),
        stream: true,
      });
      let content = "";
      for await (const chunk of stream) content += chunk.choices[0]?.delta?.content ?? "";
      assert.equal(content, message.content ?? "");
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
    });
  }
  for (const recording of recordings("azure.responses")) {
    const { stream, ...body } = recording.request.body;
    const expected = said(recording.response.body);
    test(`${recording.name} as JSON`, async () => {
      const { data, response } = await azure().responses.create(body).withResponse();
      assert.equal(response.headers.get("x-chaosllm-match"), "exact");
      assert.deepEqual(said(data), expected);
    });
    test(`${recording.name} streamed`, async () => {
      const final = await azure().responses.stream(body).finalResponse();
      assert.deepEqual(said(final), expected);
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
    });
  }
});

describe("@anthropic-ai/sdk replays every anthropic.messages recording exactly", () => {
  for (const recording of recordings("anthropic.messages")) {
    const { stream, ...body } = recording.request.body;
    const blocks = recording.response.body.content.map((b) => [b.type, b.text ?? b.name]);
    test(`${recording.name} as JSON`, async () => {
      const { data, response } = await anthropic().messages.create(body).withResponse();
      assert.equal(response.headers.get("x-chaosllm-match"), "exact");
      assert.match(data._request_id, /^req_011C/);
      assert.deepEqual(
        data.content.map((b) => [b.type, b.text ?? b.name]),
        blocks,
      );
    });
    test(`${recording.name} streamed`, async () => {
      const message = await anthropic().messages.stream(body).finalMessage();
      assert.deepEqual(
        message.content.map((b) => [b.type, b.text ?? b.name]),
        blocks,
      );
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
    });
  }
});

const CHAT = chatRequest(recordings("openai.chat").find((r) => r.name === "simple-chat/0001"));
const MESSAGES = recordings("anthropic.messages").find((r) => r.name === "anthropic-text/0001")
  .request.body;

describe("the main faults, as openai-node meets them", () => {
  test("http_503 is retried and recovers", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const reply = await openai({ maxRetries: 2 }).chat.completions.create(CHAT);
    assert.ok(reply.choices[0].message.content);
    assert.deepEqual(
      (await server.requests()).map((r) => r.status),
      [503, 200],
    );
  });
  test("http_429 with retry_after: a RateLimitError saying its request id", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const error = await openai()
      .chat.completions.create(CHAT)
      .catch((e) => e);
    assert.ok(error instanceof OpenAI.RateLimitError);
    assert.equal(error.headers.get("retry-after"), "7");
    assert.match(error.message, /try again in 7s/);
    assert.match(error.requestID, /^req_/);
  });
  test("error_in_200 in a stream: an APIError after the first chunks", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 2 });
    const stream = await openai().chat.completions.create({ ...CHAT, stream: true });
    let chunks = 0;
    const error = await (async () => {
      for await (const _ of stream) chunks += 1;
    })().catch((e) => e);
    assert.ok(error instanceof OpenAI.APIError, String(error));
    assert.equal(chunks, 2);
  });
  test("dropped_connection mid-stream: undici's TypeError terminated", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 2 });
    const stream = await openai().chat.completions.create({ ...CHAT, stream: true });
    const error = await (async () => {
      for await (const _ of stream);
    })().catch((e) => e);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("stall after the head: the SDK's timeout covers the head only, the stall ends at max_ms", async () => {
    await server.arm({ type: "stall", after_chunks: 1, max_ms: 1500 });
    const started = Date.now();
    const stream = await openai({ timeout: 500 }).chat.completions.create({ ...CHAT, stream: true });
    const error = await (async () => {
      for await (const _ of stream);
    })().catch((e) => e);
    const waited = Date.now() - started;
    assert.ok(waited >= 1400, `waited ${waited} ms`);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("connection_reset mid-stream: TypeError terminated", async () => {
    await server.arm({ type: "connection_reset", after_chunks: 2 });
    const stream = await openai().chat.completions.create({ ...CHAT, stream: true });
    const error = await (async () => {
      for await (const _ of stream);
    })().catch((e) => e);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
});

const RESPONSE = (({ stream, ...body }) => body)(
  recordings("openai.responses").find((r) => r.name === "responses-streaming/0001").request.body,
);

describe("the main faults, as openai-node's Responses API meets them", () => {
  test("http_503 is retried and recovers", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const reply = await openai({ maxRetries: 2 }).responses.create(RESPONSE);
    assert.ok(reply.output_text);
    assert.deepEqual(
      (await server.requests()).map((r) => r.status),
      [503, 200],
    );
  });
  test("http_429 with retry_after: a RateLimitError saying its request id", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const error = await openai()
      .responses.create(RESPONSE)
      .catch((e) => e);
    assert.ok(error instanceof OpenAI.RateLimitError);
    assert.equal(error.headers.get("retry-after"), "7");
    assert.match(error.message, /try again in 7s/);
    assert.match(error.requestID, /^req_/);
  });
  test("error_in_200 in a stream: create yields the error event, numbered in sequence", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 2 });
    const events = await openai().responses.create({ ...RESPONSE, stream: true });
    const sequence = [];
    for await (const event of events) sequence.push([event.type, event.sequence_number]);
    assert.deepEqual(sequence, [
      ["response.created", 0],
      ["response.in_progress", 1],
      ["error", 2],
    ]);
  });
  test("error_in_200: responses.stream().finalResponse() rejects with the event itself", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 2 });
    const error = await openai()
      .responses.stream(RESPONSE)
      .finalResponse()
      .catch((e) => e);
    assert.ok(!(error instanceof Error));
    assert.deepEqual([error.type, error.code, error.sequence_number], ["error", "server_error", 2]);
  });
  test("dropped_connection mid-stream: TypeError terminated", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 2 });
    const events = await openai().responses.create({ ...RESPONSE, stream: true });
    const error = await (async () => {
      for await (const _ of events);
    })().catch((e) => e);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("connection_reset mid-stream: TypeError terminated", async () => {
    await server.arm({ type: "connection_reset", after_chunks: 2 });
    const events = await openai().responses.create({ ...RESPONSE, stream: true });
    const error = await (async () => {
      for await (const _ of events);
    })().catch((e) => e);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("stall after the head: held until max_ms, then TypeError terminated", async () => {
    await server.arm({ type: "stall", after_chunks: 1, max_ms: 1500 });
    const started = Date.now();
    const events = await openai({ timeout: 500 }).responses.create({ ...RESPONSE, stream: true });
    const error = await (async () => {
      for await (const _ of events);
    })().catch((e) => e);
    assert.ok(Date.now() - started >= 1400);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
});

describe("the main faults, as @anthropic-ai/sdk meets them", () => {
  test("http_503 is retried and recovers", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const reply = await anthropic({ maxRetries: 2 }).messages.create(MESSAGES);
    assert.equal(reply.content[0].text, "The capital of France is Paris.");
  });
  test("http_429 with retry_after: a RateLimitError, anthropic-ratelimit headers", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const error = await anthropic()
      .messages.create(MESSAGES)
      .catch((e) => e);
    assert.ok(error instanceof Anthropic.RateLimitError);
    assert.equal(error.headers.get("anthropic-ratelimit-requests-remaining"), "0");
    assert.equal(error.headers.get("x-ratelimit-remaining-requests"), null);
    assert.equal(error.error.request_id, error.requestID);
  });
  test("error_in_200 in a stream: an APIError", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 2 });
    const error = await anthropic()
      .messages.stream(MESSAGES)
      .finalMessage()
      .catch((e) => e);
    assert.ok(error instanceof Anthropic.APIError, String(error));
  });
  test("dropped_connection mid-stream: an error, never a message", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 2 });
    const error = await anthropic()
      .messages.stream(MESSAGES)
      .finalMessage()
      .catch((e) => e);
    assert.ok(error instanceof Anthropic.AnthropicError && /terminated/.test(error.message));
  });
  test("connection_reset mid-stream: AnthropicError terminated", async () => {
    await server.arm({ type: "connection_reset", after_chunks: 2 });
    const error = await anthropic()
      .messages.stream(MESSAGES)
      .finalMessage()
      .catch((e) => e);
    assert.ok(error instanceof Anthropic.AnthropicError && /terminated/.test(error.message));
  });
  test("stall after the head: the timeout covers the head only, held until max_ms", async () => {
    await server.arm({ type: "stall", after_chunks: 1, max_ms: 1500 });
    const started = Date.now();
    const error = await anthropic({ timeout: 500 })
      .messages.stream(MESSAGES)
      .finalMessage()
      .catch((e) => e);
    const waited = Date.now() - started;
    assert.ok(waited >= 1400, `waited ${waited} ms`);
    assert.ok(error instanceof Anthropic.AnthropicError && /terminated/.test(error.message));
  });
});
