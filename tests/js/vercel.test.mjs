// The Vercel AI SDK (`ai` with @ai-sdk/openai, @ai-sdk/anthropic, @ai-sdk/google) against
// chaosllm: every shipped recording of its protocols replayed by exact match through
// generateText and streamText (generateObject and streamObject for a response_format),
// tool calls included, the SDK's own tool loop reaching the second turn of each tool
// recording, and the main faults.
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";

import { createAnthropic } from "@ai-sdk/anthropic";
import { createGoogleGenerativeAI } from "@ai-sdk/google";
import { createOpenAI } from "@ai-sdk/openai";
import {
  generateObject,
  generateText,
  jsonSchema,
  stepCountIs,
  streamObject,
  streamText,
  tool,
} from "ai";

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

/** AI SDK tools (no `execute`: the calls come back to the caller) from recorded ones. */
const sdkTools = (list, spec) =>
  list &&
  Object.fromEntries(
    list.map((t) => {
      const { name, description, parameters } = spec(t);
      return [name, tool({ description, inputSchema: jsonSchema(parameters) })];
    }),
  );

const toolCall = (id, name, input, providerOptions) => ({
  type: "tool-call",
  toolCallId: id,
  toolName: name,
  input,
  ...(providerOptions && { providerOptions }),
});
const toolResult = (id, name, value) => ({
  role: "tool",
  content: [{ type: "tool-result", toolCallId: id, toolName: name, output: { type: "text", value } }],
});

// -- each protocol's recorded request as the AI SDK's arguments, and what it answered ----

function chatCase(r) {
  const body = r.request.body;
  const names = {};
  const [first, ...rest] = body.messages;
  const messages = (first.role === "system" ? rest : body.messages).map((m) => {
    if (m.role === "assistant" && m.tool_calls) {
      const parts = m.content ? [{ type: "text", text: m.content }] : [];
      for (const c of m.tool_calls) {
        names[c.id] = c.function.name;
        parts.push(toolCall(c.id, c.function.name, JSON.parse(c.function.arguments)));
      }
      return { role: "assistant", content: parts };
    }
    if (m.role === "tool") return toolResult(m.tool_call_id, names[m.tool_call_id], m.content);
    return { role: m.role, content: m.content };
  });
  const format = body.response_format?.json_schema;
  const message = r.response.body.choices[0].message;
  return {
    model: () => openai().chat(body.model),
    args: {
      system: first.role === "system" ? first.content : undefined,
      messages,
      temperature: body.temperature,
      tools: sdkTools(body.tools, (t) => t.function),
      ...(format && {
        schema: jsonSchema(format.schema),
        schemaName: format.name,
        providerOptions: { openai: { strictJsonSchema: format.strict } },
      }),
    },
    object: !!format,
    text: message.content ?? "",
    refusal: message.refusal,
    calls: (message.tool_calls ?? []).map((c) => [c.function.name, c.function.arguments]),
  };
}

function responsesCase(r) {
  const body = r.request.body;
  const items = typeof body.input === "string" ? [{ role: "user", content: body.input }] : body.input;
  const names = {};
  const messages = items.map((i) => {
    if (i.type === "function_call") {
      names[i.call_id] = i.name;
      const options = { openai: { itemId: i.id } };
      return { role: "assistant", content: [toolCall(i.call_id, i.name, JSON.parse(i.arguments), options)] };
    }
    if (i.type === "function_call_output") return toolResult(i.call_id, names[i.call_id], i.output);
    return { role: i.role, content: i.content };
  });
  const output = r.response.body.output;
  return {
    model: () => openai()(body.model),
    args: {
      messages,
      tools: sdkTools(body.tools, (t) => t),
      providerOptions: {
        openai: {
          instructions: body.instructions,
          strictJsonSchema: body.tools?.[0]?.strict,
          reasoningEffort: body.reasoning?.effort,
          reasoningSummary: body.reasoning?.summary,
        },
      },
    },
    text: output
      .filter((i) => i.type === "message")
      .flatMap((i) => i.content.map((c) => c.text))
      .join(""),
    calls: output.filter((i) => i.type === "function_call").map((i) => [i.name, i.arguments]),
  };
}

function anthropicCase(r) {
  const body = r.request.body;
  const names = {};
  const messages = body.messages.map((m) => {
    if (typeof m.content === "string") return { role: m.role, content: m.content };
    if (m.content.every((c) => c.type === "tool_result")) {
      const [c] = m.content;
      return toolResult(c.tool_use_id, names[c.tool_use_id], c.content);
    }
    return {
      role: m.role,
      content: m.content.map((c) => {
        if (c.type !== "tool_use") return { type: "text", text: c.text };
        names[c.id] = c.name;
        return toolCall(c.id, c.name, c.input);
      }),
    };
  });
  const content = r.response.body.content;
  return {
    model: () => anthropic()(body.model),
    args: {
      system: body.system,
      messages,
      maxOutputTokens: body.max_tokens,
      tools: sdkTools(body.tools, (t) => ({ ...t, parameters: t.input_schema })),
      ...(body.thinking && {
        providerOptions: {
          anthropic: { thinking: { type: "enabled", budgetTokens: body.thinking.budget_tokens } },
        },
      }),
    },
    text: content
      .filter((b) => b.type === "text")
      .map((b) => b.text)
      .join(""),
    calls: content.filter((b) => b.type === "tool_use").map((b) => [b.name, JSON.stringify(b.input)]),
  };
}

/** A recorded OpenAPI Schema (google-genai writes `type: "OBJECT"`) as the JSON Schema an
 * AI SDK user writes (`type: "object"`): the SDK sends it back as an OpenAPI Schema. */
function jsonSchemaOf(schema) {
  const { type, properties, items, ...rest } = schema;
  return {
    ...rest,
    ...(type && { type: type.toLowerCase() }),
    ...(properties && {
      properties: Object.fromEntries(
        Object.entries(properties).map(([k, v]) => [k, jsonSchemaOf(v)]),
      ),
    }),
    ...(items && { items: jsonSchemaOf(items) }),
  };
}

const geminiTools = (body) =>
  body.tools?.[0]?.functionDeclarations?.map((f) => ({
    name: f.name,
    description: f.description,
    parameters: jsonSchemaOf(f.parameters),
  }));

function geminiCase(r) {
  const body = r.request.body;
  const messages = body.contents.map((c) => {
    if (c.parts.every((p) => p.functionResponse)) {
      return {
        role: "tool",
        content: c.parts.map(({ functionResponse: f }) => ({
          type: "tool-result",
          toolCallId: f.id,
          toolName: f.name,
          output: { type: "json", value: f.response.content },
        })),
      };
    }
    if (c.role === "model") {
      return {
        role: "assistant",
        content: c.parts.map((p) =>
          p.functionCall
            ? toolCall(p.functionCall.id, p.functionCall.name, p.functionCall.args)
            : { type: "text", text: p.text },
        ),
      };
    }
    return { role: "user", content: c.parts.map((p) => p.text).join("") };
  });
  const parts = r.response.body.candidates[0].content.parts;
  return {
    model: () => google()(body.model),
    args: {
      system: body.systemInstruction?.parts.map((p) => p.text).join(""),
      messages,
      temperature: body.generationConfig?.temperature,
      tools: sdkTools(geminiTools(body), (t) => t),
    },
    text: parts
      .filter((p) => p.text !== undefined)
      .map((p) => p.text)
      .join(""),
    calls: parts
      .filter((p) => p.functionCall)
      .map((p) => [p.functionCall.name, JSON.stringify(p.functionCall.args)]),
  };
}

const PROTOCOLS = [
  ["openai.chat", chatCase, () => true],
  ["openai.responses", responsesCase, () => true],
  ["anthropic.messages", anthropicCase, () => true],
  ["gemini.generate_content", geminiCase, () => true],
];

async function lastEntry() {
  const [entry] = (await server.requests()).slice(-1);
  return entry;
}

const callsOf = (list) => list.map((c) => [c.toolName, JSON.stringify(c.input)]);

for (const [provider, make, replayed] of PROTOCOLS) {
  describe(`the AI SDK replays every ${provider} recording exactly`, () => {
    for (const r of recordings(provider).filter(replayed)) {
      const c = make(r);
      if (c.object) {
        test(`${r.name}: generateObject`, async () => {
          const result = await generateObject({ model: c.model(), maxRetries: 0, ...c.args }).then(
            (done) => done.object,
            (error) => error,
          );
          assert.equal((await lastEntry()).match, "exact");
          if (c.refusal) {
            assert.equal(result.name, "AI_NoObjectGeneratedError", String(result));
          } else {
            assert.deepEqual(result, JSON.parse(c.text));
          }
        });
        test(`${r.name}: streamObject`, async () => {
          const result = streamObject({ model: c.model(), maxRetries: 0, ...c.args });
          for await (const _ of result.partialObjectStream);
          const object = await result.object.catch((error) => error);
          assert.equal((await lastEntry()).match, "exact");
          if (c.refusal) assert.equal(object.name, "AI_NoObjectGeneratedError", String(object));
          else assert.deepEqual(object, JSON.parse(c.text));
        });
        continue;
      }
      test(`${r.name}: generateText`, async () => {
        const result = await generateText({ model: c.model(), maxRetries: 0, ...c.args });
        const entry = await lastEntry();
        assert.equal(entry.match, "exact", JSON.stringify(entry));
        assert.equal(result.text, c.text);
        assert.deepEqual(callsOf(result.toolCalls), c.calls);
      });
      test(`${r.name}: streamText`, async () => {
        const result = streamText({ model: c.model(), maxRetries: 0, ...c.args });
        let text = "";
        const calls = [];
        for await (const part of result.fullStream) {
          if (part.type === "error") throw part.error;
          if (part.type === "text-delta") text += part.text;
          if (part.type === "tool-call") calls.push(part);
        }
        const entry = await lastEntry();
        assert.equal(entry.match, "exact", JSON.stringify(entry));
        assert.equal(text, c.text);
        assert.deepEqual(callsOf(calls), c.calls);
      });
    }
  });
}

// -- the SDK's own tool loop: its second request is the recorded second turn ------------

/** The recorded tool answers of a second turn, by call id and in order. */
function executing(outputs) {
  let next = 0;
  return async () => outputs[next++];
}

const LOOPS = [
  {
    name: "openai.chat tool-call (openai.chat())",
    provider: "openai.chat",
    scenario: "tool-call",
    model: (b) => openai().chat(b.model),
    first: (b) => ({ system: b.messages[0].content, prompt: b.messages[1].content }),
    tools: (b) => b.tools.map((t) => t.function),
    outputs: (b) => b.messages.filter((m) => m.role === "tool").map((m) => m.content),
  },
  {
    name: "openai.chat parallel-tools (two calls in one turn)",
    provider: "openai.chat",
    scenario: "parallel-tools",
    model: (b) => openai().chat(b.model),
    first: (b) => ({ system: b.messages[0].content, prompt: b.messages[1].content }),
    tools: (b) => b.tools.map((t) => t.function),
    outputs: (b) => b.messages.filter((m) => m.role === "tool").map((m) => m.content),
  },
  {
    name: "openai.responses responses-tools (openai(): the call sent back as an item_reference)",
    provider: "openai.responses",
    scenario: "responses-tools",
    model: (b) => openai()(b.model),
    first: (b) => ({
      prompt: b.input[0].content,
      providerOptions: { openai: { strictJsonSchema: true } },
    }),
    tools: (b) => b.tools,
    outputs: (b) =>
      b.input.filter((i) => i.type === "function_call_output").map((i) => JSON.parse(i.output)),
  },
  {
    name: "anthropic.messages anthropic-tools",
    provider: "anthropic.messages",
    scenario: "anthropic-tools",
    model: (b) => anthropic()(b.model),
    first: (b) => ({ prompt: b.messages[0].content, maxOutputTokens: b.max_tokens }),
    tools: (b) => b.tools.map((t) => ({ ...t, parameters: t.input_schema })),
    outputs: (b) => b.messages.at(-1).content.map((c) => c.content),
  },
  {
    name: "gemini.generate_content gemini-tools (the call answered by its id)",
    provider: "gemini.generate_content",
    scenario: "gemini-tools",
    model: (b) => google()(b.model),
    first: (b) => ({ prompt: b.contents[0].parts[0].text }),
    tools: geminiTools,
    outputs: (b) => b.contents.at(-1).parts.map((p) => p.functionResponse.response.content),
  },
];

describe("the AI SDK's tool loop replays both turns of each tool recording exactly", () => {
  for (const loop of LOOPS) {
    const [one, two] = recordings(loop.provider).filter((r) =>
      r.name.startsWith(`${loop.scenario}/`),
    );
    const args = () => {
      const body = one.request.body;
      const execute = executing(loop.outputs(two.request.body));
      return {
        model: loop.model(body),
        maxRetries: 0,
        stopWhen: stepCountIs(2),
        tools: Object.fromEntries(
          loop.tools(body).map((t) => [
            t.name,
            tool({ description: t.description, inputSchema: jsonSchema(t.parameters), execute }),
          ]),
        ),
        ...loop.first(body),
      };
    };
    const expectJournal = async () =>
      assert.deepEqual(
        (await server.requests()).map((e) => [e.recording, e.match]),
        [
          [one.name, "exact"],
          [two.name, "exact"],
        ],
      );
    test(`${loop.name}: generateText`, async () => {
      const result = await generateText(args());
      await expectJournal();
      assert.equal(result.steps.length, 2);
      assert.ok(result.text.length > 0);
    });
    test(`${loop.name}: streamText`, async () => {
      const result = streamText(args());
      for await (const part of result.fullStream) if (part.type === "error") throw part.error;
      await expectJournal();
      assert.equal((await result.steps).length, 2);
    });
  }
});

// -- the main faults ------------------------------------------------------------------------

describe("the main faults, as the AI SDK meets them", () => {
  const chat = chatCase(recording("openai.chat", "simple-chat/0001"));
  const stream = (options = {}) =>
    streamText({ model: chat.model(), maxRetries: 0, ...chat.args, ...options });
  /** The stream's error: an error part, or (a cut stream) thrown by the iteration. */
  const streamError = async (result) => {
    let text = "";
    try {
      for await (const part of result.fullStream) {
        if (part.type === "error") return { error: part.error, text, as: "part" };
        if (part.type === "text-delta") text += part.text;
      }
    } catch (error) {
      return { error, text, as: "thrown" };
    }
    return { error: null, text };
  };
  test("http_503: retried (maxRetries 2 by default), recovers", async () => {
    await server.arm({ type: "http_503", retry_after: 0.05 });
    const { text } = await generateText({ model: chat.model(), ...chat.args });
    assert.equal(text, chat.text);
    assert.deepEqual(
      (await server.requests()).map((r) => r.status),
      [503, 200],
    );
  });
  test("http_429 with retry_after and maxRetries 0: APICallError 429", async () => {
    await server.arm({ type: "http_429", retry_after: 7 });
    const error = await generateText({ model: chat.model(), maxRetries: 0, ...chat.args }).catch(
      (e) => e,
    );
    assert.equal(error.statusCode, 429, String(error));
    assert.equal(error.responseHeaders["retry-after"], "7");
    assert.equal(error.isRetryable, true);
  });
  test("error_in_200 in a stream: an error part after the first text", async () => {
    await server.arm({ type: "error_in_200", after_chunks: 2 });
    const { error, text, as } = await streamError(stream());
    assert.equal(as, "part", String(error));
    assert.ok(text.length > 0 && text.length < chat.text.length, JSON.stringify(text));
  });
  /** The AI SDK wraps undici's `TypeError: terminated` in an APICallError. */
  const terminated = (error) => {
    assert.equal(error?.name, "AI_APICallError", String(error));
    assert.equal(error.message, "Failed to process successful response");
    assert.ok(error.cause instanceof TypeError && /terminated/.test(error.cause.message));
  };
  test("dropped_connection mid-stream: an APICallError, its cause TypeError terminated", async () => {
    await server.arm({ type: "dropped_connection", after_chunks: 2 });
    const { error, as } = await streamError(stream());
    terminated(error);
    assert.equal(as, "thrown");
  });
  test("connection_reset mid-stream: an APICallError, its cause TypeError terminated", async () => {
    await server.arm({ type: "connection_reset", after_chunks: 2 });
    const { error, as } = await streamError(stream());
    terminated(error);
    assert.equal(as, "thrown");
  });
  test("stall after the head: no timeout of its own, held until max_ms", async () => {
    await server.arm({ type: "stall", after_chunks: 1, max_ms: 1500 });
    const started = Date.now();
    const { error, as } = await streamError(stream());
    assert.equal(as, "thrown");
    const waited = Date.now() - started;
    assert.ok(waited >= 1400, `waited ${waited} ms`);
    terminated(error);
  });
});
