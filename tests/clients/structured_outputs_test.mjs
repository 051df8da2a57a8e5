// tests/clients/structured_outputs_test.mjs: constrained outputs through the official SDKs (openai,
// @anthropic-ai/sdk), every output validated with ajv (+ ajv-formats) against the schema it was
// asked to meet. The server serves random weights (the bundled k3-tiny) and the requests sample at
// temperature 1, so validity comes from the grammar alone.
//
//   - our schema set (every supported keyword, short sentences so random weights finish) through
//     chat response_format json_schema, vLLM's structured_outputs / guided_json, the Responses API's
//     text.format, and the Messages API's output_config.format: every output must finish and validate;
//   - the tool schemas Claude Code and Codex send (src/structured/testdata/agent_tool_schemas.json),
//     each as a strict tool named by tool_choice (chat) or forced with tool_choice any (Messages):
//     every finished call must validate (a call cut by max_tokens is counted, not validated), and
//     most must finish;
//   - regex / choice constraints through the SDK's extra body fields.
//
//   node tests/clients/structured_outputs_test.mjs --base-url http://127.0.0.1:8000 [--model k3-tiny]
//        [--openai-dir .testdata/openai-node] [--anthropic-dir .testdata/anthropic-sdk]
//        [--ajv-dir .testdata/ajv] [--schemas src/structured/testdata/agent_tool_schemas.json] [--only S]
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs, checker } from "./harness.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.join(here, "../..");
const args = parseArgs("structured_outputs_test.mjs", {
  "base-url": "http://127.0.0.1:8000",
  model: "k3-tiny",
  "openai-dir": path.join(root, ".testdata/openai-node"),
  "anthropic-dir": path.join(root, ".testdata/anthropic-sdk"),
  "ajv-dir": path.join(root, ".testdata/ajv"),
  schemas: path.join(root, "src/structured/testdata/agent_tool_schemas.json"),
  only: "",
});
const base = args["base-url"].replace(/\/$/, "");
const MODEL = args.model;

let OpenAI, Anthropic, Ajv, addFormats;
try {
  OpenAI = (await import(pathToFileURL(path.join(path.resolve(args["openai-dir"]), "node_modules/openai/index.mjs")).href)).default;
  Anthropic = (await import(pathToFileURL(path.join(path.resolve(args["anthropic-dir"]), "node_modules/@anthropic-ai/sdk/index.mjs")).href)).default;
  const req = createRequire(path.join(path.resolve(args["ajv-dir"]), "node_modules/"));
  Ajv = req("ajv/dist/2020").default;  // draft 2020-12: prefixItems
  addFormats = req("ajv-formats").default;
} catch (e) {
  console.error(`cannot load the SDKs or ajv (run scripts/fetch_test_data.sh): ${e.message}`);
  process.exit(3);
}
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "unused", maxRetries: 0, timeout: 300_000 });
const anthropic = new Anthropic({ baseURL: base, apiKey: "unused", maxRetries: 0, timeout: 300_000 });
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

function validate(schema, value, what) {
  const { $schema, ...rest } = schema;  // every schema here is read as draft 2020-12
  const v = ajv.compile(rest);
  assert.ok(v(value), `${what}: ${JSON.stringify(value).slice(0, 400)} does not match: ${ajv.errorsText(v.errors)}`);
}

// Short sentences only: enums, bounded strings, numbers and arrays.
const OWN = {
  pick: {
    type: "object",
    properties: {
      color: { enum: ["red", "green", "blue"] },
      size: { type: "integer", minimum: 1, maximum: 12 },
      flags: { type: "array", items: { type: "boolean" }, maxItems: 2 },
    },
    required: ["color", "size"],
    additionalProperties: false,
  },
  formats: {
    type: "object",
    properties: {
      id: { type: "string", format: "uuid" },
      day: { type: "string", format: "date" },
      code: { type: "string", pattern: "^[A-Z]{2}-[0-9]{3}$" },
      ratio: { type: "number", minimum: 0, maximum: 1 },
      count: { type: "integer", exclusiveMinimum: 0, maximum: 50 },
      v: { const: 2 },
    },
    required: ["id", "day", "code", "ratio", "count", "v"],
    additionalProperties: false,
  },
  shapes: {
    $defs: {
      leaf: { type: "object", properties: { n: { type: "integer", minimum: 0, maximum: 9 } }, required: ["n"], additionalProperties: false },
    },
    type: "object",
    properties: {
      pair: { type: "array", prefixItems: [{ type: "boolean" }, { type: "null" }], items: false, minItems: 2 },
      one: { anyOf: [{ $ref: "#/$defs/leaf" }, { type: "null" }] },
      tag: { type: "string", minLength: 1, maxLength: 3, pattern: "^[a-z]+$" },
      merged: { allOf: [{ type: "object", properties: { a: { type: "boolean" }, b: { type: "null" } }, required: ["a"] }, { properties: { a: { type: "boolean" } }, additionalProperties: false }] },
    },
    required: ["pair", "one", "merged"],
    additionalProperties: false,
  },
};

const chatBase = { model: MODEL, messages: [{ role: "user", content: "Answer." }], temperature: 1, chat_template_kwargs: { thinking: false } };
const seeds = [1, 2, 3];
const { check, finish } = checker(args.only);

for (const [name, schema] of Object.entries(OWN)) {
  await check(`chat response_format json_schema ${name}`, async () => {
    for (const seed of seeds) {
      const r = await openai.chat.completions.create({ ...chatBase, seed, max_tokens: 600, response_format: { type: "json_schema", json_schema: { name, schema, strict: true } } });
      assert.equal(r.choices[0].finish_reason, "stop", JSON.stringify(r));
      validate(schema, JSON.parse(r.choices[0].message.content), `${name} seed ${seed}`);
    }
  });
  await check(`chat structured_outputs.json and guided_json ${name}`, async () => {
    for (const body of [{ structured_outputs: { json: schema } }, { guided_json: schema }]) {
      const r = await openai.chat.completions.create({ ...chatBase, seed: 7, max_tokens: 600, ...body });
      assert.equal(r.choices[0].finish_reason, "stop", JSON.stringify(r));
      validate(schema, JSON.parse(r.choices[0].message.content), `${name} ${Object.keys(body)[0]}`);
    }
  });
  await check(`responses text.format json_schema ${name}`, async () => {
    const r = await openai.responses.create({ model: MODEL, input: "Answer.", temperature: 1, max_output_tokens: 600, reasoning: { effort: "none" }, text: { format: { type: "json_schema", name, schema, strict: true } } });
    assert.equal(r.status, "completed", JSON.stringify(r));
    validate(schema, JSON.parse(r.output_text), `${name} responses`);
  });
  await check(`messages output_config.format ${name}`, async () => {
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 600, temperature: 1, thinking: { type: "disabled" }, messages: [{ role: "user", content: "Answer." }], output_config: { format: { type: "json_schema", schema } } });
    assert.equal(r.stop_reason, "end_turn", JSON.stringify(r));
    validate(schema, JSON.parse(r.content.filter((b) => b.type === "text").map((b) => b.text).join("")), `${name} messages`);
  });
}

// The string formats with bounded text, sampled many times: a grammar must never emit what the
// validator refuses (a run once let "0299-11-31" through as a date). Array items keep the number
// of requests small; a sample cut by max_tokens is counted, not validated.
await check("string formats, 4 x 4 samples each, validated by ajv-formats", async () => {
  const formats = ["date-time", "date", "time", "duration", "uuid", "ipv4", "ipv6"];
  const key = (f) => f.replace("-", "_");
  const schema = {
    type: "object",
    properties: Object.fromEntries(formats.map((f) => [key(f), { type: "array", items: { type: "string", format: f }, minItems: 4, maxItems: 4 }])),
    required: formats.map(key),
    additionalProperties: false,
  };
  let finished = 0;
  for (const seed of [11, 12, 13, 14]) {
    const r = await openai.chat.completions.create({ ...chatBase, seed, max_tokens: 3000, response_format: { type: "json_schema", json_schema: { name: "formats", schema, strict: true } } });
    if (r.choices[0].finish_reason !== "stop") continue;
    validate(schema, JSON.parse(r.choices[0].message.content), `formats seed ${seed}`);
    ++finished;
  }
  console.log(`     string formats: ${finished} of 4 samples finished and validated`);
  assert.ok(finished >= 2, `only ${finished} of 4 format samples finished inside max_tokens`);
});

await check("chat guided_regex and structured_outputs.choice", async () => {
  for (const seed of seeds) {
    const r = await openai.chat.completions.create({ ...chatBase, seed, max_tokens: 80, guided_regex: "[a-f]{3}-[0-9]{2,4}" });
    assert.match(r.choices[0].message.content, /^[a-f]{3}-[0-9]{2,4}$/);
    const c = await openai.chat.completions.create({ ...chatBase, seed, max_tokens: 60, structured_outputs: { choice: ["left", "right", "up"] } });
    assert.ok(["left", "right", "up"].includes(c.choices[0].message.content), c.choices[0].message.content);
  }
});

// The agents' own tool schemas, each as a strict tool that must be called.
const agents = JSON.parse(fs.readFileSync(args.schemas, "utf8"));
let finished = 0, cut = 0;
for (const group of ["claude_code", "codex"]) {
  await check(`${group} tool schemas as strict named tools (chat)`, async () => {
    for (const [name, schema] of Object.entries(agents[group])) {
      const fn = name.replace(/[^a-zA-Z0-9_-]/g, "_");
      const r = await openai.chat.completions.create({
        ...chatBase, seed: 11, max_tokens: 1200, parallel_tool_calls: false,
        tools: [{ type: "function", function: { name: fn, parameters: schema, strict: true } }],
        tool_choice: { type: "function", function: { name: fn } },
      });
      const c = r.choices[0];
      if (c.finish_reason === "length") { cut++; continue; }
      assert.equal(c.finish_reason, "tool_calls", `${name}: ${JSON.stringify(c).slice(0, 400)}`);
      assert.equal(c.message.tool_calls.length, 1);
      assert.equal(c.message.tool_calls[0].function.name, fn);
      validate(schema, JSON.parse(c.message.tool_calls[0].function.arguments), `${group}.${name}`);
      finished++;
    }
  });
}
await check("claude_code tool schemas forced with tool_choice any (messages)", async () => {
  const tools = Object.entries(agents.claude_code).map(([name, schema]) => ({ name, input_schema: schema, strict: true }));
  for (const seed of [1, 2, 3, 4]) {
    const r = await anthropic.messages.create({ model: MODEL, max_tokens: 1200, temperature: 1, thinking: { type: "disabled" }, metadata: { user_id: `seed-${seed}` }, tools, tool_choice: { type: "any", disable_parallel_tool_use: true }, messages: [{ role: "user", content: "Use a tool." }] });
    if (r.stop_reason === "max_tokens") { cut++; continue; }
    assert.equal(r.stop_reason, "tool_use", JSON.stringify(r).slice(0, 400));
    const uses = r.content.filter((b) => b.type === "tool_use");
    assert.equal(uses.length, 1);
    validate(agents.claude_code[uses[0].name], uses[0].input, `messages ${uses[0].name}`);
    finished++;
  }
});
await check("most agent tool calls finish inside max_tokens", async () => {
  console.log(`     agent tool calls: ${finished} finished and validated, ${cut} cut by max_tokens`);
  assert.ok(finished > 0 && finished >= cut, `${finished} finished, ${cut} cut`);
});

finish("structured outputs checks");
