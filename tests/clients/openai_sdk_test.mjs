// tests/clients/openai_sdk_test.mjs: drives a running `k3serve serve` through the official
// OpenAI Node SDK (npm "openai", installed by scripts/fetch_test_data.sh into
// .testdata/openai-node) and asserts on the values it returns: models, completions and chat
// (plain and streamed), n, logprobs, stop strings, seeds, finish reasons, usage with cached
// tokens, tools and tool results, and the SDK's error classes for bad requests.
//
//   node tests/clients/openai_sdk_test.mjs --base-url http://127.0.0.1:8000/v1 [--model k3-tiny]
//                                          [--sdk-dir .testdata/openai-node] [--only SUBSTRING]
//
// The server is expected to serve a model with random weights (the bundled k3-tiny), so the
// checks compare the server against itself and against its own /tokenize (same seed, streamed
// vs not, the prompt token counts) rather than against known text. One line per check; exits 1
// when any check fails.
import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { randomBytes } from "node:crypto";
import { parseArgs, checker, metric as harnessMetric, eventually, expectOpenAIError } from "./harness.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = parseArgs("openai_sdk_test.mjs", { "base-url": "http://127.0.0.1:8000/v1", model: "k3-tiny", "sdk-dir": path.join(here, "../../.testdata/openai-node"), only: "" });
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
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });

// ---- check runner ----

const { check, finish } = checker(args.only);

// ---- helpers ----

async function postJson(route, body) {
  const r = await fetch(serverRoot + route, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  assert.equal(r.status, 200, `${route}: ${await r.clone().text()}`);
  return r.json();
}
async function tokenCount(body) {
  const j = await postJson("/tokenize", { model: MODEL, ...body });
  assert.equal(j.count, j.tokens.length);
  return j.count;
}
const metric = (name) => harnessMetric(serverRoot, name);
const expectApiError = expectOpenAIError;
function checkUsage(u) {
  assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, JSON.stringify(u));
  assert.ok(Number.isInteger(u.completion_tokens) && u.completion_tokens >= 0, JSON.stringify(u));
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.ok(Number.isInteger(u.prompt_tokens_details?.cached_tokens), JSON.stringify(u));
  assert.ok(u.prompt_tokens_details.cached_tokens >= 0 && u.prompt_tokens_details.cached_tokens < u.prompt_tokens);
}
// Folds a chat stream into per-choice {role, content, reasoning, tool calls, logprobs, finish}.
async function foldChat(stream) {
  const choices = [];
  let usage = null, chunks = 0, id = null;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    assert.equal(chunk.model, MODEL);
    id ??= chunk.id;
    assert.equal(chunk.id, id, "every chunk of a stream has the same id");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const f = (choices[c.index] ??= { role: null, content: "", reasoning: "", toolCalls: [], logprobs: [], finish: null });
      assert.equal(f.finish, null, `choice ${c.index} got a chunk after its finish_reason`);
      if (c.delta.role) f.role = c.delta.role;
      f.content += c.delta.content ?? "";
      f.reasoning += c.delta.reasoning_content ?? "";
      for (const t of c.delta.tool_calls ?? []) {
        const acc = (f.toolCalls[t.index] ??= { id: "", name: "", arguments: "" });
        acc.id += t.id ?? "";
        acc.name += t.function?.name ?? "";
        acc.arguments += t.function?.arguments ?? "";
      }
      if (c.logprobs?.content) f.logprobs.push(...c.logprobs.content);
      if (c.finish_reason) f.finish = c.finish_reason;
    }
  }
  return { choices, usage, chunks, id };
}
const msg = (text) => [{ role: "user", content: text }];
const nonce = () => randomBytes(6).toString("hex");
const noThinking = { chat_template_kwargs: { thinking: false } };  // output starts in the content channel

// A 3-character window of printable ASCII from the middle of `text` (for stop strings), or null.
function asciiWindow(text) {
  for (let k = Math.floor(text.length / 2); k + 3 <= text.length; k++) {
    const w = text.slice(k, k + 3);
    if (/^[\x21-\x7e]{3}$/.test(w)) return w;
  }
  return null;
}

// ---- checks ----

console.log(`openai SDK ${sdkVersion} against ${baseURL} (model ${MODEL})`);

// The random tiny model samples its eos now and then; a logit_bias of -100 rules it out where a
// check needs text of a given length.
let eosId = [];
try {
  eosId = (await postJson("/tokenize", { model: MODEL, prompt: "<|end_of_msg|>" })).tokens;
} catch (e) {
  console.log(`(cannot tokenize the eos: ${e.message})`);
}
const noEos = eosId.length === 1 ? { logit_bias: { [eosId[0]]: -100 } } : {};

// A seeded sample whose text holds a printable-ASCII window to use as a stop string: the first
// of a few seeds that gives one (deterministic for a given model and prompt). `text(r)` reads
// the text out of a response.
async function sampleWithStopWindow(create, text) {
  for (let seed = 11; seed < 16; seed++) {
    const r = await create(seed);
    const stop = asciiWindow(text(r));
    if (stop) return { seed, full: text(r), stop, usage: r.usage };
  }
  assert.fail("no seed in 11..15 gave text with 3 printable ASCII characters in a row");
}

await check("models.list returns the served model(s)", async () => {
  const page = await client.models.list();
  assert.ok(page.data.length >= 1);
  const m = page.data.find((x) => x.id === MODEL);
  assert.ok(m, `${MODEL} is listed`);
  assert.equal(m.id, MODEL);
  assert.equal(m.object, "model");
  assert.equal(m.owned_by, "k3serve");
  assert.ok(Number.isInteger(m.created) && m.created > 1.6e9, `created ${m.created}`);
  assert.ok(Number.isInteger(m.max_model_len) && m.max_model_len > 0);
  const ids = [];
  for await (const x of client.models.list()) ids.push(x.id);  // the SDK's auto-pagination
  assert.deepEqual(ids, page.data.map((x) => x.id));
});

const greedyPrompt = "The quick brown fox " + nonce();
let greedy;  // the non-streamed greedy completion, reused below

await check("completions.create: greedy text, usage matching /tokenize, finish_reason", async () => {
  const r = await client.completions.create({ model: MODEL, prompt: greedyPrompt, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.model, MODEL);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(typeof c.text, "string");
  assert.ok(["length", "stop"].includes(c.finish_reason), c.finish_reason);
  checkUsage(r.usage);
  assert.equal(r.usage.prompt_tokens, await tokenCount({ prompt: greedyPrompt }));
  if (c.finish_reason === "length") assert.equal(r.usage.completion_tokens, 8);
  else assert.ok(r.usage.completion_tokens <= 8);
  const again = await client.completions.create({ model: MODEL, prompt: greedyPrompt, max_tokens: 8, temperature: 0 });
  assert.equal(again.choices[0].text, c.text, "greedy decoding is deterministic");
  greedy = r;
});

await check("completions.create stream: chunks add up to the non-streamed text and usage", async () => {
  const stream = await client.completions.create({
    model: MODEL, prompt: greedyPrompt, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "text_completion");
    assert.equal(chunk.model, MODEL);
    if (chunk.usage) {
      usage = chunk.usage;
      assert.equal(chunk.choices.length, 0, "the usage chunk has no choices");
      continue;
    }
    assert.equal(chunk.choices.length, 1);
    assert.equal(finish, null, "no text after finish_reason");
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.ok(chunks >= 2, `only ${chunks} chunk(s)`);
  assert.equal(text, greedy.choices[0].text);
  assert.equal(finish, greedy.choices[0].finish_reason);
  assert.ok(usage, "stream_options.include_usage gives a usage chunk");
  assert.equal(usage.prompt_tokens, greedy.usage.prompt_tokens);
  assert.equal(usage.completion_tokens, greedy.usage.completion_tokens);
});

await check("completions.create logprobs: tokens spell the text, top maps, offsets", async () => {
  // skip_special_tokens: false (vLLM's field) keeps special tokens' text in the completion too.
  const r = await client.completions.create({ model: MODEL, prompt: greedyPrompt, max_tokens: 6, temperature: 0, logprobs: 2,
                                              skip_special_tokens: false });
  const c = r.choices[0], lp = c.logprobs;
  assert.equal(lp.tokens.length, r.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.text_offset.length, lp.tokens.length);
  // The token texts spell the completion, unless a token holds part of a UTF-8 character
  // (shown as U+FFFD in its token text).
  const spelled = lp.tokens.join("");
  if (c.finish_reason === "length" && !spelled.includes("\ufffd")) assert.equal(spelled, c.text);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 0; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0, `logprob ${lp.token_logprobs[i]}`);
    const top = Object.entries(lp.top_logprobs[i]);
    // Two ids with one text share a key, so a map may hold fewer than 2 entries.
    assert.ok(top.length >= 1 && top.length <= 2, JSON.stringify(lp.top_logprobs[i]));
    const best = Math.max(...top.map(([, v]) => v));
    // Greedy: the chosen token is the most likely one.
    assert.ok(lp.token_logprobs[i] >= best - 1e-4, `token ${i}: ${lp.token_logprobs[i]} below the top ${best}`);
    // Offsets count characters (code points) of the tokens' texts.
    if (i > 0) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
  }
});

await check("completions.create stop string: output ends before its first occurrence", async () => {
  const base = { model: MODEL, prompt: "Once upon a time " + nonce(), max_tokens: 40, temperature: 1, ...noEos };
  const { seed, full: text, stop, usage } = await sampleWithStopWindow(
    (seed) => client.completions.create({ ...base, seed }), (r) => r.choices[0].text);
  base.seed = seed;
  const expected = text.slice(0, text.indexOf(stop));
  const cut = await client.completions.create({ ...base, stop: [stop, "\u0000never"] });
  assert.equal(cut.choices[0].text, expected, `stop ${JSON.stringify(stop)} in ${JSON.stringify(text)}`);
  assert.equal(cut.choices[0].finish_reason, "stop");
  assert.ok(cut.usage.completion_tokens <= usage.completion_tokens);
  let streamed = "", finish = null;
  for await (const ch of await client.completions.create({ ...base, stop, stream: true })) {
    streamed += ch.choices[0]?.text ?? "";
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(streamed, expected, "streamed text stops at the same place (the stop string is never sent)");
  assert.equal(finish, "stop");
});

const chatMessages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Say hello " + nonce() }];
let chatPlain;

await check("chat.completions.create: message, usage matching /tokenize, seed determinism", async () => {
  const body = { model: MODEL, messages: chatMessages, max_tokens: 16, temperature: 1, seed: 42, ...noEos };
  const r = await client.chat.completions.create(body);
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, "assistant");
  assert.ok(["length", "stop"].includes(c.finish_reason), c.finish_reason);
  const produced = (c.message.content ?? "") + (c.message.reasoning_content ?? "");
  assert.ok(produced.length > 0 || c.finish_reason === "stop", "some text was produced");
  checkUsage(r.usage);
  assert.equal(r.usage.prompt_tokens, await tokenCount({ messages: chatMessages }), "chat prompt = /tokenize of the messages");
  const same = await client.chat.completions.create(body);
  assert.equal(same.choices[0].message.content, c.message.content, "same seed, same content");
  assert.equal(same.choices[0].message.reasoning_content, c.message.reasoning_content, "same seed, same reasoning");
  assert.equal(same.usage.completion_tokens, r.usage.completion_tokens);
  const other = await client.chat.completions.create({ ...body, seed: 43 });
  assert.notEqual((other.choices[0].message.content ?? "") + (other.choices[0].message.reasoning_content ?? ""), produced,
                  "another seed samples another answer");
  chatPlain = r;
});

await check("chat.completions.create stream: role first, deltas add up to the same seeded answer", async () => {
  const stream = await client.chat.completions.create({
    model: MODEL, messages: chatMessages, max_tokens: 16, temperature: 1, seed: 42, ...noEos, stream: true,
    stream_options: { include_usage: true } });
  const f = await foldChat(stream);
  assert.match(f.id, /^chatcmpl-/);
  assert.equal(f.choices.length, 1);
  const c = f.choices[0], m = chatPlain.choices[0].message;
  assert.equal(c.role, "assistant");
  assert.equal(c.content, m.content ?? "");
  assert.equal(c.reasoning, m.reasoning_content ?? "");
  assert.equal(c.finish, chatPlain.choices[0].finish_reason);
  assert.ok(f.usage, "usage chunk");
  assert.equal(f.usage.prompt_tokens, chatPlain.usage.prompt_tokens);
  assert.equal(f.usage.completion_tokens, chatPlain.usage.completion_tokens);
});

await check("chat n=2: two different choices, usage sums them, streamed choices match", async () => {
  const body = { model: MODEL, messages: msg("Pick a word " + nonce()), max_tokens: 10, temperature: 1, seed: 5, n: 2,
                 logprobs: true, ignore_eos: true, ...noThinking };
  const r = await client.chat.completions.create(body);
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, "length");
    assert.equal(c.logprobs.content.length, 10, "one logprob entry per token");
    for (const e of c.logprobs.content) {
      // logprobs: true without top_logprobs still gives each sampled token's logprob.
      assert.ok(typeof e.logprob === "number" && e.logprob <= 0 && e.logprob > -50, JSON.stringify(e));
      assert.deepEqual(e.top_logprobs, []);
    }
  }
  assert.equal(r.usage.completion_tokens, 20);
  assert.notDeepEqual(r.choices[0].logprobs.content.map((e) => e.token), r.choices[1].logprobs.content.map((e) => e.token));
  const f = await foldChat(await client.chat.completions.create({ ...body, stream: true }));
  assert.equal(f.choices.length, 2);
  for (let i = 0; i < 2; i++) {
    assert.equal(f.choices[i].role, "assistant");
    assert.equal(f.choices[i].content, r.choices[i].message.content ?? "", `choice ${i}`);
    assert.equal(f.choices[i].finish, "length");
    assert.deepEqual(f.choices[i].logprobs.map((e) => e.token), r.choices[i].logprobs.content.map((e) => e.token));
  }
});

await check("completions logprobs: 0 gives the sampled tokens' logprobs and empty top maps", async () => {
  const r = await client.completions.create({ model: MODEL, prompt: "Zero " + nonce(), max_tokens: 4, temperature: 1, seed: 2, logprobs: 0 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.token_logprobs.length, r.usage.completion_tokens);
  for (const v of lp.token_logprobs) assert.ok(typeof v === "number" && v <= 0 && v > -50, `logprob ${v}`);
  for (const t of lp.top_logprobs) assert.deepEqual(t, {});
});

await check("chat logprobs + top_logprobs: shapes, bytes, greedy picks the top entry", async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages: msg("Count " + nonce()), max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3, ...noThinking });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    assert.equal(typeof e.token, "string");
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
    if (!e.token.includes("\ufffd")) assert.equal(Buffer.from(e.bytes).toString("utf8"), e.token);
    assert.equal(e.top_logprobs.length, 3);
    for (let k = 1; k < 3; k++) assert.ok(e.top_logprobs[k - 1].logprob >= e.top_logprobs[k].logprob, "sorted, most likely first");
    const mass = e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0);
    assert.ok(mass <= 1 + 1e-4, `top-3 probability mass ${mass}`);
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-4, "greedy chose the most likely token");
    assert.deepEqual(e.top_logprobs[0].bytes, e.bytes);
  }
});

await check("chat stop string on the content, streamed and not", async () => {
  const base = { model: MODEL, messages: msg("Tell a story " + nonce()), max_tokens: 40, temperature: 1, ...noEos, ...noThinking };
  const { seed, full: text, stop } = await sampleWithStopWindow(
    (seed) => client.chat.completions.create({ ...base, seed }), (r) => r.choices[0].message.content ?? "");
  base.seed = seed;
  const expected = text.slice(0, text.indexOf(stop));
  const cut = await client.chat.completions.create({ ...base, stop });
  assert.equal(cut.choices[0].message.content ?? "", expected);
  assert.equal(cut.choices[0].finish_reason, "stop");
  const f = await foldChat(await client.chat.completions.create({ ...base, stop: [stop], stream: true }));
  assert.equal(f.choices[0].content, expected);
  assert.equal(f.choices[0].finish, "stop");
});

await check("max_tokens / max_completion_tokens end with finish_reason length", async () => {
  assert.equal(eosId.length, 1, "<|end_of_msg|> is one special token");
  for (const limit of [{ max_tokens: 3 }, { max_completion_tokens: 4 }]) {
    const r = await client.chat.completions.create({ model: MODEL, messages: msg("Go " + nonce()), temperature: 1, seed: 3, ...noEos, ...limit });
    const want = limit.max_tokens ?? limit.max_completion_tokens;
    assert.equal(r.choices[0].finish_reason, "length", JSON.stringify(limit));
    assert.equal(r.usage.completion_tokens, want);
  }
  const c = await client.completions.create({ model: MODEL, prompt: "Go " + nonce(), max_tokens: 2, temperature: 1, seed: 3, ...noEos });
  assert.equal(c.choices[0].finish_reason, "length");
  assert.equal(c.usage.completion_tokens, 2);
  // max_tokens beyond what the context has left is refused, not truncated.
  const maxLen = (await client.models.list()).data[0].max_model_len;
  const e = await expectApiError(OpenAI.BadRequestError, 400, () =>
    client.chat.completions.create({ model: MODEL, messages: msg("Go"), max_tokens: maxLen }));
  assert.equal(e.param, "max_tokens");
});

await check("usage.prompt_tokens_details.cached_tokens: 0, then > 0 on the repeated prompt", async () => {
  const long = `Document ${nonce()}: ` + Array.from({ length: 40 }, (_, i) => `line ${i} of the shared prefix.`).join(" ");
  const body = { model: MODEL, messages: msg(long), max_tokens: 2, temperature: 0 };
  const first = await client.chat.completions.create(body);
  assert.ok(first.usage.prompt_tokens > 256, `prompt of ${first.usage.prompt_tokens} tokens`);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0, "a fresh prompt has nothing cached");
  const hitsBefore = await metric("vllm:prefix_cache_hits_total");
  const second = await client.chat.completions.create(body);
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.equal(second.usage.prompt_tokens, first.usage.prompt_tokens);
  assert.ok(cached > 0 && cached < second.usage.prompt_tokens, `cached ${cached} of ${second.usage.prompt_tokens}`);
  assert.ok(cached >= second.usage.prompt_tokens / 2, `only ${cached} of ${second.usage.prompt_tokens} cached`);
  assert.equal(second.choices[0].message.content, first.choices[0].message.content, "a cache hit changes nothing");
  assert.equal(await metric("vllm:prefix_cache_hits_total"), hitsBefore + cached, "the metric counts the same hits");
  const f = await foldChat(await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } }));
  assert.ok(f.usage.prompt_tokens_details.cached_tokens > 0, "streamed usage reports cached tokens too");
});

const tools = [
  { type: "function", function: { name: "get_weather", description: "Current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } },
  { type: "function", function: { name: "get_time", description: "Local time", parameters: { type: "object", properties: {} } } },
];
function checkToolCalls(calls) {
  for (const t of calls ?? []) {
    assert.match(t.id, /^call_/);
    assert.ok(["get_weather", "get_time"].includes(t.function?.name ?? t.name), JSON.stringify(t));
    JSON.parse(t.function?.arguments ?? t.arguments);  // arguments are JSON
  }
}

await check("tools declared with tool_choice auto / none / required: rendered and answered", async () => {
  const messages = msg("What is the weather in Paris? " + nonce());
  const plain = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 8, temperature: 0 });
  for (const tool_choice of ["auto", "none", "required"]) {
    const r = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice, max_tokens: 8, temperature: 0 });
    const c = r.choices[0];
    assert.ok(["stop", "length", "tool_calls"].includes(c.finish_reason), c.finish_reason);
    assert.ok(r.usage.prompt_tokens > plain.usage.prompt_tokens + 20, `tools add to the prompt (${tool_choice})`);
    if (tool_choice === "auto") assert.equal(r.usage.prompt_tokens, await tokenCount({ messages, tools }), "rendered as /tokenize renders it");
    if (c.finish_reason === "tool_calls") assert.ok(c.message.tool_calls.length >= 1);
    checkToolCalls(c.message.tool_calls);
  }
  const f = await foldChat(await client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 8, temperature: 0, stream: true }));
  assert.ok(["stop", "length", "tool_calls"].includes(f.choices[0].finish));
  checkToolCalls(f.choices[0].toolCalls);
});

await check("tool calls and tool results sent back are accepted and rendered", async () => {
  const messages = [
    { role: "user", content: "Weather in Paris and the time? " + nonce() },
    { role: "assistant", content: null, tool_calls: [
      { id: "call_1", type: "function", function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } },
      { id: "call_2", type: "function", function: { name: "get_time", arguments: "{}" } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
    { role: "tool", tool_call_id: "call_2", content: "12:00" },
  ];
  const r = await client.chat.completions.create({ model: MODEL, messages, tools, max_tokens: 4, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, await tokenCount({ messages, tools }));
  const shorter = await tokenCount({ messages: messages.slice(0, 1), tools });
  assert.ok(r.usage.prompt_tokens > shorter + 10, "the calls and results are part of the prompt");
  // A call without a function name, or a result that answers no call, is refused naming the message.
  const noName = await expectApiError(OpenAI.BadRequestError, 400, () => client.chat.completions.create({
    model: MODEL, tools, max_tokens: 4, messages: [messages[0], { role: "assistant", tool_calls: [{ id: "call_9", type: "function" }] }] }));
  assert.ok(noName.param.startsWith("messages[1].tool_calls[0]"), noName.param);
  const orphan = await expectApiError(OpenAI.BadRequestError, 400, () => client.chat.completions.create({
    model: MODEL, tools, max_tokens: 4, messages: [messages[0], { role: "tool", content: "answers nothing" }] }));
  assert.equal(orphan.param, "messages[1]");
});

await check("errors: out-of-range and mistyped fields are BadRequestError 400 naming the field", async () => {
  const cases = [
    [{ temperature: -1 }, "temperature"],
    [{ temperature: 2.5 }, "temperature"],
    [{ top_p: 1.5 }, "top_p"],
    [{ max_tokens: "ten" }, "max_tokens"],
    [{ max_tokens: 0 }, "max_tokens"],
    [{ n: 0 }, "n"],
    [{ seed: "abc" }, "seed"],
    [{ stop: 5 }, "stop"],
    [{ logit_bias: { "999999": 5 } }, "logit_bias"],
    [{ top_logprobs: 3 }, "top_logprobs"],
    [{ presence_penalty: 3 }, "presence_penalty"],
    [{ stream: true, stream_options: { frobnicate: 1 } }, "stream_options.frobnicate"],  // nested keys stay strict
    [{ messages: "hello" }, "messages"],
    [{ messages: [{ role: "wizard", content: "x" }] }, "messages[0]"],
    [{ tool_choice: { type: "function", function: { name: "get_date" } }, tools }, "tool_choice"],  // not declared
    [{ stream_options: { include_usage: true } }, "stream_options"],
  ];
  for (const [extra, field] of cases) {
    const e = await expectApiError(OpenAI.BadRequestError, 400, () =>
      client.chat.completions.create({ model: MODEL, messages: msg("hi"), max_tokens: 2, ...extra }));
    assert.ok(e.param === field || (e.param ?? "").startsWith(field), `${JSON.stringify(extra)}: param ${e.param}`);
    assert.ok(e.message.includes(field.replace(/\[.*$/, "")), `${JSON.stringify(extra)}: message "${e.message}" names ${field}`);
    assert.equal(e.type, "invalid_request_error");
  }
  const c = await expectApiError(OpenAI.BadRequestError, 400, () => client.completions.create({ model: MODEL, max_tokens: 2 }));
  assert.equal(c.param, "prompt");
  // A streamed request is refused before the stream starts.
  const s = await expectApiError(OpenAI.BadRequestError, 400, async () => {
    for await (const _ of await client.chat.completions.create({ model: MODEL, messages: msg("hi"), temperature: -1, stream: true }));
  });
  assert.equal(s.param, "temperature");
});

await check("chat as real clients send it: developer role, no-effect fields and vendor extras accepted", async () => {
  const r = await client.chat.completions.create({
    model: MODEL, max_tokens: 2, temperature: 0,
    messages: [{ role: "developer", content: "Be brief." }, { role: "user", content: "hi" }],
    user: "u1", metadata: { team: "a" }, store: false, service_tier: "auto", prompt_cache_key: "k1",
    safety_identifier: "s1", client_metadata: { "x-codex-turn-metadata": "{}" }, frobnicate: 1,
    tools, tool_choice: { type: "function", function: { name: "get_time" } }, parallel_tool_calls: false,
  });
  assert.equal(r.object, "chat.completion");
  assert.ok((r.choices[0].message.tool_calls ?? []).length <= 1, "parallel_tool_calls false: at most one call");
  for (const t of r.choices[0].message.tool_calls ?? []) assert.equal(t.function.name, "get_time");
  const page = await (await fetch(`${serverRoot}/metrics`)).text();
  assert.match(page, /k3serve:ignored_request_fields_total\{[^}]*api="chat_completions",field="frobnicate"\} [1-9]/);
});

await check("errors: unknown model is NotFoundError 404, context overflow and huge bodies are refused", async () => {
  const e = await expectApiError(OpenAI.NotFoundError, 404, () =>
    client.chat.completions.create({ model: "gpt-4o", messages: msg("hi"), max_tokens: 2 }));
  assert.equal(e.param, "model");
  assert.equal(e.code, "model_not_found");
  assert.ok(e.message.includes("gpt-4o"));
  const maxLen = (await client.models.list()).data[0].max_model_len;
  const tooLong = await expectApiError(OpenAI.BadRequestError, 400, () =>
    client.completions.create({ model: MODEL, prompt: Array(maxLen + 5).fill(7), max_tokens: 1 }));
  assert.equal(tooLong.code, "context_length_exceeded");
  assert.ok(tooLong.message.includes(String(maxLen)));
  const overflow = await expectApiError(OpenAI.BadRequestError, 400, () =>
    client.completions.create({ model: MODEL, prompt: [1, 2, 3], max_tokens: maxLen }));
  assert.equal(overflow.param, "max_tokens");
  // A body over --max-body-bytes: 413 (the SDK's generic APIError: it has no class for 413).
  const huge = await expectApiError(OpenAI.APIError, 413, () =>
    client.completions.create({ model: MODEL, prompt: "x".repeat(12 << 20), max_tokens: 1 }));
  assert.ok(/larger than/.test(huge.message), huge.message);
});

await check("an aborted stream frees its request; the server keeps serving", async () => {
  const disconnectsBefore = await metric("k3serve:client_disconnects_total");
  const stream = await client.chat.completions.create({
    model: MODEL, messages: msg("Long story " + nonce()), max_tokens: 500, ignore_eos: true, temperature: 1, seed: 1, stream: true });
  let chunks = 0;
  try {
    // Break right after abort(): events already decoded from the last network read would still be
    // yielded by the iterator, so without it the count depends on how the server's chunks were batched.
    for await (const _ of stream) {
      if (++chunks === 3) { stream.controller.abort(); break; }
    }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", `${e}`);
  }
  assert.equal(chunks, 3);
  await eventually("the disconnect to be counted", async () => (await metric("k3serve:client_disconnects_total")) > disconnectsBefore);
  await eventually("no request running", async () => (await metric("vllm:num_requests_running")) === 0 &&
                                                         (await metric("vllm:num_requests_waiting")) === 0);
  const r = await client.chat.completions.create({ model: MODEL, messages: msg("still there?"), max_tokens: 2 });
  assert.equal(r.choices.length, 1);
});

finish("openai SDK checks");
