// tests/clients/anthropic_sdk_test.mjs: drives a running `k3serve serve` through the official
// Anthropic TypeScript SDK (npm "@anthropic-ai/sdk", installed by scripts/fetch_test_data.sh into
// .testdata/anthropic-sdk) on the Anthropic Messages API: messages.create (string and block
// content, system strings and blocks with cache_control, stop reasons, usage with cache tokens,
// greedy determinism, the prefix cache), messages.stream and the raw event order, tools and tool
// results, thinking configurations and thinking history, count_tokens, the beta path
// (?beta=true, anthropic-beta), the SDK's error classes, and an aborted stream.
//
//   node tests/clients/anthropic_sdk_test.mjs --base-url http://127.0.0.1:8000 [--model k3-tiny]
//        [--sdk-dir .testdata/anthropic-sdk] [--api-key KEY] [--only SUBSTRING]
//
// --base-url is the server root (the SDK adds /v1/messages itself). The server is expected to
// serve a model with random weights (the bundled k3-tiny), so the checks assert on structure and
// compare the server against itself (greedy twice, streamed vs not, count_tokens vs usage), never
// against known text. One line per check; exits 1 when any check fails.
import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { randomBytes } from "node:crypto";
import { parseArgs, checker, metric as harnessMetric, eventually } from "./harness.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = parseArgs("anthropic_sdk_test.mjs", { "base-url": "http://127.0.0.1:8000", model: "k3-tiny", "sdk-dir": path.join(here, "../../.testdata/anthropic-sdk"),
               "api-key": "unused", only: "" });
const serverRoot = args["base-url"].replace(/\/$/, "").replace(/\/v1$/, "");
const MODEL = args.model;

const sdkEntry = path.join(path.resolve(args["sdk-dir"]), "node_modules/@anthropic-ai/sdk/index.mjs");
let Anthropic;
try {
  Anthropic = (await import(pathToFileURL(sdkEntry).href)).default;
} catch (e) {
  console.error(`cannot load the Anthropic SDK from ${sdkEntry} (run scripts/fetch_test_data.sh): ${e.message}`);
  process.exit(3);
}
const sdkVersion = (await import(pathToFileURL(path.join(path.dirname(sdkEntry), "version.mjs")).href)).VERSION;
// Every request the SDK sends, so that a check can see the URL and headers it used.
const sent = [];
const recordingFetch = (url, init) => {
  sent.push({ url: String(url), headers: new Headers(init?.headers) });
  return fetch(url, init);
};
// No retries: a retried 5xx would hide a server fault; a hung request fails the check. The SDK
// sends apiKey as "Authorization: Bearer KEY" (Claude Code sends x-api-key: both must work).
const client = new Anthropic({ baseURL: serverRoot, apiKey: args["api-key"], maxRetries: 0, timeout: 60_000,
                               openTelemetry: false, fetch: recordingFetch });

// ---- check runner ----

const { check, finish } = checker(args.only);

// ---- helpers ----

const metric = (name) => harnessMetric(serverRoot, name);
// Runs `fn`, which must throw the SDK error class `cls` with `status` and an Anthropic error body
// ({"type": "error", "error": {"type": errorType, "message": ...}}); returns the error.
async function expectApiError(cls, status, errorType, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e && e.constructor && e.constructor.name}: ${e && e.message}`);
    assert.equal(e.status, status);
    assert.equal(e.error?.type, "error", `the body is an Anthropic error: ${JSON.stringify(e.error)}`);
    assert.equal(e.error?.error?.type, errorType, JSON.stringify(e.error));
    assert.equal(e.type, errorType, "the SDK reads error.type");
    assert.equal(typeof e.error.error.message, "string");
    assert.ok(e.error.error.message.length > 0);
    return e;
  }
  assert.fail(`expected ${cls.name} (${status}), but the request succeeded`);
}

const STOP_REASONS = ["end_turn", "max_tokens", "stop_sequence", "tool_use"];
const BLOCK_TYPES = ["text", "thinking", "redacted_thinking", "tool_use"];
function checkUsage(u) {
  for (const k of ["input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]) {
    assert.ok(Number.isInteger(u?.[k]) && u[k] >= 0, `usage.${k}: ${JSON.stringify(u)}`);
  }
  assert.ok(promptTokens(u) > 0, JSON.stringify(u));
}
// The whole prompt: input_tokens counts only what was neither read from nor written to the cache.
const promptTokens = (u) => u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;
function checkBlock(b, toolNames = []) {
  assert.ok(BLOCK_TYPES.includes(b.type), `block type ${b.type}`);
  if (b.type === "text") assert.equal(typeof b.text, "string");
  if (b.type === "thinking") {
    assert.equal(typeof b.thinking, "string", JSON.stringify(b));
    assert.equal(typeof b.signature, "string", JSON.stringify(b));
  }
  if (b.type === "redacted_thinking") assert.equal(typeof b.data, "string");
  if (b.type === "tool_use") {
    assert.ok(typeof b.id === "string" && b.id.length > 0, JSON.stringify(b));
    assert.ok(toolNames.includes(b.name), `tool_use of ${b.name}, not one of ${toolNames}`);
    assert.ok(b.input !== null && typeof b.input === "object" && !Array.isArray(b.input), `input ${JSON.stringify(b.input)}`);
  }
}
// Checks a Message (non-streamed, or folded from a stream) and returns it.
function checkMessage(m, { maxTokens, toolNames = [] } = {}) {
  assert.equal(m.type, "message");
  assert.match(m.id, /^msg_/);
  assert.equal(m.role, "assistant");
  assert.equal(m.model, MODEL);
  assert.ok(Array.isArray(m.content), JSON.stringify(m));
  for (const b of m.content) checkBlock(b, toolNames);
  assert.ok(STOP_REASONS.includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  if (m.stop_reason !== "stop_sequence") assert.equal(m.stop_sequence ?? null, null);
  if (m.stop_reason === "tool_use") assert.ok(m.content.some((b) => b.type === "tool_use"), "tool_use without a tool_use block");
  checkUsage(m.usage);
  if (maxTokens !== undefined) {
    assert.ok(m.usage.output_tokens <= maxTokens, `${m.usage.output_tokens} output tokens over max_tokens ${maxTokens}`);
    if (m.stop_reason === "max_tokens") assert.equal(m.usage.output_tokens, maxTokens);
  }
  return m;
}
// A block as a comparison sees it (ids and signatures may differ between two requests).
const plainBlock = (b) => b.type === "text" ? { type: b.type, text: b.text } : b.type === "thinking" ? { type: b.type, thinking: b.thinking }
  : b.type === "tool_use" ? { type: b.type, name: b.name, input: b.input } : { type: b.type };
const plainContent = (m) => m.content.map(plainBlock);
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

// Checks the order of a stream's events as the SDK yields them (it drops pings) -- message_start;
// per block content_block_start, its deltas, content_block_stop, with matching indexes 0, 1, ...;
// message_delta; message_stop -- and folds them into the Message they describe.
function foldEvents(events) {
  assert.ok(events.length >= 3, `only ${events.length} event(s)`);
  assert.equal(events[0].type, "message_start", "the first event");
  const m = structuredClone(events[0].message);
  assert.equal(m.type, "message");
  assert.match(m.id, /^msg_/);
  assert.equal(m.role, "assistant");
  assert.equal(m.model, MODEL);
  assert.deepEqual(m.content, [], "message_start has no content yet");
  assert.equal(m.stop_reason ?? null, null, "message_start has no stop_reason yet");
  assert.ok(Number.isInteger(m.usage?.input_tokens) && Number.isInteger(m.usage?.output_tokens), JSON.stringify(m.usage));
  let open = null, delta = null, stopped = false, json = "";
  for (const ev of events.slice(1)) {
    assert.ok(!stopped, `${ev.type} after message_stop`);
    if (ev.type === "content_block_start") {
      assert.equal(open, null, `block ${ev.index} starts while block ${open} is open`);
      assert.equal(delta, null, "content_block_start after message_delta");
      assert.equal(ev.index, m.content.length, "blocks are numbered 0, 1, 2, ...");
      const b = structuredClone(ev.content_block);
      assert.ok(BLOCK_TYPES.includes(b.type), `block type ${b.type}`);
      if (b.type === "text") assert.equal(b.text, "", "a text block starts empty");
      if (b.type === "thinking") assert.equal(b.thinking, "", "a thinking block starts empty");
      if (b.type === "tool_use") assert.deepEqual(b.input, {}, "a tool_use block starts with input {}");
      m.content.push(b);
      open = ev.index;
      json = "";
    } else if (ev.type === "content_block_delta") {
      assert.equal(ev.index, open, "a delta belongs to the open block");
      const b = m.content[open], d = ev.delta;
      const want = { text_delta: "text", thinking_delta: "thinking", signature_delta: "thinking", input_json_delta: "tool_use" }[d.type];
      assert.equal(want, b.type, `${d.type} in a ${b.type} block`);
      if (d.type === "text_delta") { assert.equal(typeof d.text, "string"); b.text += d.text; }
      if (d.type === "thinking_delta") { assert.equal(typeof d.thinking, "string"); b.thinking += d.thinking; }
      if (d.type === "signature_delta") { assert.equal(typeof d.signature, "string"); b.signature = d.signature; }
      if (d.type === "input_json_delta") { assert.equal(typeof d.partial_json, "string"); json += d.partial_json; }
    } else if (ev.type === "content_block_stop") {
      assert.equal(ev.index, open, "content_block_stop closes the open block");
      if (m.content[open].type === "tool_use" && json) m.content[open].input = JSON.parse(json);
      open = null;
    } else if (ev.type === "message_delta") {
      assert.equal(open, null, "message_delta while a block is open");
      assert.equal(delta, null, "one message_delta");
      delta = ev;
      assert.ok(STOP_REASONS.includes(ev.delta?.stop_reason), `message_delta stop_reason ${ev.delta?.stop_reason}`);
      assert.ok(Number.isInteger(ev.usage?.output_tokens), `message_delta usage ${JSON.stringify(ev.usage)}`);
      m.stop_reason = ev.delta.stop_reason;
      m.stop_sequence = ev.delta.stop_sequence ?? null;
      for (const [k, v] of Object.entries(ev.usage)) if (v != null) m.usage[k] = v;  // totals, not increments
    } else if (ev.type === "message_stop") {
      assert.notEqual(delta, null, "message_delta before message_stop");
      stopped = true;
    } else {
      assert.fail(`unexpected event ${JSON.stringify(ev).slice(0, 200)}`);
    }
  }
  assert.ok(stopped, "the stream ends with message_stop");
  return m;
}
async function collect(stream) {
  const events = [];
  for await (const ev of stream) events.push(ev);
  return events;
}
// The raw SSE of a streamed POST /v1/messages: [{event, data}] (data parsed).
async function rawStream(body) {
  const r = await fetch(serverRoot + "/v1/messages", { method: "POST", body: JSON.stringify({ ...body, stream: true }), headers: {
    "Content-Type": "application/json", "anthropic-version": "2023-06-01", "x-api-key": args["api-key"] } });
  assert.equal(r.status, 200, await r.clone().text());
  assert.match(r.headers.get("content-type") ?? "", /^text\/event-stream/);
  const blocks = (await r.text()).replace(/\r\n/g, "\n").split("\n\n").filter((b) => b.trim().length);
  return blocks.map((b) => {
    const lines = b.split("\n").filter((l) => !l.startsWith(":"));
    const ev = lines.find((l) => l.startsWith("event:"));
    const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.replace(/^data: ?/, "")).join("\n");
    return { event: ev ? ev.replace(/^event: ?/, "") : null, data: JSON.parse(data) };
  });
}

const msg = (text) => [{ role: "user", content: text }];
const nonce = () => randomBytes(6).toString("hex");
const tools = [
  { name: "get_weather", description: "Current weather in a city",
    input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  { name: "get_time", description: "Local time", input_schema: { type: "object", properties: {} } },
];
const toolNames = tools.map((t) => t.name);
const PNG_1x1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

// A 3-character window of printable ASCII from the middle of `text` (for stop sequences), or null.
function asciiWindow(text) {
  for (let k = Math.floor(text.length / 2); k + 3 <= text.length; k++) {
    const w = text.slice(k, k + 3);
    if (/^[\x21-\x7e]{3}$/.test(w)) return w;
  }
  return null;
}

// ---- checks ----

console.log(`Anthropic SDK ${sdkVersion} against ${serverRoot} (model ${MODEL})`);

const greedyBody = { model: MODEL, max_tokens: 24, temperature: 0, messages: msg("Say hello " + nonce()) };
let greedy;  // the non-streamed greedy message, reused below

await check("messages.create basic: string content, message shape, usage, greedy determinism", async () => {
  greedy = checkMessage(await client.messages.create(greedyBody), { maxTokens: 24 });
  const again = checkMessage(await client.messages.create(greedyBody), { maxTokens: 24 });
  assert.deepEqual(plainContent(again), plainContent(greedy), "temperature 0 twice: the same content");
  assert.equal(again.stop_reason, greedy.stop_reason);
  assert.equal(again.usage.output_tokens, greedy.usage.output_tokens);
  assert.equal(promptTokens(again.usage), promptTokens(greedy.usage), "the same prompt");
  assert.notEqual(again.id, greedy.id, "each message has its own id");
});

await check("messages.create: system as a string and as text blocks with cache_control, content blocks", async () => {
  const user = "Greet me " + nonce();
  const base = { model: MODEL, max_tokens: 8, temperature: 0 };
  const none = await client.messages.create({ ...base, messages: msg(user) });
  const asString = checkMessage(await client.messages.create({ ...base, system: "You are terse.", messages: msg(user) }));
  const asBlocks = checkMessage(await client.messages.create({ ...base, messages: msg(user),
    system: [{ type: "text", text: "You are terse.", cache_control: { type: "ephemeral" } }] }));
  assert.ok(promptTokens(asString.usage) > promptTokens(none.usage), "the system prompt is part of the prompt");
  assert.equal(promptTokens(asBlocks.usage), promptTokens(asString.usage), "one text block renders as the string");
  assert.deepEqual(plainContent(asBlocks), plainContent(asString));
  const two = checkMessage(await client.messages.create({ ...base, messages: msg(user), system: [
    { type: "text", text: "You are terse." }, { type: "text", text: "Answer in English.", cache_control: { type: "ephemeral", ttl: "1h" } }] }));
  assert.ok(promptTokens(two.usage) > promptTokens(asString.usage));
  const blocks = checkMessage(await client.messages.create({ ...base, messages: [{ role: "user", content: [
    { type: "text", text: "First part." }, { type: "text", text: user, cache_control: { type: "ephemeral" } }] }] }));
  assert.ok(promptTokens(blocks.usage) > promptTokens(none.usage), "both text blocks are in the prompt");
  const turns = checkMessage(await client.messages.create({ ...base, messages: [
    { role: "user", content: "Hi." }, { role: "assistant", content: [{ type: "text", text: "Hello." }] }, { role: "user", content: user }] }));
  assert.ok(promptTokens(turns.usage) > promptTokens(none.usage), "the earlier turns are in the prompt");
});

await check("max_tokens: 1 gives stop_reason max_tokens and output_tokens 1", async () => {
  // A fixed prompt at temperature 0: the answer is the same on every run against the same model.
  const r = checkMessage(await client.messages.create({ model: MODEL, max_tokens: 1, temperature: 0, messages: msg("Count to ten.") }));
  assert.equal(r.stop_reason, "max_tokens");
  assert.equal(r.usage.output_tokens, 1);
});

await check("stop_sequences: the text ends before the sequence, stop_reason stop_sequence", async () => {
  let base, full, stop;
  for (let k = 0; k < 4 && !stop; k++) {
    base = { model: MODEL, max_tokens: 40, temperature: 0, messages: msg(`Tell a story ${k} ${nonce()}`) };
    full = textOf(await client.messages.create(base));
    stop = asciiWindow(full);
  }
  assert.ok(stop, "no greedy answer held 3 printable ASCII characters in a row");
  const cut = checkMessage(await client.messages.create({ ...base, stop_sequences: [stop, "\u0000never"] }));
  assert.equal(textOf(cut), full.slice(0, full.indexOf(stop)), `stop ${JSON.stringify(stop)} in ${JSON.stringify(full)}`);
  assert.equal(cut.stop_reason, "stop_sequence");
  assert.equal(cut.stop_sequence, stop);
  const f = foldEvents(await collect(await client.messages.create({ ...base, stop_sequences: [stop], stream: true })));
  assert.equal(textOf(f), textOf(cut), "streamed: the same text (the sequence is never sent)");
  assert.equal(f.stop_reason, "stop_sequence");
  assert.equal(f.stop_sequence, stop);
});

await check("prefix cache: a repeated long prompt reads most of it from the cache (cache_read_input_tokens)", async () => {
  const long = `${nonce()} document: ` + Array.from({ length: 40 }, (_, i) => `line ${i} of the shared prefix.`).join(" ");
  const body = { model: MODEL, max_tokens: 2, temperature: 0, messages: msg(long) };
  const first = checkMessage(await client.messages.create(body));
  assert.ok(promptTokens(first.usage) > 256, `prompt of ${promptTokens(first.usage)} tokens`);
  // Only the template's preamble, if anything, is shared with earlier requests.
  assert.ok(first.usage.cache_read_input_tokens < promptTokens(first.usage) / 4, `a fresh prompt: ${JSON.stringify(first.usage)}`);
  const hitsBefore = await metric("vllm:prefix_cache_hits_total");
  const second = checkMessage(await client.messages.create(body));
  const total = promptTokens(second.usage), cached = second.usage.cache_read_input_tokens;
  assert.equal(total, promptTokens(first.usage), "the same prompt");
  assert.ok(cached >= total / 2 && cached < total && cached > first.usage.cache_read_input_tokens, `cached ${cached} of ${total}`);
  assert.deepEqual(plainContent(second), plainContent(first), "a cache hit changes nothing");
  assert.equal(await metric("vllm:prefix_cache_hits_total"), hitsBefore + cached, "the metric counts the same hits");
  const f = foldEvents(await collect(await client.messages.create({ ...body, stream: true })));
  assert.ok(f.usage.cache_read_input_tokens > 0, "a streamed message reports the cache read too");
});

await check("messages.stream: on('text') and finalMessage() equal the non-streamed greedy message", async () => {
  assert.ok(greedy, "needs the basic check's message");
  const stream = client.messages.stream(greedyBody);
  let text = "", deltas = 0;
  stream.on("text", (delta) => {
    text += delta;
    deltas++;
  });
  const final = checkMessage(await stream.finalMessage(), { maxTokens: 24 });
  assert.equal(text, textOf(greedy), "the text events spell the non-streamed text");
  assert.ok(deltas >= 1 || textOf(greedy) === "", "text arrives in deltas");
  assert.deepEqual(plainContent(final), plainContent(greedy));
  assert.equal(final.stop_reason, greedy.stop_reason);
  assert.equal(final.usage.output_tokens, greedy.usage.output_tokens);
  assert.equal(promptTokens(final.usage), promptTokens(greedy.usage));
});

await check("raw stream events: order, matching indexes, SSE event names, pings only after message_start", async () => {
  const events = await collect(await client.messages.create({ ...greedyBody, stream: true }));
  const f = foldEvents(events);
  assert.deepEqual(plainContent(f), plainContent(greedy), "the folded stream is the non-streamed message");
  assert.equal(f.stop_reason, greedy.stop_reason);
  assert.equal(f.usage.output_tokens, greedy.usage.output_tokens);
  // The SDK drops SSE blocks without an event: line and every "ping": each block must be named.
  const raw = await rawStream(greedyBody);
  for (const { event, data } of raw) assert.equal(event, data.type, `SSE event name ${event} for a ${data.type} payload`);
  assert.equal(raw[0].data.type, "message_start", "the first SSE event (pings come after it)");
  const unpinged = raw.filter((e) => e.data.type !== "ping").map((e) => e.data);
  assert.deepEqual(unpinged.map((e) => e.type), events.map((e) => e.type), "the raw events are the SDK's, pings aside");
  assert.deepEqual(plainContent(foldEvents(unpinged)), plainContent(greedy));
});

await check("tools: input_schema with tool_choice auto / any / tool / none and disable_parallel_tool_use", async () => {
  const messages = msg("What is the weather in Paris? " + nonce());
  const plain = await client.messages.create({ model: MODEL, max_tokens: 8, temperature: 0, messages });
  const choices = [{ type: "auto" }, { type: "any" }, { type: "tool", name: "get_weather" }, { type: "none" },
                   { type: "auto", disable_parallel_tool_use: true }, { type: "any", disable_parallel_tool_use: true }];
  for (const tool_choice of choices) {
    const r = checkMessage(await client.messages.create({ model: MODEL, max_tokens: 48, temperature: 0, messages, tools, tool_choice }),
                           { maxTokens: 48, toolNames });
    const calls = r.content.filter((b) => b.type === "tool_use");
    if (tool_choice.type === "tool") for (const c of calls) assert.equal(c.name, "get_weather", "tool_choice tool names the tool");
    if (tool_choice.type === "none") assert.deepEqual(calls, [], "tool_choice none: no tool calls");
    if (tool_choice.disable_parallel_tool_use) assert.ok(calls.length <= 1, `${calls.length} tool calls with parallel use disabled`);
    if (tool_choice.type !== "none") assert.ok(promptTokens(r.usage) > promptTokens(plain.usage) + 20, `tools add to the prompt (${JSON.stringify(tool_choice)})`);
  }
  const f = foldEvents(await collect(await client.messages.create({ model: MODEL, max_tokens: 48, temperature: 0, messages, tools,
                                                                   tool_choice: { type: "any" }, stream: true })));
  checkMessage(f, { maxTokens: 48, toolNames });
});

await check("tool_use and tool_result history (string content, block content, is_error) accepted", async () => {
  const first = { role: "user", content: "Weather in Paris and the time? " + nonce() };
  const messages = [first,
    { role: "assistant", content: [{ type: "text", text: "Let me check." },
      { type: "tool_use", id: "toolu_01", name: "get_weather", input: { city: "Paris" } },
      { type: "tool_use", id: "toolu_02", name: "get_time", input: {} }] },
    { role: "user", content: [
      { type: "tool_result", tool_use_id: "toolu_01", content: "sunny, 21 C" },
      { type: "tool_result", tool_use_id: "toolu_02", content: [{ type: "text", text: "timeout" }], is_error: true },
      { type: "text", text: "Go on." }] }];
  const r = checkMessage(await client.messages.create({ model: MODEL, max_tokens: 8, temperature: 0, messages, tools }), { toolNames });
  const shorter = (await client.messages.countTokens({ model: MODEL, messages: [first], tools })).input_tokens;
  assert.ok(promptTokens(r.usage) > shorter + 10, "the calls and results are part of the prompt");
  const blockResult = structuredClone(messages);
  blockResult[2].content[0].content = [{ type: "text", text: "sunny," }, { type: "text", text: "21 C" }];
  checkMessage(await client.messages.create({ model: MODEL, max_tokens: 4, messages: blockResult, tools }), { toolNames });
});

await check("thinking enabled / adaptive / disabled and output_config effort accepted; thinking blocks well formed", async () => {
  const messages = msg("Think about the number seven. " + nonce());
  const cases = [
    { max_tokens: 1100, thinking: { type: "enabled", budget_tokens: 1024 } },
    { max_tokens: 64, thinking: { type: "adaptive" } },
    { max_tokens: 64, thinking: { type: "adaptive", display: "omitted" }, output_config: { effort: "high" } },
    { max_tokens: 64, thinking: { type: "disabled" } },
    { max_tokens: 64, output_config: { effort: "high" } },
  ];
  for (const extra of cases) {
    const r = checkMessage(await client.messages.create({ model: MODEL, messages, ...extra }), { maxTokens: extra.max_tokens });
    if (extra.thinking?.type === "disabled") assert.ok(!r.content.some((b) => b.type === "thinking"), "no thinking when disabled");
  }
  const f = foldEvents(await collect(await client.messages.create({ model: MODEL, messages, max_tokens: 64, thinking: { type: "adaptive" },
                                                                   stream: true })));
  checkMessage(f, { maxTokens: 64 });
});

await check("assistant history with thinking and redacted_thinking blocks accepted", async () => {
  const messages = [
    { role: "user", content: "What is 2 + 2? " + nonce() },
    { role: "assistant", content: [
      { type: "thinking", thinking: "Two and two make four.", signature: "c2lnbmF0dXJl" },
      { type: "redacted_thinking", data: "cmVkYWN0ZWQ=" },
      { type: "text", text: "4" }] },
    { role: "user", content: "And 3 + 3?" }];
  for (const thinking of [{ type: "adaptive" }, { type: "disabled" }]) {
    checkMessage(await client.messages.create({ model: MODEL, max_tokens: 16, messages, thinking }), { maxTokens: 16 });
  }
});

await check("image block: 400 BadRequestError naming the image", async () => {
  const e = await expectApiError(Anthropic.BadRequestError, 400, "invalid_request_error", () => client.messages.create({
    model: MODEL, max_tokens: 4, messages: [{ role: "user", content: [
      { type: "image", source: { type: "base64", media_type: "image/png", data: PNG_1x1 } }, { type: "text", text: "What is this?" }] }] }));
  assert.match(e.error.error.message, /image/i, e.error.error.message);
});

await check("count_tokens: input_tokens = usage input + cache read + cache creation of the same request", async () => {
  const body = { model: MODEL, system: [{ type: "text", text: "You are terse.", cache_control: { type: "ephemeral" } }], tools,
                 messages: [{ role: "user", content: "Count me " + nonce() }, { role: "assistant", content: "Sure." },
                            { role: "user", content: [{ type: "text", text: "Now." }] }] };
  const count = await client.messages.countTokens(body);
  assert.ok(Number.isInteger(count.input_tokens) && count.input_tokens > 0);
  for (let k = 0; k < 2; k++) {  // the second one reads the first one's prefix from the cache
    const r = checkMessage(await client.messages.create({ ...body, max_tokens: 4 }), { toolNames });
    assert.equal(promptTokens(r.usage), count.input_tokens, `request ${k}: ${JSON.stringify(r.usage)}`);
  }
  const beta = await client.beta.messages.countTokens({ ...body, betas: ["token-counting-2024-11-01"] }, { query: { beta: "true" } });
  assert.equal(beta.input_tokens, count.input_tokens, "the beta route counts the same");
  const plain = await client.messages.countTokens({ model: MODEL, messages: body.messages });
  assert.ok(plain.input_tokens < count.input_tokens, "system and tools are counted");
});

await check("errors: unknown model is NotFoundError 404 naming the model", async () => {
  const e = await expectApiError(Anthropic.NotFoundError, 404, "not_found_error", () =>
    client.messages.create({ model: "claude-nonexistent-9", max_tokens: 4, messages: msg("hi") }));
  assert.ok(e.error.error.message.includes("claude-nonexistent-9"), e.error.error.message);
  await expectApiError(Anthropic.NotFoundError, 404, "not_found_error", () =>
    client.messages.countTokens({ model: "claude-nonexistent-9", messages: msg("hi") }));
});

await check("errors: bad fields are BadRequestError 400 invalid_request_error, streamed or not", async () => {
  const cases = [{ temperature: 5 }, { temperature: -1 }, { top_p: 1.5 }, { max_tokens: "ten" }, { max_tokens: 0 }, { max_tokens: undefined },
                 { messages: "hello" }, { messages: [] }, { messages: [{ role: "wizard", content: "x" }] },
                 { tool_choice: { type: "tool", name: "no_such_tool" }, tools }];
  for (const extra of cases) {
    const body = { model: MODEL, max_tokens: 4, messages: msg("hi"), ...extra };
    if ("max_tokens" in extra && extra.max_tokens === undefined) delete body.max_tokens;
    await expectApiError(Anthropic.BadRequestError, 400, "invalid_request_error", () => client.messages.create(body))
      .catch((e) => { throw new Error(`${JSON.stringify(extra)}: ${e.message}`); });
  }
  // A streamed request is refused before the stream starts.
  await expectApiError(Anthropic.BadRequestError, 400, "invalid_request_error", async () => {
    for await (const _ of await client.messages.create({ model: MODEL, max_tokens: 4, messages: msg("hi"), temperature: 5, stream: true }));
  });
});

await check("beta path: beta.messages.create with ?beta=true and anthropic-beta, a Claude Code shaped request", async () => {
  const betas = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"];
  const since = sent.length;
  const r = checkMessage(await client.beta.messages.create({ ...greedyBody, betas }, { query: { beta: "true" } }), { maxTokens: 24 });
  const req = sent.slice(since).find((s) => s.url.includes("/v1/messages"));
  assert.ok(req && new URL(req.url).searchParams.get("beta") === "true", `sent to ${req?.url}`);
  assert.equal(req.headers.get("anthropic-beta"), betas.join(","));
  assert.deepEqual(plainContent(r), plainContent(greedy), "the beta route answers as the plain one");
  // What Claude Code 2.1 sends: system blocks, a system-role message after the user's, a deferred
  // tool, adaptive thinking without display, context_management, metadata, effort; streamed and not.
  const shaped = { model: MODEL, max_tokens: 32, betas, metadata: { user_id: JSON.stringify({ device_id: nonce(), session_id: nonce() }) },
    system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=0;" },
             { type: "text", text: "You are a terse agent.", cache_control: { type: "ephemeral" } }],
    messages: [{ role: "user", content: [{ type: "text", text: "Reply with one word.", cache_control: { type: "ephemeral" } }] },
               { role: "system", content: [{ type: "text", text: "# Environment\nPlatform: linux", cache_control: { type: "ephemeral" } }] }],
    tools: [...tools, { name: "DeferredToolPlaceholder", description: "placeholder", input_schema: { type: "object", properties: {} },
                        defer_loading: true }],
    thinking: { type: "adaptive", display: "omitted" }, context_management: { edits: [{ type: "clear_thinking_20251015", keep: "all" }] },
    output_config: { effort: "high" } };
  const names = [...toolNames, "DeferredToolPlaceholder"];
  checkMessage(await client.beta.messages.create(shaped, { query: { beta: "true" } }), { maxTokens: 32, toolNames: names });
  checkMessage(foldEvents(await collect(await client.beta.messages.create({ ...shaped, stream: true }, { query: { beta: "true" } }))),
               { maxTokens: 32, toolNames: names });
  // anthropic-beta from defaultHeaders on a plain messages.create.
  const headerClient = client.withOptions({ defaultHeaders: { "anthropic-beta": betas.join(",") } });
  checkMessage(await headerClient.messages.create(greedyBody), { maxTokens: 24 });
});

await check("an aborted stream frees its request; the server keeps serving", async () => {
  const disconnectsBefore = await metric("k3serve:client_disconnects_total");
  let deltas = 0;
  // A random model may end early: a few prompts, until one runs past 3 deltas.
  for (let k = 0; k < 3 && deltas < 3; k++) {
    deltas = 0;
    const stream = await client.messages.create({ model: MODEL, max_tokens: 2000, messages: msg(`Long story ${k} ${nonce()}`), stream: true });
    try {
      for await (const ev of stream) {
        if (ev.type === "content_block_delta" && ++deltas === 3) { stream.controller.abort(); break; }
      }
    } catch (e) {
      assert.ok(e instanceof Anthropic.APIUserAbortError || e.name === "AbortError", `${e}`);
    }
  }
  assert.equal(deltas, 3, "no stream ran to 3 deltas");
  await eventually("the disconnect to be counted", async () => (await metric("k3serve:client_disconnects_total")) > disconnectsBefore);
  await eventually("no request running", async () => (await metric("vllm:num_requests_running")) === 0 &&
                                                         (await metric("vllm:num_requests_waiting")) === 0);
  checkMessage(await client.messages.create({ model: MODEL, max_tokens: 2, messages: msg("still there?") }));
});

finish("Anthropic SDK checks");
