// @google/genai against chaosllm: every shipped gemini.generate_content recording replayed
// by exact match (JSON and streamed, tools included), and the main faults.
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import { GoogleGenAI } from "@google/genai";

import { recordings, startServer } from "./server.mjs";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());
beforeEach(async () => server.reset());

const client = () =>
  new GoogleGenAI({ apiKey: "test", httpOptions: { baseUrl: server.url, apiVersion: "v1" } });

/** The SDK's arguments for a recorded REST body. */
function argumentsOf(recording) {
  const { model, contents, systemInstruction, tools, generationConfig } = recording.request.body;
  const config = { ...(generationConfig ?? {}) };
  if (systemInstruction) config.systemInstruction = systemInstruction;
  if (tools) {
    config.tools = tools.map((tool) => ({
      functionDeclarations: tool.functionDeclarations.map((f) => ({
        name: f.name,
        description: f.description,
        parameters: f.parameters,
        parametersJsonSchema: f.parameters_json_schema ?? f.parametersJsonSchema,
        responseJsonSchema: f.response_json_schema ?? f.responseJsonSchema,
      })),
    }));
  }
  return { model, contents, config };
}

function parts(candidates) {
  return candidates[0].content.parts.map((p) =>
    p.functionCall ? ["call", p.functionCall.name, p.functionCall.args] : ["text", p.text],
  );
}

describe("@google/genai replays every gemini recording exactly", () => {
  for (const recording of recordings("gemini.generate_content")) {
    const answer = recording.response.body;
    const expected = Array.isArray(answer) ? null : parts(answer.candidates);
    test(`${recording.name} as JSON`, async () => {
      const reply = await client().models.generateContent(argumentsOf(recording));
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
      if (expected) assert.deepEqual(parts(reply.candidates), expected);
      else assert.ok(reply.text);
    });
    test(`${recording.name} streamed`, async () => {
      let text = "";
      for await (const chunk of await client().models.generateContentStream(
        argumentsOf(recording),
      )) {
        text += chunk.text ?? "";
      }
      const [entry] = (await server.requests()).slice(-1);
      assert.equal(entry.match, "exact");
      if (expected && expected[0][0] === "text") assert.equal(text, expected[0][1]);
    });
  }
});

const TEXT = argumentsOf(recordings("gemini.generate_content").find((r) => r.name === "gemini-text/0001"));

const STREAM = argumentsOf(
  recordings("gemini.generate_content").find((r) => r.name === "gemini-stream/0001"),
);

/** The chunks of a stream and how it ended (an error, or none). */
async function streamed(args, options = {}) {
  const chunks = [];
  const started = Date.now();
  try {
    const genai = new GoogleGenAI({
      apiKey: "test",
      httpOptions: { baseUrl: server.url, apiVersion: "v1", ...options },
    });
    for await (const chunk of await genai.models.generateContentStream(args)) chunks.push(chunk);
  } catch (error) {
    return { chunks, error, waited: Date.now() - started };
  }
  return { chunks, error: null, waited: Date.now() - started };
}

describe("the main faults, as @google/genai meets them", () => {
  test("error_in_200 mid-stream: 1.30 yields the error as an empty chunk, no error", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 1 });
    const { chunks, error } = await streamed(STREAM);
    assert.equal(error, null);
    assert.equal(chunks.length, 2);
    assert.ok(chunks[0].text);
    assert.equal(chunks[1].candidates, undefined);
    assert.equal(chunks[1].text, undefined);
    // What was sent: the google.rpc.Status in an SSE event, as the API sends it.
    const [entry] = (await server.requests()).slice(-1);
    assert.equal(entry.fault?.type ?? entry.fault, "error_in_200", JSON.stringify(entry.fault));
  });
  test("connection_reset mid-stream: TypeError terminated", async () => {
    await server.arm({ type: "connection_reset", after_chunks: 1 });
    const { error } = await streamed(STREAM);
    assert.ok(error instanceof TypeError && /terminated/.test(error.message), String(error));
  });
  test("stall after the head: httpOptions.timeout covers the whole stream (AbortError)", async () => {
    await server.arm({ type: "stall", after_chunks: 1, max_ms: 3000 });
    const { chunks, error, waited } = await streamed(STREAM, { timeout: 500 });
    assert.equal(chunks.length, 1);
    assert.equal(error?.name, "AbortError", String(error));
    assert.ok(waited >= 450 && waited < 2500, `waited ${waited} ms`);
  });
  test("http_503: an ApiError 503 (no retry by default)", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const error = await client().models.generateContent(TEXT).catch((e) => e);
    assert.equal(error.status, 503);
    assert.deepEqual(
      (await server.requests()).map((r) => r.status),
      [503],
    );
  });
  test("http_429 with retry_after: RESOURCE_EXHAUSTED, the wait as google.rpc.RetryInfo", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const error = await client().models.generateContent(TEXT).catch((e) => e);
    assert.equal(error.status, 429);
    const body = JSON.parse(error.message.slice(error.message.indexOf("{")));
    assert.equal(body.error.status, "RESOURCE_EXHAUSTED");
    assert.ok(body.error.details.some((d) => d.retryDelay === "7s"));
  });
  test("dropped_connection mid-stream: TypeError terminated", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 1 });
    const error = await (async () => {
      for await (const _ of await client().models.generateContentStream(TEXT));
    })().catch((e) => e);
    assert.ok(error instanceof Error && /terminated/.test(error.message), String(error));
  });
});
