// tests/clients/harness.mjs: what the SDK client tests share: their command line, the check
// runner (one line per check, a summary, exit 1 when any failed), /metrics helpers and the
// openai SDK's error check.
import assert from "node:assert/strict";

// `--key value` pairs into a copy of `defaults`; an unknown key or a missing value prints the
// usage (built from the defaults' keys) and exits 2.
export function parseArgs(script, defaults) {
  const args = { ...defaults };
  for (let i = 2; i < process.argv.length; i += 2) {
    const key = process.argv[i].replace(/^--/, "");
    if (!(key in args) || i + 1 >= process.argv.length) {
      const opts = Object.keys(defaults).map((k) => `[--${k} ${k.toUpperCase().replace(/-/g, "_")}]`).join(" ");
      console.error(`usage: node ${script} ${opts}`);
      process.exit(2);
    }
    args[key] = process.argv[i + 1];
  }
  return args;
}

// check(name, fn) runs fn (skipped unless its name contains `only`) and prints ok / FAIL with
// the time taken; finish(label) prints the counts and exits.
export function checker(only) {
  let failed = 0, passed = 0;
  return {
    async check(name, fn) {
      if (only && !name.includes(only)) return;
      const t0 = performance.now();
      try {
        await fn();
        passed++;
        console.log(`ok   ${name} (${Math.round(performance.now() - t0)} ms)`);
      } catch (e) {
        failed++;
        console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
      }
    },
    finish(label) {
      console.log(`${label}: ${passed} passed, ${failed} failed`);
      process.exit(failed ? 1 : 0);
    },
  };
}

// The value of the first sample of `name` on the server's /metrics page.
export async function metric(serverRoot, name) {
  const text = await (await fetch(serverRoot + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + "{") || l.startsWith(name + " "));
  assert.ok(line, `no ${name} in /metrics`);
  return Number(line.slice(line.lastIndexOf(" ") + 1));
}

// Runs `fn`, which must throw the openai SDK's error class `cls` with `status` and an OpenAI
// error body ({"error": {"message", ...}}); returns the error.
export async function expectOpenAIError(cls, status, fn) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e && e.constructor && e.constructor.name}: ${e && e.message}`);
    assert.equal(e.status, status);
    assert.equal(typeof e.error?.message, "string", "the error body has a message");
    return e;
  }
  assert.fail(`expected ${cls.name} (${status}), but the request succeeded`);
}

// Polls fn every 50 ms until it is true; fails naming `what` after `ms`.
export async function eventually(what, fn, ms = 10_000) {
  const until = Date.now() + ms;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > until) assert.fail(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
