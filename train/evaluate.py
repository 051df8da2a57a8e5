"""train/evaluate.py: task accuracy and sample answers of a served model, through the OpenAI chat
API of a running `k3serve serve` (the path users take: chat template, tokenizer, sampler).

Tasks come from train/corpus.py's eval.json (held out from training):
  retrieval  a long context of real files with planted "the code for X is Y" facts; correct when
             the answer names Y. Reported per context size (1K, 4K, 16K, 32K tokens).
  function   "Write a Python function `name(args)`: summary"; correct when the answer holds a
             `def name(...):` header that parses as Python.
Greedy decoding, so two servers (the CPU oracle and a GPU path) can be compared task by task.

    python3 train/evaluate.py --url http://127.0.0.1:8000 --tasks eval.json --out result.json
"""
import argparse
import ast
import json
import re
import sys
import time
import urllib.request

SAMPLE_PROMPTS = [
    "Write a Python function `is_prime(n)`: Return True if n is a prime number.",
    "Write a Python function `read_json(path)`: Load a JSON file and return its contents.",
    "What does this function do?\n\n```python\ndef mean(values):\n    return sum(values) / len(values)\n```",
    "Hello! What can you do?",
]


def served_model(url):
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=30) as r:
        return json.load(r)["data"][0]["id"]


def chat(url, prompt, max_tokens, timeout=600):
    body = json.dumps({"model": served_model(url), "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        reply = json.load(r)
    msg = reply["choices"][0]["message"]
    usage = dict(reply.get("usage", {}), reasoning=(msg.get("reasoning_content") or "")[:400])
    return (msg.get("content") or ""), usage


def function_correct(task, answer):
    """The answer defines the asked-for function: a `def name(...):` header that parses as Python
    (the body may be cut off by max_tokens)."""
    name = re.search(r"`(\w+)\(", task["prompt"]).group(1)
    for line in answer.splitlines():
        header = line.strip()
        if header.startswith("def %s(" % name) and header.endswith(":"):
            try:
                ast.parse(header + " pass")
                return True
            except SyntaxError:
                continue
    return False


def wait_ready(url, seconds=300):
    end = time.time() + seconds
    while time.time() < end:
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=5):
                return
        except Exception:
            time.sleep(1)
    raise SystemExit("evaluate.py: no server at %s after %d s" % (url, seconds))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--tasks", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--kinds", default="retrieval,function")
    ap.add_argument("--max-context", type=int, default=32000, help="skip retrieval tasks above this many tokens")
    ap.add_argument("--per-group", type=int, default=25, help="tasks per (kind, context size)")
    args = ap.parse_args()
    wait_ready(args.url)
    with open(args.tasks) as f:
        tasks = json.load(f)
    kinds = set(args.kinds.split(","))
    groups, results = {}, []
    start = time.time()
    for t in tasks:
        if t["kind"] not in kinds or t.get("context_tokens", 0) > args.max_context:
            continue
        group = t["kind"] + ("@%d" % t["context_tokens"] if "context_tokens" in t else "")
        if groups.get(group, [0, 0])[1] >= args.per_group:
            continue
        answer, usage = chat(args.url, t["prompt"], 24 if t["kind"] == "retrieval" else 256)
        ok = (t["answer"] in answer) if t["kind"] == "retrieval" else function_correct(t, answer)
        g = groups.setdefault(group, [0, 0])
        g[0] += ok
        g[1] += 1
        results.append({"group": group, "correct": bool(ok), "answer": answer[:400],
                        "prompt_tokens": usage.get("prompt_tokens")})
    samples = []
    for p in SAMPLE_PROMPTS:
        answer, usage = chat(args.url, p, 200)
        samples.append({"prompt": p, "answer": answer, "reasoning": usage["reasoning"]})
    summary = {g: {"correct": c, "total": n, "accuracy": round(c / n, 4)} for g, (c, n) in sorted(groups.items())}
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "seconds": round(time.time() - start, 1), "samples": samples,
                   "results": results}, f, indent=1)
    for g, s in summary.items():
        print("%-16s %3d / %3d = %.3f" % (g, s["correct"], s["total"], s["accuracy"]))
    for s in samples:
        print("--- %s\n%s" % (s["prompt"], s["answer"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
