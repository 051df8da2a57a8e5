"""train/eagle3_check.py: the trainer's EAGLE-3 draft (train/eagle3_torch.py) is the function the
engine's draft model computes (src/draft/eagle3_model.h).

A draft for the bundled target with random weights (std 1/sqrt(fan_in): activations O(1), the
attention far from uniform) and a reduced draft vocabulary is written by Eagle3Draft.save; random
taps and tokens of 77 positions go through `k3eval_eagle3_rows --precision fp32` (context rows,
then one chain row on the last row's pre-norm output) and through the PyTorch forward (the
context rows causal; the chain row through the `prev` path training's second step uses). Both
sets of logits must agree to 1e-4 of their scale. A wrong RoPE half, GQA head mapping, residual
or mask gives 1e-1 or more.

    python3 train/eagle3_check.py --rows build/default/k3eval_eagle3_rows --target models/k3-code-15m
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
from eagle3_torch import Eagle3Draft  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", required=True, help="path to the k3eval_eagle3_rows program")
    ap.add_argument("--target", required=True)
    ap.add_argument("--positions", type=int, default=77)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(3)
    target = checkpoint.load(args.target).eval()
    cfg = target.cfg
    vocab = sorted(torch.randperm(cfg.vocab_size - 256, generator=gen)[:1000].tolist())
    draft = Eagle3Draft(cfg, [2, 4, 5], vocab).eval()
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            else:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            p.copy_(p.to(torch.bfloat16).float())  # the values the bf16 checkpoint holds
    t, h = args.positions, cfg.hidden_size
    taps = torch.randn(1, t, 3 * h, generator=gen)
    tokens = torch.randint(0, cfg.vocab_size - 256, (1, t), generator=gen)
    chain_token = torch.randint(0, cfg.vocab_size - 256, (1, 1), generator=gen)
    with torch.no_grad():
        pre, want, kv = draft(target.embed_tokens(tokens), draft.fc(taps), torch.arange(t)[None])
        _, want_chain, _ = draft(target.embed_tokens(chain_token), pre[:, t - 1:], torch.tensor([[t]]), prev=kv)
    with tempfile.TemporaryDirectory() as tmp:
        draft_dir, case, out = (os.path.join(tmp, n) for n in ("draft", "case.safetensors", "out.safetensors"))
        draft.save(draft_dir)
        checkpoint.write_safetensors(case, {"taps": taps[0].contiguous(), "tokens": tokens[0].to(torch.int32),
                                            "chain_token": chain_token[0].to(torch.int32)})
        r = subprocess.run([args.rows, "--target", args.target, "--draft", draft_dir, "--case", case, "--out", out],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("k3eval_eagle3_rows failed (%d):\n%s" % (r.returncode, r.stderr))
            return 1
        got = checkpoint.read_safetensors(out)
    ok = True
    for name, g, w in (("context rows", got["logits"], want[0]), ("chain row", got["chain_logits"], want_chain[0])):
        err = (g.float() - w).abs().max().item() / w.abs().max().item()
        agree = (g.argmax(-1) == w.argmax(-1)).float().mean().item()
        print("%s: max |diff| / max |logit| = %.2e (scale %.2f), argmax agreement %.3f" % (
            name, err, w.abs().max().item(), agree))
        ok &= err < 1e-4
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
