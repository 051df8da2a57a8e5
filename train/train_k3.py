"""train/train_k3.py: trains a small K3-family model (train/k3_torch.py) on a token stream
written by `k3serve encode-corpus`, and writes the HF-layout checkpoint k3serve serves.

Windows of --seq-len tokens are drawn at random offsets of the stream (documents are separated
by [EOS]); AdamW with warm-up and cosine decay under bf16 autocast; the MoE selection bias is
balanced without an auxiliary loss; the routed experts train against their MXFP4 round trip for
the last --qat-fraction of the steps, so the exported MXFP4 experts are what training used.
Training stops at --steps or after --seconds, whichever comes first; the held-out loss is
measured last on --heldout and written with the run's facts to OUT/train_report.json. With
--state and --session-seconds a run longer than one call trains in several: each stops after
--session-seconds, writes the state (weights, optimizer, data order, steps, seconds) and a usable
checkpoint, and the next resumes on the same schedule.

    python3 train/train_k3.py --tokens train.bin --heldout heldout.bin --tokenizer TOK --out DIR
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
from k3_torch import K3Config, K3Model  # noqa: E402


def load_tokens(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u4").astype(np.int64))


def batches(stream, batch, seq_len, gen, device):
    n = stream.numel() - seq_len - 1
    while True:
        starts = torch.randint(0, n, (batch,), generator=gen)
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
        window = stream[idx].to(device, non_blocking=True)
        yield window[:, :-1], window[:, 1:]


@torch.no_grad()
def heldout_loss(model, stream, seq_len, device, max_tokens=2_000_000):
    model.eval()
    total, count = 0.0, 0
    usable = min(stream.numel() - 1, max_tokens)
    for start in range(0, usable - seq_len, seq_len):
        x = stream[start:start + seq_len][None].to(device)
        y = stream[start + 1:start + seq_len + 1][None].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / max(count, 1), count


def tokenizer_ids(tok_dir):
    """bos/eos/pad ids of a K3 tokenizer folder (the config must name the same ones)."""
    with open(os.path.join(tok_dir, "tokenizer_config.json")) as f:
        cfg = json.load(f)
    by_text = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    vocab = max(by_text.values()) + 1
    # K3: the config's eos_token_id is <|end_of_msg|>, the token that ends an assistant turn.
    return vocab, by_text["[BOS]"], by_text["<|end_of_msg|>"], by_text["[PAD]"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--tokenizer", required=True, help="tokenizer folder; copied into OUT")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="", help="JSON object of K3Config fields overriding the defaults")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--seconds", type=float, default=420)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--qat-fraction", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", default="", help="resume from this file when it exists; write it when stopping")
    ap.add_argument("--session-seconds", type=float, default=0,
                    help="stop this run after this long (the schedule still spans --seconds in all); 0: no limit")
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # KDA's chunk algebra and the router stay in full fp32 (no tf32: the chunk scan multiplies
    # transition matrices together, and the router picks experts by small score differences).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    vocab, bos, eos, pad = tokenizer_ids(args.tokenizer)
    cfg = K3Config(vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad,
                   **json.loads(args.config or "{}"))
    model = K3Model(cfg).to(device)
    params = sum(p.numel() for p in model.parameters())
    stream, held = load_tokens(args.tokens), load_tokens(args.heldout)
    print("model: %.2f M parameters; train stream %.1f M tokens; held-out %.2f M tokens; device %s" % (
        params / 1e6, stream.numel() / 1e6, held.numel() / 1e6, device), flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    step, log, before = 0, [], 0.0  # before: training seconds of earlier runs (--state)
    if args.state and os.path.exists(args.state):
        st = torch.load(args.state, map_location=device)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        gen.set_state(st["generator"])
        step, log, before = st["step"], st["log"], st["seconds"]
        print("resumed from %s at step %d (%.0f s trained)" % (args.state, step, before), flush=True)
    data = batches(stream, args.batch, args.seq_len, gen, device)
    start = time.time()
    # The schedule runs on the time budget when that ends first: progress = max(step, time) fraction.
    while step < args.steps:
        if args.session_seconds and time.time() - start >= args.session_seconds:
            break
        elapsed = before + time.time() - start
        progress = max(step / args.steps, elapsed / args.seconds)
        if progress >= 1:
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        qat = progress >= 1 - args.qat_fraction
        for moe in model.moe_layers():
            moe.fake_quant = qat and cfg.mxfp4
        x, y = next(data)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        for moe in model.moe_layers():
            moe.balance(1e-3)
        step += 1
        if step % 50 == 0 or step == 1:
            el = before + time.time() - start
            rec = {"step": step, "loss": round(loss.item(), 4), "lr": lr, "seconds": round(el, 1),
                   "tokens_per_s": round(step * args.batch * args.seq_len / el), "qat": qat}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    train_seconds = before + time.time() - start
    if args.state:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": gen.get_state(),
                    "step": step, "log": log, "seconds": train_seconds}, args.state)
    checkpoint.round_like_export(model)
    for moe in model.moe_layers():
        moe.fake_quant = False  # the weights now hold the MXFP4 values themselves
    loss, count = heldout_loss(model, held, min(args.seq_len, 2048), device)
    model.cpu()
    checkpoint.save(model, args.out)
    for f in ("tiktoken.model", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.tokenizer, f), os.path.join(args.out, f))
    report = {"parameters": params, "steps": step, "train_seconds": round(train_seconds, 1),
              "tokens_seen": step * args.batch * args.seq_len, "heldout_loss": round(loss, 4),
              "heldout_tokens": count, "heldout_bits_per_token": round(loss / math.log(2), 4),
              "args": vars(args), "config": cfg.to_hf(), "device": torch.cuda.get_device_name() if
              device.type == "cuda" else "cpu", "torch": torch.__version__, "log": log}
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print("held-out loss %.4f nats/token over %d tokens; %d steps in %.0f s; wrote %s" % (
        loss, count, step, train_seconds, args.out), flush=True)


if __name__ == "__main__":
    main()
