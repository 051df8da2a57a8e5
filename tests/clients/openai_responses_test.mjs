// tests/clients/openai_responses_test.mjs: drives a running `k3serve serve` through the official
// OpenAI Node SDK (npm "openai", .testdata/openai-node) on the Responses API: responses.create
// with string and item input, instructions, output items (message, reasoning, function_call),
// usage with cached tokens, max_output_tokens, function and hosted tools, tool results,
// store + previous_response_id, the reasoning / text / include / prompt_cache_key fields, the
// streamed event sequence, responses.stream(), a Codex shaped request, errors, an aborted stream.
//
//   node tests/clients/openai_responses_test.mjs --base-url http://127.0.0.1:8000/v1 [--model k3-tiny]
//        [--sdk-dir .testdata/openai-node] [--api-key KEY] [--only SUBSTRING]
//
// The server is expected to serve a model with random weights (the bundled k3-tiny), so the
// checks assert on structure and compare the server against itself (greedy twice, streamed vs
// not), never against known text. One line per check; exits 1 when any check fails.
import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { randomBytes, randomUUID } from "node:crypto";
import { parseArgs, checker, metric as harnessMetric, eventually, expectOpenAIError } from "./harness.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = parseArgs("openai_responses_test.mjs", { "base-url": "http://127.0.0.1:8000/v1", model: "k3-tiny", "sdk-dir": path.join(here, "../../.testdata/openai-node"),
               "api-key": "unused", only: "" });
const baseURL = args["base-url"].replace(/\/$/, "");
const serverRoot = baseURL.replace(/\/v1$/, "");
const MODEL = args.model;

const sdkEntry = path.join(path.resolve(args["sdk-dir"]), "node_modules/openai/index.mjs");
let OpenAI;
try {
  OpenAI = (await import(pathToFileURL(sdkEntry).href)).default;
} catch (e) {
  console.error(`cannot load the openai SDK from ${sdkEntry} (run scripts/fetch_test_data.sh): ${e.message}`);
  process.exit(3);
}
const sdkVersion = (await import(pathToFileURL(path.join(path.dirname(sdkEntry), "version.mjs")).href)).VERSION;
// No retries: a retried 5xx would hide a server fault; a hung request fails the check.
const client = new OpenAI({ baseURL, apiKey: args["api-key"], maxRetries: 0, timeout: 60_000 });

// ---- check runner ----

const { check, finish } = checker(args.only);

// ---- helpers ----

const metric = (name) => harnessMetric(serverRoot, name);
const expectApiError = expectOpenAIError;

function checkUsage(u) {
  assert.ok(Number.isInteger(u?.input_tokens) && u.input_tokens > 0, JSON.stringify(u));
  assert.ok(Number.isInteger(u.output_tokens) && u.output_tokens >= 0, JSON.stringify(u));
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  const cached = u.input_tokens_details?.cached_tokens, reasoning = u.output_tokens_details?.reasoning_tokens;
  assert.ok(Number.isInteger(cached) && cached >= 0 && cached < u.input_tokens, `cached_tokens: ${JSON.stringify(u)}`);
  assert.ok(Number.isInteger(reasoning) && reasoning >= 0 && reasoning <= u.output_tokens, `reasoning_tokens: ${JSON.stringify(u)}`);
}
function checkItem(item, toolNames) {
  assert.equal(typeof item.id, "string", JSON.stringify(item));
  if (item.type === "message") {
    assert.equal(item.role, "assistant");
    assert.ok(["completed", "incomplete"].includes(item.status), `message status ${item.status}`);
    for (const p of item.content) {
      assert.equal(p.type, "output_text", JSON.stringify(p));
      assert.equal(typeof p.text, "string");
      assert.ok(Array.isArray(p.annotations), "output_text parts carry annotations");
    }
  } else if (item.type === "reasoning") {
    assert.ok(Array.isArray(item.summary), JSON.stringify(item));
    for (const s of item.summary) assert.ok(s.type === "summary_text" && typeof s.text === "string", JSON.stringify(s));
    for (const c of item.content ?? []) assert.ok(c.type === "reasoning_text" && typeof c.text === "string", JSON.stringify(c));
    assert.ok(item.encrypted_content == null || typeof item.encrypted_content === "string");
  } else if (item.type === "function_call") {
    assert.ok(typeof item.call_id === "string" && item.call_id.length > 0, JSON.stringify(item));
    assert.ok(toolNames ? toolNames.includes(item.name) : typeof item.name === "string" && item.name.length > 0,
              `a call of ${item.name}, not one of ${toolNames}`);
    assert.equal(typeof item.arguments, "string", "arguments are a JSON string");
    const a = JSON.parse(item.arguments);
    assert.ok(a !== null && typeof a === "object" && !Array.isArray(a), `arguments ${item.arguments}`);
  } else {
    assert.fail(`output item of type ${item.type}`);
  }
}
// Checks a Response (returned, or the one a stream ends with) and returns it.
function checkResponse(r, { maxOutput, toolNames = [] } = {}) {
  assert.equal(r.object, "response");
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, MODEL);
  assert.ok(Number.isInteger(r.created_at) && r.created_at > 1.6e9, `created_at ${r.created_at}`);
  assert.ok(["completed", "incomplete"].includes(r.status), `status ${r.status}`);
  assert.equal(r.error ?? null, null);
  if (r.status === "incomplete") assert.ok(["max_output_tokens", "content_filter"].includes(r.incomplete_details?.reason), JSON.stringify(r.incomplete_details));
  else assert.equal(r.incomplete_details ?? null, null);
  assert.ok(Array.isArray(r.output));
  for (const item of r.output) checkItem(item, toolNames);
  checkUsage(r.usage);
  if (maxOutput !== undefined) {
    assert.ok(r.usage.output_tokens <= maxOutput, `${r.usage.output_tokens} output tokens over ${maxOutput}`);
    if (r.incomplete_details?.reason === "max_output_tokens") assert.equal(r.usage.output_tokens, maxOutput);
  }
  return r;
}
const textOf = (r) => r.output.filter((i) => i.type === "message").flatMap((i) => i.content).map((p) => p.text ?? "").join("");
// The output as a comparison sees it (item and call ids differ between two requests).
const plainOutput = (r) => r.output.map((i) =>
  i.type === "message" ? { type: i.type, text: i.content.map((p) => p.text).join("") }
  : i.type === "reasoning" ? { type: i.type, summary: i.summary.map((s) => s.text), content: (i.content ?? []).map((c) => c.text) }
  : { type: i.type, name: i.name, arguments: i.arguments });

// The event types the SDK's ResponseStream folds (it throws on any other).
const TERMINAL = ["response.completed", "response.incomplete", "response.failed"];
// Checks a streamed response's events -- response.created first, sequence_number increasing, every
// item announced by output_item.added before its parts and deltas, deltas naming their item,
// output index and content index, the .done events repeating what the deltas spelled, a terminal
// response event last -- and returns {created, final, folded} (folded: the output the events spelled).
function foldEvents(events) {
  assert.ok(events.length >= 2, `only ${events.length} event(s)`);
  assert.equal(events[0].type, "response.created", "the first event");
  const created = events[0].response;
  assert.match(created.id, /^resp_/);
  assert.ok(["in_progress", "queued"].includes(created.status), `created with status ${created.status}`);
  assert.deepEqual(created.output, [], "response.created has no output yet");
  let seq = -1, final = null;
  const items = [];  // per output_index: {item, parts: [text], summary: [text], args, done}
  const get = (ev) => {
    const it = items[ev.output_index];
    assert.ok(it, `${ev.type} for output_index ${ev.output_index} before its output_item.added`);
    assert.ok(!it.done, `${ev.type} after output_item.done`);
    if ("item_id" in ev || ev.type !== "response.output_item.done") assert.equal(ev.item_id, it.item.id, `${ev.type} names its item`);
    return it;
  };
  for (const ev of events) {
    assert.equal(final, null, `${ev.type} after ${TERMINAL.join("/")}`);
    assert.ok(Number.isInteger(ev.sequence_number) && ev.sequence_number > seq, `sequence_number ${ev.sequence_number} after ${seq}`);
    seq = ev.sequence_number;
    switch (ev.type) {
      case "response.created": assert.equal(ev, events[0], "one response.created"); break;
      case "response.in_progress": case "response.queued": assert.equal(ev.response.id, created.id); break;
      case "response.output_item.added": {
        assert.equal(ev.output_index, items.length, "items are numbered 0, 1, 2, ...");
        assert.equal(typeof ev.item.id, "string");
        if (ev.item.type === "message") assert.deepEqual(ev.item.content, [], "a message item starts empty");
        if (ev.item.type === "function_call") assert.equal(ev.item.arguments, "", "a function_call starts with no arguments");
        if (ev.item.type === "reasoning") assert.deepEqual(ev.item.summary, [], "a reasoning item starts with no summary");
        // A reasoning item may come with its (empty) reasoning_text parts; the SDK folds either way.
        const parts = ev.item.type === "reasoning" ? (ev.item.content ?? []).map((c) => c.text) : [];
        items.push({ item: ev.item, parts, summary: [], args: "", done: false });
        break;
      }
      case "response.content_part.added": {
        const it = get(ev);
        assert.equal(ev.content_index, it.parts.length, "parts are numbered 0, 1, 2, ...");
        assert.equal(ev.part.type, it.item.type === "reasoning" ? "reasoning_text" : "output_text", JSON.stringify(ev.part));
        assert.equal(ev.part.text, "", "a part starts empty");
        it.parts.push("");
        break;
      }
      case "response.output_text.delta": case "response.reasoning_text.delta": {
        const it = get(ev);
        assert.ok(ev.content_index < it.parts.length, `${ev.type} for content_index ${ev.content_index} before its content_part.added`);
        assert.equal(typeof ev.delta, "string");
        it.parts[ev.content_index] += ev.delta;
        break;
      }
      case "response.output_text.done": case "response.reasoning_text.done": case "response.content_part.done": {
        const it = get(ev);
        const text = ev.type === "response.content_part.done" ? ev.part.text : ev.text;
        assert.equal(text, it.parts[ev.content_index], `${ev.type} repeats the deltas`);
        break;
      }
      case "response.reasoning_summary_part.added": {
        const it = get(ev);
        assert.equal(ev.summary_index, it.summary.length);
        it.summary.push("");
        break;
      }
      case "response.reasoning_summary_text.delta": get(ev).summary[ev.summary_index] += ev.delta; break;
      case "response.reasoning_summary_text.done": assert.equal(ev.text, get(ev).summary[ev.summary_index]); break;
      case "response.reasoning_summary_part.done": assert.equal(ev.part.text, get(ev).summary[ev.summary_index]); break;
      case "response.function_call_arguments.delta": get(ev).args += ev.delta; break;
      case "response.function_call_arguments.done": assert.equal(ev.arguments, get(ev).args); break;
      case "response.output_item.done": {
        const it = get(ev);
        assert.equal(ev.item.id, it.item.id);
        assert.equal(ev.item.type, it.item.type);
        if (ev.item.type === "message") assert.deepEqual(ev.item.content.map((p) => p.text), it.parts, "the done item holds the deltas' text");
        if (ev.item.type === "function_call") assert.equal(ev.item.arguments, it.args);
        if (ev.item.type === "reasoning") {
          assert.deepEqual(ev.item.summary.map((s) => s.text), it.summary, "the done item holds the summary deltas");
          assert.deepEqual((ev.item.content ?? []).map((c) => c.text), it.parts, "the done item holds the reasoning deltas");
        }
        it.item = ev.item;
        it.done = true;
        break;
      }
      case "response.completed": case "response.incomplete": case "response.failed": {
        assert.equal(ev.response.id, created.id, "the terminal event is the created response");
        assert.equal(ev.response.status, ev.type.slice("response.".length));
        for (const it of items) assert.ok(it.done, `item ${it.item.id} was never done`);
        final = ev.response;
        break;
      }
      default: assert.fail(`unexpected event ${JSON.stringify(ev).slice(0, 200)}`);
    }
  }
  assert.ok(final, `the stream ends with one of ${TERMINAL.join(", ")}`);
  return { created, final, folded: { output: items.map((it) => it.item) } };
}
async function collect(stream) {
  const events = [];
  for await (const ev of stream) events.push(ev);
  return events;
}

const nonce = () => randomBytes(6).toString("hex");
const tools = [
  { type: "function", name: "get_weather", description: "Current weather in a city", strict: false,
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
  { type: "function", name: "get_time", description: "Local time", parameters: { type: "object", properties: {} } },
];
const toolNames = tools.map((t) => t.name);

// ---- checks ----

console.log(`openai SDK ${sdkVersion} Responses API against ${baseURL} (model ${MODEL})`);

const greedyBody = { model: MODEL, input: "Say hello " + nonce(), max_output_tokens: 24, temperature: 0 };
let greedy;  // the non-streamed greedy response, reused below

await check("responses.create basic: string input, output items, usage, greedy determinism", async () => {
  greedy = checkResponse(await client.responses.create(greedyBody), { maxOutput: 24 });
  assert.equal(greedy.output_text, textOf(greedy), "the SDK's output_text");
  assert.equal(greedy.max_output_tokens, 24, "the response echoes max_output_tokens");
  const again = checkResponse(await client.responses.create(greedyBody), { maxOutput: 24 });
  assert.deepEqual(plainOutput(again), plainOutput(greedy), "temperature 0 twice: the same output");
  assert.equal(again.status, greedy.status);
  assert.equal(again.usage.output_tokens, greedy.usage.output_tokens);
  assert.equal(again.usage.input_tokens, greedy.usage.input_tokens);
  assert.notEqual(again.id, greedy.id, "each response has its own id");
});

await check("input items: messages of every role with input_text / output_text parts; instructions", async () => {
  const user = "Greet me " + nonce();
  const base = { model: MODEL, max_output_tokens: 8, temperature: 0 };
  const plain = checkResponse(await client.responses.create({ ...base, input: user }));
  const asItem = checkResponse(await client.responses.create({ ...base, input: [{ role: "user", content: user }] }));
  assert.equal(asItem.usage.input_tokens, plain.usage.input_tokens, "a string input is one user message");
  assert.deepEqual(plainOutput(asItem), plainOutput(plain));
  const items = checkResponse(await client.responses.create({ ...base, input: [
    { role: "developer", content: "Be terse." },
    { type: "message", role: "system", content: [{ type: "input_text", text: "Answer in English." }] },
    { role: "user", content: [{ type: "input_text", text: "Hi." }] },
    { type: "message", role: "assistant", content: [{ type: "output_text", text: "Hello." }] },
    { type: "message", role: "user", content: [{ type: "input_text", text: "Again:" }, { type: "input_text", text: user }] }] }));
  assert.ok(items.usage.input_tokens > plain.usage.input_tokens + 5, "every item is in the prompt");
  const instructed = checkResponse(await client.responses.create({ ...base, input: user, instructions: "Be terse." }));
  assert.equal(instructed.instructions, "Be terse.", "the response echoes its instructions");
  assert.ok(instructed.usage.input_tokens > plain.usage.input_tokens, "instructions are in the prompt");
});

await check("max_output_tokens: 1 gives status incomplete, reason max_output_tokens, 1 output token", async () => {
  // A fixed prompt at temperature 0: the answer is the same on every run against the same model.
  const r = checkResponse(await client.responses.create({ model: MODEL, input: "Count to ten.", max_output_tokens: 1, temperature: 0 }));
  assert.equal(r.status, "incomplete");
  assert.equal(r.incomplete_details?.reason, "max_output_tokens");
  assert.equal(r.usage.output_tokens, 1);
});

await check("usage.input_tokens_details.cached_tokens: most of a repeated long prompt is cached", async () => {
  const long = `${nonce()} document: ` + Array.from({ length: 40 }, (_, i) => `line ${i} of the shared prefix.`).join(" ");
  const body = { model: MODEL, input: long, max_output_tokens: 2, temperature: 0 };
  const first = checkResponse(await client.responses.create(body));
  assert.ok(first.usage.input_tokens > 256, `prompt of ${first.usage.input_tokens} tokens`);
  // Only the template's preamble, if anything, is shared with earlier requests.
  assert.ok(first.usage.input_tokens_details.cached_tokens < first.usage.input_tokens / 4, `a fresh prompt: ${JSON.stringify(first.usage)}`);
  const second = checkResponse(await client.responses.create(body));
  const cached = second.usage.input_tokens_details.cached_tokens;
  assert.equal(second.usage.input_tokens, first.usage.input_tokens, "input_tokens counts the cached tokens too");
  assert.ok(cached >= second.usage.input_tokens / 2, `only ${cached} of ${second.usage.input_tokens} cached`);
  assert.deepEqual(plainOutput(second), plainOutput(first), "a cache hit changes nothing");
});

await check("function tools with tool_choice auto / required / none / {function} and parallel_tool_calls false", async () => {
  const input = "What is the weather in Paris? " + nonce();
  const plain = await client.responses.create({ model: MODEL, input, max_output_tokens: 8, temperature: 0 });
  for (const tool_choice of ["auto", "required", "none", { type: "function", name: "get_weather" }]) {
    for (const parallel_tool_calls of [true, false]) {
      const r = checkResponse(await client.responses.create({ model: MODEL, input, tools, tool_choice, parallel_tool_calls,
                                                              max_output_tokens: 48, temperature: 0 }), { maxOutput: 48, toolNames });
      const calls = r.output.filter((i) => i.type === "function_call");
      assert.equal(r.parallel_tool_calls, parallel_tool_calls, "the response echoes parallel_tool_calls");
      if (!parallel_tool_calls) assert.ok(calls.length <= 1, `${calls.length} calls with parallel_tool_calls false`);
      if (tool_choice === "none") assert.deepEqual(calls, [], "tool_choice none: no calls");
      if (typeof tool_choice === "object") for (const c of calls) assert.equal(c.name, "get_weather");
      if (tool_choice !== "none") assert.ok(r.usage.input_tokens > plain.usage.input_tokens + 20, `tools add to the prompt (${JSON.stringify(tool_choice)})`);
    }
  }
  const { final } = foldEvents(await collect(await client.responses.create({ model: MODEL, input, tools, tool_choice: "required",
                                                                              max_output_tokens: 48, temperature: 0, stream: true })));
  checkResponse(final, { maxOutput: 48, toolNames });
});

await check("a hosted tool (web_search) beside function tools is accepted, not an error", async () => {
  for (const hosted of [{ type: "web_search" }, { type: "web_search", external_web_access: false }]) {
    const r = await client.responses.create({ model: MODEL, input: "Search for k3serve. " + nonce(), tools: [hosted, ...tools],
                                              max_output_tokens: 8, temperature: 0 });
    checkResponse(r, { toolNames });
  }
});

await check("function_call and function_call_output items in input accepted and rendered", async () => {
  const first = { role: "user", content: "Weather in Paris and the time? " + nonce() };
  const input = [first,
    { type: "function_call", call_id: "call_1", name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) },
    { type: "function_call", call_id: "call_2", name: "get_time", arguments: "{}" },
    { type: "function_call_output", call_id: "call_1", output: "sunny, 21 C" },
    { type: "function_call_output", call_id: "call_2", output: [{ type: "input_text", text: "12:00" }] }];
  const r = checkResponse(await client.responses.create({ model: MODEL, input, tools, max_output_tokens: 8, temperature: 0 }), { toolNames });
  const shorter = await client.responses.create({ model: MODEL, input: [first], tools, max_output_tokens: 1, temperature: 0 });
  assert.ok(r.usage.input_tokens > shorter.usage.input_tokens + 10, "the calls and outputs are part of the prompt");
});

await check("output items sent back as input with store false (stateless multi-turn, as Codex does)", async () => {
  const input = [{ role: "user", content: "Think, then answer: 2 + 2? " + nonce() }];
  const body = { model: MODEL, tools, store: false, include: ["reasoning.encrypted_content"], max_output_tokens: 32 };
  const r1 = checkResponse(await client.responses.create({ ...body, input }), { toolNames });
  const next = [...input, ...r1.output, { role: "user", content: "And 3 + 3?" }];
  const r2 = checkResponse(await client.responses.create({ ...body, input: next }), { toolNames });
  assert.ok(r2.usage.input_tokens > r1.usage.input_tokens, "the earlier turn is part of the prompt");
});

await check("store: true then previous_response_id continues the conversation", async () => {
  const r1 = checkResponse(await client.responses.create({ model: MODEL, input: "My name is Ada " + nonce(), store: true,
                                                           max_output_tokens: 8, temperature: 0 }));
  const r2 = checkResponse(await client.responses.create({ model: MODEL, input: "What is my name?", previous_response_id: r1.id,
                                                           store: true, max_output_tokens: 8, temperature: 0 }));
  assert.equal(r2.previous_response_id, r1.id, "the response echoes previous_response_id");
  assert.ok(r2.usage.input_tokens > r1.usage.input_tokens, `${r2.usage.input_tokens} input tokens after ${r1.usage.input_tokens}`);
  const alone = await client.responses.create({ model: MODEL, input: "What is my name?", max_output_tokens: 1, temperature: 0 });
  assert.ok(r2.usage.input_tokens > alone.usage.input_tokens + 5, "the earlier turn is in the prompt");
  const { final } = foldEvents(await collect(await client.responses.create({ model: MODEL, input: "Say it again.", previous_response_id: r2.id,
                                                                              max_output_tokens: 4, temperature: 0, stream: true })));
  assert.ok(checkResponse(final).usage.input_tokens > r2.usage.input_tokens, "a chain of three, streamed");
});

await check("previous_response_id: unknown, or stored with store false, is NotFoundError 404 naming the id", async () => {
  const missing = "resp_" + nonce() + nonce();
  const e = await expectApiError(OpenAI.NotFoundError, 404, () =>
    client.responses.create({ model: MODEL, input: "hi", previous_response_id: missing, max_output_tokens: 2 }));
  assert.ok(e.message.includes(missing), e.message);
  const unstored = checkResponse(await client.responses.create({ model: MODEL, input: "hi " + nonce(), store: false, max_output_tokens: 2 }));
  const e2 = await expectApiError(OpenAI.NotFoundError, 404, () =>
    client.responses.create({ model: MODEL, input: "hi", previous_response_id: unstored.id, max_output_tokens: 2 }));
  assert.ok(e2.message.includes(unstored.id), e2.message);
});

await check("reasoning, text.format, include, prompt_cache_key and store false accepted together", async () => {
  const r = checkResponse(await client.responses.create({ model: MODEL, input: "Think about seven. " + nonce(), max_output_tokens: 48,
    reasoning: { effort: "low", summary: "auto" }, text: { format: { type: "text" } }, include: ["reasoning.encrypted_content"],
    prompt_cache_key: "k3-test-" + nonce(), store: false }), { maxOutput: 48 });
  for (const item of r.output.filter((i) => i.type === "reasoning")) {
    assert.equal(typeof item.encrypted_content, "string", "include reasoning.encrypted_content: reasoning items carry it");
  }
  for (const effort of ["none", "minimal", "medium", "high"]) {
    checkResponse(await client.responses.create({ model: MODEL, input: "hi " + nonce(), max_output_tokens: 8, reasoning: { effort } }));
  }
});

await check("streaming: event order and fields; the final response equals the non-streamed greedy one", async () => {
  assert.ok(greedy, "needs the basic check's response");
  const { created, final, folded } = foldEvents(await collect(await client.responses.create({ ...greedyBody, stream: true })));
  assert.equal(created.model, MODEL);
  checkResponse(final, { maxOutput: 24 });
  assert.deepEqual(plainOutput(folded), plainOutput(final), "the events spell the final response's output");
  assert.deepEqual(plainOutput(final), plainOutput(greedy), "streamed = non-streamed at temperature 0");
  assert.equal(final.status, greedy.status);
  assert.equal(final.usage.output_tokens, greedy.usage.output_tokens);
  assert.equal(final.usage.input_tokens, greedy.usage.input_tokens);
  // max_output_tokens cuts the stream: it ends with response.incomplete.
  const cut = foldEvents(await collect(await client.responses.create({ model: MODEL, input: "Count to ten.", max_output_tokens: 1,
                                                                       temperature: 0, stream: true })));
  assert.equal(cut.final.status, "incomplete");
  assert.equal(cut.final.incomplete_details?.reason, "max_output_tokens");
  assert.equal(cut.final.usage.output_tokens, 1);
});

await check("responses.stream(): text deltas and finalResponse() equal the non-streamed greedy response", async () => {
  assert.ok(greedy, "needs the basic check's response");
  const stream = client.responses.stream(greedyBody);
  let text = "";
  stream.on("response.output_text.delta", (e) => { text += e.delta; });
  const final = checkResponse(await stream.finalResponse(), { maxOutput: 24 });
  assert.equal(text, textOf(greedy));
  assert.equal(final.output_text, greedy.output_text);
  assert.deepEqual(plainOutput(final), plainOutput(greedy));
  assert.equal(final.usage.output_tokens, greedy.usage.output_tokens);
});

await check("a Codex shaped request: item ids, namespace and web_search tools, reasoning summary, include, streamed", async () => {
  const fn = (name, props) => ({ type: "function", name, description: `The ${name} tool.`, strict: false,
                                 parameters: { type: "object", properties: props, required: Object.keys(props), additionalProperties: false } });
  const body = { model: MODEL, stream: true, store: false, tool_choice: "auto", parallel_tool_calls: true,
    input: [
      { type: "message", id: "msg_" + randomUUID(), role: "developer", content: [{ type: "input_text", text: "You are a coding agent. Be terse." }] },
      { type: "message", id: "msg_" + randomUUID(), role: "user", content: [{ type: "input_text", text: "<environment_context>\n  <cwd>/tmp</cwd>\n</environment_context>" }] },
      { type: "message", id: "msg_" + randomUUID(), role: "user", content: [{ type: "input_text", text: "Reply with one word." }] }],
    tools: [fn("exec_command", { cmd: { type: "string" } }),
            { type: "namespace", name: "multi_agent_v1", description: "Tools for sub-agents.", tools: [fn("close_agent", { id: { type: "string" } })] },
            { type: "web_search", external_web_access: false }],
    reasoning: { summary: "auto" }, include: ["reasoning.encrypted_content"], prompt_cache_key: randomUUID(),
    client_metadata: { "x-codex-window-id": randomUUID() + ":0" }, max_output_tokens: 48 };
  const { final } = foldEvents(await collect(await client.responses.create(body)));
  checkResponse(final, { maxOutput: 48, toolNames: null });
});

await check("errors: unknown model is NotFoundError 404, a bad field BadRequestError 400 naming it", async () => {
  const e = await expectApiError(OpenAI.NotFoundError, 404, () => client.responses.create({ model: "gpt-4o", input: "hi", max_output_tokens: 2 }));
  assert.ok(e.message.includes("gpt-4o"), e.message);
  for (const [extra, field] of [[{ temperature: 3 }, "temperature"], [{ top_p: 1.5 }, "top_p"], [{ max_output_tokens: "ten" }, "max_output_tokens"],
                                [{ input: 5 }, "input"], [{ tool_choice: { type: "function", name: "no_such_tool" }, tools }, "tool_choice"]]) {
    const b = await expectApiError(OpenAI.BadRequestError, 400, () => client.responses.create({ model: MODEL, input: "hi", max_output_tokens: 2, ...extra }));
    assert.ok((b.param ?? "").startsWith(field) || b.message.includes(field), `${JSON.stringify(extra)}: ${b.message} (param ${b.param})`);
    assert.equal(b.type, "invalid_request_error");
  }
  // A streamed request is refused before the stream starts.
  await expectApiError(OpenAI.BadRequestError, 400, async () => {
    for await (const _ of await client.responses.create({ model: MODEL, input: "hi", temperature: 3, stream: true }));
  });
});

await check("an aborted stream frees its request; the server keeps serving", async () => {
  const disconnectsBefore = await metric("k3serve:client_disconnects_total");
  let deltas = 0;
  // A random model may end early: a few prompts, until one runs past 3 deltas.
  for (let k = 0; k < 3 && deltas < 3; k++) {
    deltas = 0;
    const stream = await client.responses.create({ model: MODEL, input: `Long story ${k} ${nonce()}`, max_output_tokens: 2000, stream: true });
    try {
      for await (const ev of stream) {
        if (ev.type.endsWith(".delta") && ++deltas === 3) { stream.controller.abort(); break; }
      }
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", `${e}`);
    }
  }
  assert.equal(deltas, 3, "no stream ran to 3 deltas");
  await eventually("the disconnect to be counted", async () => (await metric("k3serve:client_disconnects_total")) > disconnectsBefore);
  await eventually("no request running", async () => (await metric("vllm:num_requests_running")) === 0 &&
                                                         (await metric("vllm:num_requests_waiting")) === 0);
  checkResponse(await client.responses.create({ model: MODEL, input: "still there?", max_output_tokens: 2 }));
});

finish("Responses API checks");
