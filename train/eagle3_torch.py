"""train/eagle3_torch.py: an EAGLE-3 draft for a trained K3-family target: the model (as
src/draft/eagle3_model.h computes it, vLLM's Eagle3LlamaForCausalLM), its training on the
target's own hidden states, and its Hugging Face checkpoint (LlamaForCausalLMEagle3, SpecForge's
`midlayer.` names) that `k3serve serve --speculative-method eagle3 --speculative-model DIR` loads.

Rows: row p of a sequence takes the token at p + 1 (the target's embedding, shared and frozen)
and a hidden state for p: fc over the target's taps at p (the inputs of the aux layers, spec
13.1), or for a chain row the draft's own pre-norm output of the row before; it predicts the token
at p + 2. Training unrolls two steps (EAGLE-3's training-time test): step 1 over the taps of every
position, step 2 with each row's hidden replaced by step 1's output of the position before and
attending to step 1's rows before it and to itself, as the engine's chain rows do.

    python3 train/eagle3_torch.py --target models/k3-code-15m --tokens train.bin --out DIR
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
from k3_torch import RMSNorm  # noqa: E402


class Eagle3Draft(nn.Module):
    def __init__(self, target_cfg, aux_layer_ids, draft_vocab, heads=4, kv_heads=2, head_dim=64,
                 intermediate=None, rope_theta=10000.0):
        super().__init__()
        h = target_cfg.hidden_size
        self.hidden, self.heads, self.kv_heads, self.head_dim = h, heads, kv_heads, head_dim
        self.aux_layer_ids, self.rope_theta = list(aux_layer_ids), rope_theta
        self.vocab, self.eps = target_cfg.vocab_size, target_cfg.rms_norm_eps
        self.intermediate = intermediate or 3 * h
        lin = lambda i, o: nn.Linear(i, o, bias=False)
        self.fc = lin(len(aux_layer_ids) * h, h)
        self.hidden_norm, self.input_layernorm = RMSNorm(h, self.eps), RMSNorm(h, self.eps)
        self.q_proj, self.k_proj = lin(2 * h, heads * head_dim), lin(2 * h, kv_heads * head_dim)
        self.v_proj, self.o_proj = lin(2 * h, kv_heads * head_dim), lin(heads * head_dim, h)
        self.post_attention_layernorm = RMSNorm(h, self.eps)
        self.gate_proj, self.up_proj, self.down_proj = lin(h, self.intermediate), lin(h, self.intermediate), lin(
            self.intermediate, h)
        self.norm = RMSNorm(h, self.eps)
        self.lm_head = lin(h, len(draft_vocab))
        self.register_buffer("draft_vocab", torch.as_tensor(sorted(draft_vocab), dtype=torch.long))  # target ids
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def tap_layers(self):
        """The engine's tap layers: aux id a is the input of target layer a, the tap of layer a - 1."""
        return [a - 1 for a in self.aux_layer_ids]

    def rope(self, x, positions):  # x [B, T, n, hd]; rotate-half over the whole head (draft/rope.h)
        half = self.head_dim // 2
        inv = 1.0 / self.rope_theta ** (torch.arange(half, dtype=torch.float32, device=x.device) * 2 / self.head_dim)
        ang = positions.float()[..., None] * inv  # [B, T, half]
        cos, sin = torch.cos(ang)[:, :, None, :], torch.sin(ang)[:, :, None, :]
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

    def qkv(self, embed, hidden, positions):
        b, t, _ = embed.shape
        n = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embed), n], -1)
        q = self.rope(self.q_proj(x).reshape(b, t, self.heads, self.head_dim), positions)
        k = self.rope(self.k_proj(x).reshape(b, t, self.kv_heads, self.head_dim), positions)
        v = self.v_proj(x).reshape(b, t, self.kv_heads, self.head_dim)
        return q, k, v, n

    def finish(self, attn, residual):  # attn [B, T, NH * hd]
        r = self.o_proj(attn) + residual
        x = self.post_attention_layernorm(r)
        prenorm = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x)) + r
        return prenorm, self.lm_head(self.norm(prenorm)).float()

    def expand_kv(self, k):  # GQA: query head h reads KV head h // (NH / NKV)
        return k.repeat_interleave(self.heads // self.kv_heads, dim=2)

    def forward(self, embed, hidden, positions, prev=None):
        """embed, hidden [B, T, H]; positions [B, T]. Without prev: causal attention over these rows
        (context rows). With prev = (k1, v1) of P earlier rows (positions 0..P-1), row i attends to
        the earlier rows 0..i + P - T and to itself (chain rows: in training P = T, row i at position
        i + 1 sees step 1's rows 0..i; one chain row after P context rows sees all of them)."""
        q, k, v, n = self.qkv(embed, hidden, positions)
        b, t = embed.shape[:2]
        scale = self.head_dim ** -0.5
        qh = q.transpose(1, 2).float()  # [B, NH, T, hd]
        kh, vh = self.expand_kv(k).transpose(1, 2).float(), self.expand_kv(v).transpose(1, 2).float()
        if prev is None:
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            s = (qh @ kh.transpose(-1, -2)) * scale
            a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vh
        else:
            k1, v1 = (self.expand_kv(x).transpose(1, 2).float() for x in prev)
            n_prev = k1.shape[2]
            s1 = (qh @ k1.transpose(-1, -2)) * scale  # [B, NH, T, P]
            seen = torch.ones(t, n_prev, dtype=torch.bool, device=q.device).tril(n_prev - t)
            s1 = s1.masked_fill(~seen, float("-inf"))
            s2 = (qh * kh).sum(-1, keepdim=True) * scale  # each row's own key
            p = torch.softmax(torch.cat([s1, s2], -1), -1)
            a = p[..., :n_prev] @ v1 + p[..., n_prev:] * vh
        a = a.transpose(1, 2).reshape(b, t, self.heads * self.head_dim).to(embed.dtype)
        residual = hidden  # norm_before_residual = false
        prenorm, logits = self.finish(a, residual)
        return prenorm, logits, (k, v)

    def to_hf(self):
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "hidden_size": self.hidden, "target_hidden_size": self.hidden, "vocab_size": self.vocab,
                "draft_vocab_size": int(self.draft_vocab.numel()), "num_attention_heads": self.heads,
                "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.intermediate, "hidden_act": "silu", "rms_norm_eps": self.eps,
                "rope_theta": self.rope_theta, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
                "tie_word_embeddings": False, "norm_before_residual": False,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.aux_layer_ids,
                                 "use_aux_hidden_state": True}}

    def save(self, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(self.to_hf(), f, indent=2)
            f.write("\n")
        names = {"fc": "fc", "norm": "norm", "lm_head": "lm_head"}
        tensors = {}
        for name, p in self.named_parameters():
            top = name.split(".")[0]
            hf = name if top in names else "midlayer." + (
                "self_attn." + name if top in ("q_proj", "k_proj", "v_proj", "o_proj") else
                "mlp." + name if top in ("gate_proj", "up_proj", "down_proj") else name)
            tensors[hf] = p.detach().cpu().to(torch.bfloat16).contiguous()
        if self.draft_vocab.numel() < self.vocab:
            d = self.draft_vocab.cpu()
            tensors["d2t"] = (d - torch.arange(d.numel())).to(torch.int64).contiguous()
        checkpoint.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)


def draft_loss(draft, target, ids, taps_fn):
    """Two-step training-time-test loss over windows ids [B, T]."""
    with torch.no_grad():
        taps = taps_fn(ids)  # list of [B, T, H]
        embed = target.embed_tokens(ids)
    b, t = ids.shape
    to_draft = torch.full((draft.vocab,), -100, dtype=torch.long, device=ids.device)
    to_draft[draft.draft_vocab] = torch.arange(draft.draft_vocab.numel(), device=ids.device)
    pos = torch.arange(t - 2, device=ids.device)[None].expand(b, -1)
    hidden = draft.fc(torch.cat([x[:, : t - 2] for x in taps], -1).to(embed.dtype))
    pre1, logits1, kv1 = draft(embed[:, 1: t - 1], hidden, pos)
    loss1 = F.cross_entropy(logits1.flatten(0, 1), to_draft[ids[:, 2:]].flatten(), ignore_index=-100)
    # Step 2: row i at position i + 1, token ids[i + 2], hidden = step 1's output at position i.
    pre2, logits2, _ = draft(embed[:, 2: t - 1], pre1[:, : t - 3], pos[:, : t - 3] + 1,
                             prev=(kv1[0][:, : t - 3], kv1[1][:, : t - 3]))
    loss2 = F.cross_entropy(logits2.flatten(0, 1), to_draft[ids[:, 3:]].flatten(), ignore_index=-100)
    return loss1, loss2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the trained target's checkpoint folder")
    ap.add_argument("--tokens", required=True, help="token stream (k3serve encode-corpus)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft-vocab", type=int, default=2048, help="the most frequent target ids (0: all)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
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
    k = args.draft_vocab or cfg.vocab_size
    vocab = torch.topk(counts.float(), k).indices.tolist()
    L = cfg.num_hidden_layers
    aux = sorted({min(max(a, 1), L - 1) for a in (2, L // 2, L - 3)})  # vLLM's default (2, L/2, L-3)
    draft = Eagle3Draft(cfg, aux, vocab).to(device)
    taps_fn = lambda ids: target(ids, taps=draft.tap_layers(), head=False)[1]
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    start, step, log = time.time(), 0, []
    print("EAGLE-3 draft: %.2f M parameters, aux layers %s, draft vocab %d covering %.1f%% of the stream" % (
        sum(p.numel() for p in draft.parameters()) / 1e6, aux, k, 100 * counts[vocab].sum().item() / stream.numel()),
        flush=True)
    while time.time() - start < args.seconds:
        progress = (time.time() - start) / args.seconds
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        s = torch.randint(0, stream.numel() - args.seq_len - 1, (args.batch,), generator=gen)
        ids = stream[s[:, None] + torch.arange(args.seq_len)].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss1, loss2 = draft_loss(draft, target, ids, taps_fn)
        loss = loss1 + 0.5 * loss2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0 or step == 1:
            rec = {"step": step, "loss1": round(loss1.item(), 4), "loss2": round(loss2.item(), 4),
                   "seconds": round(time.time() - start, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
    draft.cpu().save(args.out)
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump({"steps": step, "seconds": round(time.time() - start, 1), "args": vars(args),
                   "tokens_seen": step * args.batch * args.seq_len, "log": log}, f, indent=1)
    print("wrote %s after %d steps" % (args.out, step), flush=True)


if __name__ == "__main__":
    main()
