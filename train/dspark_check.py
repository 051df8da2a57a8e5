"""train/dspark_check.py: the trainer's DSpark draft (train/dspark_torch.py) is the function the
engine's draft model computes (src/draft/draft_model.h).

A draft for the bundled target with random weights (std 1/sqrt(fan_in)) and a reduced draft
vocabulary is written by DSparkDraft.save; random taps of 41 context positions, a newest token and
a previous token per block row go through `k3eval_dspark_rows --precision fp32` (append_context,
forward_block, markov_bias) and through the PyTorch forward (one block at start 41 of a 49-token
window: the training form, whose mask must reproduce the engine's context prefix and non-causal
block). Base logits and the Markov term must agree to 1e-4 of their scale.

    python3 train/dspark_check.py --rows build/default/k3eval_dspark_rows --target models/k3-code-15m
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
from dspark_torch import DSparkDraft  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", required=True, help="path to the k3eval_dspark_rows program")
    ap.add_argument("--target", required=True)
    ap.add_argument("--context", type=int, default=41)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(5)
    target = checkpoint.load(args.target).eval()
    cfg = target.cfg
    vocab = sorted(torch.randperm(cfg.vocab_size - 256, generator=gen)[:1000].tolist())
    draft = DSparkDraft(cfg, [1, 3, 6], vocab).eval()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            else:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.bfloat16).float())  # the values the bf16 checkpoint holds
    k, big_p, h = draft.c["block_size"], args.context, cfg.hidden_size
    t = big_p + k + 1
    taps = torch.randn(1, t, 3 * h, generator=gen)
    ids = torch.randint(0, cfg.vocab_size - 256, (1, t), generator=gen)
    with torch.no_grad():
        base, markov = draft(target.embed_tokens, taps, ids, torch.tensor([big_p]))
    with tempfile.TemporaryDirectory() as tmp:
        draft_dir, case, out = (os.path.join(tmp, n) for n in ("draft", "case.safetensors", "out.safetensors"))
        draft.save(draft_dir)
        checkpoint.write_safetensors(case, {"taps": taps[0, :big_p].contiguous(),
                                            "x0": ids[0, big_p:big_p + 1].to(torch.int32).contiguous(),
                                            "prev": ids[0, big_p:big_p + k].to(torch.int32).contiguous()})
        r = subprocess.run([args.rows, "--target", args.target, "--draft", draft_dir, "--case", case, "--out", out],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("k3eval_dspark_rows failed (%d):\n%s" % (r.returncode, r.stderr))
            return 1
        got = checkpoint.read_safetensors(out)
    ok = True
    for name, g, w in (("base logits", got["base_logits"], base[0]), ("markov term", got["markov"], markov[0])):
        err = (g.float() - w).abs().max().item() / w.abs().max().item()
        agree = (g.argmax(-1) == w.argmax(-1)).float().mean().item()
        print("%s: max |diff| / max |value| = %.2e (scale %.2f), argmax agreement %.3f" % (
            name, err, w.abs().max().item(), agree))
        ok &= err < 1e-4
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
