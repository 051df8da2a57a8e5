"""train/dspark_torch.py: a DSpark draft for a trained K3-family target: the model as
src/draft/draft_model.h computes it (spec 13.2), its training on the target's own hidden states,
and the checkpoint (model_type k3_dspark) `k3serve serve --speculative-method dspark` loads.

The engine's reading of DSpark: context c_p = RMSNorm(context_proj(taps at p)) enters every draft
layer's latent cache as [RMSNorm(kv_a(c_p)[:r]) | RoPE(kv_a(c_p)[r:], p)]; a block of K rows at
positions P..P+K-1 (the newest token, then K-1 mask tokens) runs the layers (pre-norm residual,
MLA with an interleaved RoPE on the 64-wide slice, SiTU MLP) with every block row seeing all P
context rows and all K block rows (non-causal); row j's lm_head output U_{j+1} plus the Markov
term W2 W1[x_j] scores the token at P + j + 1. Training runs many blocks per window at once (a
mask keeps each block to its own context prefix and its own rows), with the true previous
tokens in the Markov term (teacher forcing).

    python3 train/dspark_torch.py --target models/k3-code-15m --tokens train.bin --out DIR
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
from k3_torch import RMSNorm, situ  # noqa: E402


def rope_interleaved(x, positions, theta):
    """draft/rope.h apply_rope: pairs (x[2i], x[2i+1]) rotated by position * theta^(-2i/d). x [..., T, d]
    with positions [T] (broadcast over leading dims after T's)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(d // 2, dtype=torch.float32, device=x.device) * 2 / d)
    ang = positions.float()[:, None] * inv  # [T, d/2]
    shape = [1] * (x.dim() - 2) + list(ang.shape)
    cos, sin = torch.cos(ang).reshape(shape), torch.sin(ang).reshape(shape)
    a, b = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        lin = lambda i, o: nn.Linear(i, o, bias=False)
        h, nh = c["hidden_size"], c["num_attention_heads"]
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h, c["rms_norm_eps"]), RMSNorm(h, c["rms_norm_eps"])
        self.q_a_proj = lin(h, c["q_lora_rank"])
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], c["rms_norm_eps"])
        self.q_b_proj = lin(c["q_lora_rank"], nh * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]))
        self.kv_a_proj_with_mqa = lin(h, c["kv_lora_rank"] + c["qk_rope_head_dim"])
        self.kv_a_layernorm = RMSNorm(c["kv_lora_rank"], c["rms_norm_eps"])
        self.kv_b_proj = lin(c["kv_lora_rank"], nh * (c["qk_nope_head_dim"] + c["v_head_dim"]))
        self.o_proj = lin(nh * c["v_head_dim"], h)
        self.gate_proj, self.up_proj = lin(h, c["intermediate_size"]), lin(h, c["intermediate_size"])
        self.down_proj = lin(c["intermediate_size"], h)


class DSparkDraft(nn.Module):
    def __init__(self, target_cfg, tap_layers, draft_vocab, layers=2, heads=4, block_size=7, markov_rank=64):
        super().__init__()
        h = target_cfg.hidden_size
        self.c = {"model_type": "k3_dspark", "architectures": ["K3DSparkModel"], "num_hidden_layers": layers,
                  "hidden_size": h, "vocab_size": target_cfg.vocab_size, "draft_vocab_size": len(draft_vocab),
                  "num_attention_heads": heads, "q_lora_rank": 128, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                  "qk_rope_head_dim": 32, "v_head_dim": 64, "rope_theta": 10000.0, "intermediate_size": 3 * h,
                  "activation_situ_beta": target_cfg.situ_beta, "activation_situ_linear_beta": target_cfg.situ_linear_beta,
                  "rms_norm_eps": target_cfg.rms_norm_eps, "block_size": block_size,
                  "target_layer_ids": list(tap_layers), "markov_rank": markov_rank, "use_confidence_head": False,
                  "mask_token_id": target_cfg.vocab_size - 256 + 8,  # a reserved special slot: never in text
                  "share_target_lm_head": False}
        c = self.c
        self.context_proj = nn.Linear(len(tap_layers) * h, h, bias=False)
        self.context_norm = RMSNorm(h, c["rms_norm_eps"])
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(layers))
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.lm_head = nn.Linear(h, len(draft_vocab), bias=False)
        self.markov_w1 = nn.Embedding(target_cfg.vocab_size, markov_rank)
        self.markov_w2 = nn.Linear(markov_rank, len(draft_vocab), bias=False)
        self.register_buffer("draft_vocab", torch.as_tensor(sorted(draft_vocab), dtype=torch.long))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def latents(self, layer, x, positions):  # x [B, S, H] -> c_n [B, S, r], k_pe [B, S, dr]
        r = self.c["kv_lora_rank"]
        kv = layer.kv_a_proj_with_mqa(x)
        return layer.kv_a_layernorm(kv[..., :r]), rope_interleaved(kv[..., r:], positions, self.c["rope_theta"])

    def forward(self, embed, taps, ids, starts):
        """embed: the target's embedding module; taps [B, T, n*H] of positions 0..T-1; ids [B, T];
        starts: block starts P (1 <= P, P + K <= T - 1), shared by the batch. Returns base logits U
        [B, m*K, Vd] and the Markov term [B, m*K, Vd] of the rows (block b row j: position
        starts[b] + j, scoring the token at starts[b] + j + 1 after the true token at starts[b] + j)."""
        c, K = self.c, self.c["block_size"]
        b, t = ids.shape
        m = starts.numel()
        nh, dn, dr, dv = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        ctx = self.context_norm(self.context_proj(taps))
        offs = torch.arange(K, device=ids.device)
        pos = (starts[:, None] + offs[None]).flatten()  # [m*K]
        block_ids = torch.full((b, m, K), c["mask_token_id"], dtype=torch.long, device=ids.device)
        block_ids[:, :, 0] = ids[:, starts]
        h = embed(block_ids.reshape(b, m * K))
        # Who sees what: block row (i, j) sees context rows < starts[i] and block i's K rows.
        see_ctx = torch.arange(t, device=ids.device)[None] < starts.repeat_interleave(K)[:, None]  # [mK, T]
        blk = torch.arange(m, device=ids.device).repeat_interleave(K)
        see = torch.cat([see_ctx, blk[:, None] == blk[None]], 1)  # [mK, T + mK]
        ctx_pos = torch.arange(t, device=ids.device)
        for layer in self.layers:
            x = layer.input_layernorm(h)
            q = layer.q_b_proj(layer.q_a_layernorm(layer.q_a_proj(x))).reshape(b, m * K, nh, dn + dr).transpose(1, 2)
            q_nope, q_pe = q[..., :dn], rope_interleaved(q[..., dn:], pos, c["rope_theta"])
            c_ctx, pe_ctx = self.latents(layer, ctx, ctx_pos)
            c_blk, pe_blk = self.latents(layer, x, pos)
            lat, kpe = torch.cat([c_ctx, c_blk], 1), torch.cat([pe_ctx, pe_blk], 1)  # [B, S, .]
            kv = layer.kv_b_proj(lat).reshape(b, -1, nh, dn + dv).transpose(1, 2)  # [B, NH, S, dn+dv]
            scale = (dn + dr) ** -0.5
            s = (q_nope.float() @ kv[..., :dn].float().transpose(-1, -2) +
                 q_pe.float() @ kpe.float()[:, None].transpose(-1, -2)) * scale
            p = torch.softmax(s.masked_fill(~see, float("-inf")), -1)
            o = (p @ kv[..., dn:].float()).transpose(1, 2).reshape(b, m * K, nh * dv).to(h.dtype)
            h = h + layer.o_proj(o)
            x = layer.post_attention_layernorm(h)
            h = h + layer.down_proj(situ(layer.gate_proj(x), layer.up_proj(x), c["activation_situ_beta"],
                                         c["activation_situ_linear_beta"]).to(x.dtype))
        base = self.lm_head(self.norm(h)).float()
        prev = ids[:, pos]  # the true token at each row's position
        return base, self.markov_w2(self.markov_w1(prev)).float()

    def save(self, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(self.c, f, indent=2)
            f.write("\n")
        tensors = {}
        for name, p in self.named_parameters():
            name = name.replace(".q_a_proj", ".self_attn.q_a_proj").replace(".q_a_layernorm", ".self_attn.q_a_layernorm")
            for n in ("q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
                name = name.replace("." + n, ".self_attn." + n)
            for n in ("gate_proj", "up_proj", "down_proj"):
                name = name.replace("." + n, ".mlp." + n)
            tensors[name] = p.detach().cpu().to(torch.bfloat16).contiguous()
        if self.draft_vocab.numel() < self.c["vocab_size"]:
            d = self.draft_vocab.cpu()
            tensors["d2t"] = (d - torch.arange(d.numel())).to(torch.int64).contiguous()
        checkpoint.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the trained target's checkpoint folder")
    ap.add_argument("--tokens", required=True, help="token stream (k3serve encode-corpus)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft-vocab", type=int, default=2048, help="the most frequent target ids (0: all)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=32, help="blocks per window")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    target = checkpoint.load(args.target).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    cfg = target.cfg
    stream = torch.from_numpy(np.fromfile(args.tokens, dtype="<u4").astype(np.int64))
    counts = torch.bincount(stream, minlength=cfg.vocab_size)
    vocab = torch.topk(counts.float(), args.draft_vocab or cfg.vocab_size).indices.tolist()
    L = cfg.num_hidden_layers
    taps = sorted({min(max(a, 0), L - 2) for a in (1, L // 2 - 1, L - 2)})
    draft = DSparkDraft(cfg, taps, vocab).to(device)
    K = draft.c["block_size"]
    to_draft = torch.full((cfg.vocab_size,), -100, dtype=torch.long, device=device)
    to_draft[draft.draft_vocab] = torch.arange(draft.draft_vocab.numel(), device=device)
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    start, step, log = time.time(), 0, []
    print("DSpark draft: %.2f M parameters, taps %s, K %d" % (
        sum(p.numel() for p in draft.parameters()) / 1e6, taps, K), flush=True)
    while time.time() - start < args.seconds:
        progress = (time.time() - start) / args.seconds
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        s = torch.randint(0, stream.numel() - args.seq_len - 1, (args.batch,), generator=gen)
        ids = stream[s[:, None] + torch.arange(args.seq_len)].to(device)
        starts = torch.randint(1, args.seq_len - K - 1, (args.blocks,), generator=gen).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            with torch.no_grad():
                tapped = torch.cat(target(ids, taps=taps, head=False)[1], -1)
            base, markov = draft(target.embed_tokens, tapped, ids, starts)
        want = ids[:, (starts[:, None] + torch.arange(K, device=device)[None]).flatten() + 1]
        loss = F.cross_entropy((base + markov).flatten(0, 1), to_draft[want].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0 or step == 1:
            rec = {"step": step, "loss": round(loss.item(), 4), "seconds": round(time.time() - start, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    draft.cpu().save(args.out)
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump({"steps": step, "seconds": round(time.time() - start, 1), "args": vars(args),
                   "tokens_seen": step * args.batch * args.seq_len, "log": log}, f, indent=1)
    print("wrote %s after %d steps" % (args.out, step), flush=True)


if __name__ == "__main__":
    main()
