"""train/corpus.py: the training corpus, from text and code already on the machine.

Sources: the Python sources and documentation (.py, .md, .rst, .txt) of every installed package
(the folders on sys.path) and the standard library. Deduplicated by content; a document's split
(train or held-out) is fixed by a hash of its text, so reruns agree. Writes JSON Lines that
`k3serve train-tokenizer` and `k3serve encode-corpus` read:

  train.jsonl     {"text"} documents, plus chats: "write this function" / "what does it do" turns
                  made from functions with docstrings, and long-context retrieval chats
  heldout.jsonl   held-out {"text"} documents (the held-out loss)
  eval.json       held-out task prompts with their answers: retrieval at 1K..32K tokens and
                  function completion (train/evaluate.py scores them)

    python3 train/corpus.py --out DIR [--max-bytes N] [--seed S]
"""
import argparse
import ast
import hashlib
import json
import os
import random
import sys

TEXT_EXT = (".py", ".md", ".rst", ".txt")
MAX_FILE_BYTES = 100_000
HELDOUT_PERCENT = 1

WORDS = ("alpha bravo cedar delta ember falcon garnet harbor indigo juniper kestrel lumen maple nickel onyx "
         "pepper quartz raven saffron tundra umber violet willow xenon yarrow zephyr").split()


def source_roots():
    roots = []
    for p in sys.path:
        if p and os.path.isdir(p) and not any(p.startswith(r + os.sep) or p == r for r in roots):
            roots.append(p)
    return sorted(set(roots))


def documents(max_bytes):
    """(path, text) of every readable source/doc file, each distinct text once, up to max_bytes."""
    seen, total = set(), 0
    for root in source_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(TEXT_EXT):
                    continue
                path = os.path.join(dirpath, name)
                try:
                    if os.path.getsize(path) > MAX_FILE_BYTES:
                        continue
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                except (OSError, UnicodeDecodeError, ValueError):
                    continue
                if len(text) < 200 or "\x00" in text:
                    continue
                digest = hashlib.sha1(text.encode()).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                yield path, text, digest
                total += len(text)
                if total >= max_bytes:
                    return


def function_chats(text, rng, limit=4):
    """Chats from the documented functions of one Python file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    lines = text.splitlines()
    chats = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if not doc or not hasattr(node, "end_lineno"):
            continue
        source = "\n".join(lines[node.lineno - 1: node.end_lineno])
        indent = len(source) - len(source.lstrip())
        source = "\n".join(l[indent:] if l[:indent].strip() == "" else l for l in source.splitlines())
        if not 80 <= len(source) <= 2500:
            continue
        summary = doc.strip().split("\n\n")[0].replace("\n", " ")
        args = ", ".join(a.arg for a in node.args.args)
        if rng.random() < 0.5:
            q = "Write a Python function `%s(%s)`: %s" % (node.name, args, summary)
            a = "```python\n%s\n```" % source
        else:
            q = "What does this function do?\n\n```python\n%s\n```" % source
            a = summary
        chats.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        if len(chats) >= limit:
            break
    return chats


def retrieval_task(filler, rng, chars):
    """A long context of real files with key/value facts planted at random places, and a question
    about one of them. Returns (context + question, answer)."""
    parts, size = [], 0
    while size < chars:
        t = filler[rng.randrange(len(filler))]
        start = rng.randrange(max(1, len(t) - 2000))
        piece = t[start:start + rng.randrange(500, 4000)]
        parts.append(piece)
        size += len(piece)
    keys = rng.sample(WORDS, 4)
    facts = {k: "%s-%d" % (rng.choice(WORDS), rng.randrange(1000, 10000)) for k in keys}
    for k, v in facts.items():
        parts.insert(rng.randrange(len(parts) + 1), "\nNOTE: the code for %s is %s.\n" % (k, v))
    key = rng.choice(keys)
    return "".join(parts) + "\n\nWhat is the code for %s?" % key, facts[key]


def retrieval_chat(filler, rng, chars):
    q, a = retrieval_task(filler, rng, chars)
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "The code for %s is %s." % (
        q.rsplit(" ", 1)[1].rstrip("?"), a)}]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=400_000_000)
    ap.add_argument("--retrieval-chats", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    n_docs = n_chats = n_held = total = 0
    filler, held_py = [], []
    with open(os.path.join(args.out, "train.jsonl"), "w") as train, \
            open(os.path.join(args.out, "heldout.jsonl"), "w") as held:
        for path, text, digest in documents(args.max_bytes):
            if digest[0] * 100 // 256 < HELDOUT_PERCENT:
                held.write(json.dumps({"text": text}) + "\n")
                n_held += 1
                if path.endswith(".py"):
                    held_py.append(text)
                continue
            train.write(json.dumps({"text": text}) + "\n")
            n_docs += 1
            total += len(text)
            if len(filler) < 20000:
                filler.append(text)
            if path.endswith(".py"):
                for chat in function_chats(text, rng):
                    train.write(json.dumps(chat) + "\n")
                    n_chats += 1
        # Retrieval chats: mostly 1-12K characters (a few hundred to ~3K tokens), some to 48K.
        for i in range(args.retrieval_chats):
            chars = rng.randrange(1000, 12000) if i % 10 else rng.randrange(12000, 48000)
            train.write(json.dumps(retrieval_chat(filler, rng, chars)) + "\n")
    # Held-out tasks: retrieval at four context sizes, function completion from held-out files.
    tasks = []
    eval_rng = random.Random(args.seed + 1)
    for tokens in (1000, 4000, 16000, 32000):
        for _ in range(25):
            q, a = retrieval_task(filler, eval_rng, tokens * 3)
            tasks.append({"kind": "retrieval", "context_tokens": tokens, "prompt": q, "answer": a})
    for text in held_py:
        for chat in function_chats(text, eval_rng, limit=1):
            q = chat["messages"][0]["content"]
            if q.startswith("Write"):
                tasks.append({"kind": "function", "prompt": q, "answer": chat["messages"][1]["content"]})
        if sum(t["kind"] == "function" for t in tasks) >= 50:
            break
    with open(os.path.join(args.out, "eval.json"), "w") as f:
        json.dump(tasks, f, indent=0)
    print("corpus: %d train documents (%.1f MB), %d function chats, %d retrieval chats, %d held-out "
          "documents, %d eval tasks, from %d roots" % (n_docs, total / 1e6, n_chats, args.retrieval_chats, n_held,
                                                       len(tasks), len(source_roots())))


if __name__ == "__main__":
    main()
