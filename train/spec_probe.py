"""train/spec_probe.py: real speculative-decoding acceptance of a served trained model.

Sends held-out prompts built from docs/validation/k3-code-15m/function_prompts.json (functions of
files held out from training) to a running `k3serve serve`, greedy, `--concurrency` at a time
(the batch the server sees), and reports the generated tokens per second with the server's own
counters (/metrics: drafts, draft tokens, accepted tokens per position, gated steps, model steps)
as a JSON bundle. Run it against servers started with and without --speculative-method. Sets:
  code     "Write a Python function `f()`: <docstring>" (code completion from a description)
  chat     "Explain what this code does" over a held-out function (prose about code)
  agentic  a coding agent's edit turn: the file's function read back in an earlier tool-call turn,
           then "rewrite it with a docstring and type hints" (most of the answer is in the context)

    python3 train/spec_probe.py --url http://127.0.0.1:8000 --label ngram --out ngram.json --set code --concurrency 8
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import time
import urllib.request

PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "validation", "k3-code-15m",
                       "function_prompts.json")


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or "spec_decode" not in line and "model_steps_total" not in line:
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def conversation(kind, item):
    """The messages of one request of prompt set `kind` from a held-out function {prompt, answer}."""
    if kind == "code":
        return [{"role": "user", "content": item["prompt"]}]
    code = item["answer"]
    if kind == "chat":
        return [{"role": "user", "content": "Explain what this Python code does, step by step:\n```python\n%s\n```" % code}]
    if kind == "agentic":
        call = {"id": "call_1", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": "src/module.py"})}}
        return [{"role": "system", "content": "You are a coding agent. Use the tools to read and edit files."},
                {"role": "user", "content": item["prompt"].split(":")[0] + " exists in src/module.py. Improve it."},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": code},
                {"role": "user", "content": "Rewrite that function in full with a docstring and type hints."}]
    raise ValueError("unknown prompt set " + kind)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--prompts", default=PROMPTS)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--set", default="code", choices=["code", "chat", "agentic"])
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    url = args.url.rstrip("/")
    model = json.load(urllib.request.urlopen(url + "/v1/models", timeout=30))["data"][0]["id"]
    items = json.load(open(args.prompts))[: args.count]
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                               "parameters": {"type": "object",
                                                              "properties": {"path": {"type": "string"}},
                                                              "required": ["path"]}}}]

    def send(item):
        body = {"model": model, "messages": conversation(args.set, item), "max_tokens": args.max_tokens,
                "temperature": 0}
        if args.set == "agentic":
            body["tools"] = tools
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.time()
        reply = json.load(urllib.request.urlopen(req, timeout=600))
        return {"seconds": round(time.time() - t0, 4), "tokens": reply["usage"]["completion_tokens"],
                "prompt_tokens": reply["usage"]["prompt_tokens"]}

    before, start = metrics(url), time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        samples = list(pool.map(send, items))
    seconds = time.time() - start
    after = metrics(url)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    tokens = sum(s["tokens"] for s in samples)
    drafts = sum(v for k, v in delta.items() if k.startswith("vllm:spec_decode_num_drafts_total"))
    accepted = sum(v for k, v in delta.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    drafted = sum(v for k, v in delta.items() if k.startswith("vllm:spec_decode_num_draft_tokens_total"))
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    bundle = {"label": args.label, "git": git, "model": model, "set": args.set, "concurrency": args.concurrency,
              "prompts": len(items), "max_tokens": args.max_tokens,
              "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2),
              "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
              "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
              "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
              "metrics_delta": delta, "samples": samples}
    with open(args.out, "w") as f:
        json.dump(bundle, f, indent=1)
    print("%s: %d tokens in %.1f s = %.1f tokens/s; drafts %d, accepted %d of %d draft tokens, mean acceptance "
          "length %s" % (args.label, tokens, seconds, tokens / seconds, drafts, accepted, drafted,
                         bundle["mean_acceptance_length"]))


if __name__ == "__main__":
    main()
