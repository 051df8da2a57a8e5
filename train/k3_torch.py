"""train/k3_torch.py: the K3-family model (spec k3-model.md) in PyTorch, for training.

The same function the engine serves: every formula follows the contract's sections (cited per
block), parameters carry the checkpoint's names, and train/checkpoint.py writes them in the HF
layout `k3serve` loads unchanged. train/oracle_check.py proves it: a random model written by
this file gives the logits of `k3serve logits --precision fp32` to ~1e-4.

Training form: KDA runs the chunked algorithm of spec 5.7 with 16-token chunks (so e^-G stays
below e^80 in fp32); MLA runs the naive form 6.1 (the engine's absorbed decode is the same
function); the routed experts can be fake-quantized to MXFP4 (spec 9) with a straight-through
gradient, so the exported MXFP4 experts are what training saw.
"""
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

KDA_CHUNK = 16
MLA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm (spec 6.1: Moonshot's reference)


@dataclass
class K3Config:
    vocab_size: int = 8192
    hidden_size: int = 256
    num_hidden_layers: int = 8
    intermediate_size: int = 768  # dense FFN of the first layers
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    num_experts: int = 16
    num_experts_per_token: int = 4
    num_shared_experts: int = 2
    moe_intermediate_size: int = 128
    routed_expert_hidden_size: int = 128
    num_attention_heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64
    kda_num_heads: int = 4
    kda_head_dim: int = 64
    short_conv_kernel_size: int = 4
    gate_lower_bound: float = -5.0
    full_attn_layers: list = field(default_factory=lambda: [4, 8])  # 1-based, as in config.json
    attn_res_block_size: int = 4
    rms_norm_eps: float = 1e-5
    situ_beta: float = 4.0
    situ_linear_beta: float = 25.0
    mxfp4: bool = True
    bos_token_id: int = 0
    eos_token_id: int = 0
    pad_token_id: int = 0

    def is_mla(self, layer):  # 0-based
        return layer + 1 in self.full_attn_layers

    def is_moe(self, layer):
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    @staticmethod
    def from_hf(j):
        """The inverse of to_hf, for a config.json this trainer wrote (or any K3-family one)."""
        la = j["linear_attn_config"]
        return K3Config(
            vocab_size=j["vocab_size"], hidden_size=j["hidden_size"], num_hidden_layers=j["num_hidden_layers"],
            intermediate_size=j["intermediate_size"], first_k_dense_replace=j["first_k_dense_replace"],
            moe_layer_freq=j["moe_layer_freq"], num_experts=j["num_experts"],
            num_experts_per_token=j["num_experts_per_token"], num_shared_experts=j["num_shared_experts"],
            moe_intermediate_size=j["moe_intermediate_size"], routed_expert_hidden_size=j["routed_expert_hidden_size"],
            num_attention_heads=j["num_attention_heads"], q_lora_rank=j["q_lora_rank"], kv_lora_rank=j["kv_lora_rank"],
            qk_nope_head_dim=j["qk_nope_head_dim"], qk_rope_head_dim=j["qk_rope_head_dim"], v_head_dim=j["v_head_dim"],
            kda_num_heads=la["num_heads"], kda_head_dim=la["head_dim"], short_conv_kernel_size=la["short_conv_kernel_size"],
            gate_lower_bound=la["gate_lower_bound"], full_attn_layers=list(la["full_attn_layers"]),
            attn_res_block_size=j["attn_res_block_size"], rms_norm_eps=j["rms_norm_eps"],
            situ_beta=j["activation_situ_beta"], situ_linear_beta=j["activation_situ_linear_beta"],
            mxfp4="quantization_config" in j, bos_token_id=j.get("bos_token_id", 0),
            eos_token_id=j.get("eos_token_id", 0), pad_token_id=j.get("pad_token_id", 0))

    def to_hf(self):
        """config.json in the form k3serve's config parser reads (spec 1.1, 14.1)."""
        kda = [l + 1 for l in range(self.num_hidden_layers) if not self.is_mla(l)]
        j = {
            "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "intermediate_size": self.intermediate_size,
            "first_k_dense_replace": self.first_k_dense_replace, "moe_layer_freq": self.moe_layer_freq,
            "num_experts": self.num_experts, "num_experts_per_token": self.num_experts_per_token,
            "num_shared_experts": self.num_shared_experts, "moe_intermediate_size": self.moe_intermediate_size,
            "routed_expert_hidden_size": self.routed_expert_hidden_size, "latent_moe_use_norm": True,
            "moe_router_activation_func": "sigmoid", "moe_renormalize": True, "routed_scaling_factor": 1.0,
            "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
            "hidden_act": "situ", "activation_situ_beta": self.situ_beta,
            "activation_situ_linear_beta": self.situ_linear_beta,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank, "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim, "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim, "mla_use_nope": True, "mla_use_output_gate": True,
            "linear_attn_config": {
                "num_heads": self.kda_num_heads, "head_dim": self.kda_head_dim,
                "short_conv_kernel_size": self.short_conv_kernel_size,
                "gate_lower_bound": self.gate_lower_bound, "use_full_rank_gate": True,
                "kda_layers": kda, "full_attn_layers": [l for l in self.full_attn_layers
                                                        if l <= self.num_hidden_layers]},
            "attn_res_block_size": self.attn_res_block_size, "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": False, "max_position_embeddings": 1048576,
            "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id, "torch_dtype": "bfloat16",
        }
        if self.mxfp4:
            j["quantization_config"] = {
                "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                "config_groups": {"group_0": {
                    "format": "mxfp4-pack-quantized", "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32}}},
                "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                           "re:.*lm_head.*"]}
        return j


# ---- numerics shared by every block -------------------------------------------------------

def rms_normalize(x, eps):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Spec 2: y = w * x * rsqrt(mean(x^2) + eps), computed in fp32."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return (self.weight.float() * rms_normalize(x, self.eps)).to(x.dtype)


def situ(a, c, beta, linear_beta):
    """Spec 8: SiTU(a, c) = [beta tanh(a / beta) sigmoid(a)] * [linear_beta tanh(c / linear_beta)]."""
    a, c = a.float(), c.float()
    return (beta * torch.tanh(a / beta) * torch.sigmoid(a)) * (linear_beta * torch.tanh(c / linear_beta))


def linear(dim_in, dim_out):
    return nn.Linear(dim_in, dim_out, bias=False)


# ---- MXFP4 (spec 9) ---------------------------------------------------------------------------

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def mxfp4_quantize(w):
    """w [out, in] (in % 32 == 0) -> (codes uint8 [out, in] with sign in bit 3, exponents int [out, in/32]).

    OCP MX: the group's scale is 2^(floor(log2(amax)) - 2) (E2M1's largest exponent is 2), the
    elements round to the nearest E2M1 value (ties to the lower magnitude) and saturate at 6.
    """
    out_dim, in_dim = w.shape
    g = w.float().reshape(out_dim, in_dim // 32, 32)
    amax = g.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-30))) - 2, torch.zeros_like(amax))
    exp = exp.clamp(-127, 127)
    scaled = (g / torch.pow(2.0, exp)[..., None]).abs()
    values = torch.tensor(FP4_VALUES, device=w.device)
    mids = (values[1:] + values[:-1]) / 2
    mag = torch.bucketize(scaled, mids, right=False)  # ties go to the lower value
    sign = (g < 0) & (mag > 0)
    codes = (mag | (sign.to(torch.long) << 3)).to(torch.uint8).reshape(out_dim, in_dim)
    return codes, exp.to(torch.int32)


def mxfp4_dequantize(codes, exp):
    out_dim, in_dim = codes.shape
    values = torch.tensor(FP4_VALUES, device=codes.device)
    c = codes.to(torch.long)
    mag = values[c & 7]
    v = torch.where((c & 8) != 0, -mag, mag).reshape(out_dim, in_dim // 32, 32)
    return (v * torch.pow(2.0, exp.float())[..., None]).reshape(out_dim, in_dim)


class FakeMxfp4(torch.autograd.Function):
    """Forward: the MXFP4 round trip; backward: the identity (straight-through)."""

    @staticmethod
    def forward(ctx, w):
        return mxfp4_dequantize(*mxfp4_quantize(w)).to(w.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad


# ---- Block Attention Residuals (spec 3, 3.1) ------------------------------------------------

class Mix(nn.Module):
    """Depth softmax over sources R_j: s_j = rho_j * sum_h R_j[h] n[h] q[h]; out = sum_j softmax(s)_j R_j."""

    def __init__(self, dim, eps):
        super().__init__()
        self.proj = nn.Parameter(torch.zeros(1, dim))  # pseudo-query; zero = uniform mixing at init
        self.norm = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, sources):  # list of [B, T, D]
        r = torch.stack([s.float() for s in sources], 0)  # [n, B, T, D]
        c = (self.norm.float() * self.proj.float()[0])
        s = (rms_normalize(r, self.eps) * c).sum(-1)  # [n, B, T]
        alpha = torch.softmax(s, 0)
        return (alpha[..., None] * r.float()).sum(0).to(sources[-1].dtype)


# ---- KDA (spec 5) -----------------------------------------------------------------------------

def kda_chunked(q, k, v, g, beta, chunk=KDA_CHUNK):
    """Spec 5.7. q, k [B, H, T, K] (q L2-normed and scaled), v [B, H, T, V], g [B, H, T, K] log-decay
    in (-5, 0), beta [B, H, T]; zero initial state. Returns o [B, H, T, V] (fp32)."""
    with torch.autocast(q.device.type, enabled=False):  # e^{+-G} products need fp32 (tf32 at most)
        return _kda_chunked_fp32(q, k, v, g, beta, chunk)


def _kda_chunked_fp32(q, k, v, g, beta, chunk):
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    pad = (-t) % chunk
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    n = (t + pad) // chunk
    q, k, v, g = (x.float().reshape(b, h, n, chunk, x.shape[-1]) for x in (q, k, v, g))
    beta = beta.float().reshape(b, h, n, chunk, 1)
    G = g.cumsum(-2)  # [B, H, N, C, K], >= -5 * C
    eg, eng = torch.exp(G), torch.exp(-G)
    qg, kg, kng = q * eg, k * eg, k * eng
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device)
    a_qk = (qg @ kng.transpose(-1, -2)).masked_fill(~causal.tril(), 0)  # diagonal included
    lower = (beta * (kg @ kng.transpose(-1, -2))).masked_fill(~causal.tril(-1), 0)  # strictly lower
    eye = torch.eye(chunk, device=q.device).expand_as(lower)
    system = eye + lower
    w = torch.linalg.solve_triangular(system, beta * kg, upper=False, unitriangular=True)
    u = torch.linalg.solve_triangular(system, beta * v, upper=False, unitriangular=True)
    g_last = G[..., -1:, :]  # [B, H, N, 1, K]
    k_decay = k * torch.exp(g_last - G)  # e^{G_C - G_r}, exponent <= 0
    # The state entering each chunk (K x V orientation) follows S_{n+1} = A_n S_n + B_n with
    # A_n = diag(e^{G_C}) - (e^{G_C - G} K)^T W and B_n = (e^{G_C - G} K)^T U: an inclusive
    # Hillis-Steele scan over the chunks gives every S_n in log2(N) batched steps, not N.
    kd_t = k_decay.transpose(-1, -2)  # [B, H, N, K, C]
    trans = torch.diag_embed(torch.exp(g_last[..., 0, :])) - kd_t @ w  # A_n [B, H, N, K, K]
    acc = kd_t @ u  # B_n [B, H, N, K, V]
    offset = 1
    while offset < n:
        acc = torch.cat([acc[:, :, :offset], trans[:, :, offset:] @ acc[:, :, :-offset] + acc[:, :, offset:]], 2)
        trans = torch.cat([trans[:, :, :offset], trans[:, :, offset:] @ trans[:, :, :-offset]], 2)
        offset *= 2
    states = torch.cat([torch.zeros_like(acc[:, :, :1]), acc[:, :, :-1]], 2)  # S entering chunk n
    v_new = u - w @ states
    o = qg @ states + a_qk @ v_new  # [B, H, N, C, V]
    return o.reshape(b, h, n * chunk, dv)[:, :, :t]


def kda_recurrent(q, k, v, g, beta):
    """Spec 5.5, token by token (the test reference for kda_chunked)."""
    b, h, t, dk = q.shape
    state = q.new_zeros(b, h, v.shape[-1], dk).float()  # V-major S[v][k]
    outs = []
    for i in range(t):
        state = state * torch.exp(g[:, :, i].float())[:, :, None, :]
        r = state @ k[:, :, i].float()[..., None]
        u = beta[:, :, i, None, None].float() * (v[:, :, i].float()[..., None] - r)
        state = state + u @ k[:, :, i].float()[:, :, None, :]
        outs.append((state @ q[:, :, i].float()[..., None])[..., 0])
    return torch.stack(outs, 2)


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, hk, kd = cfg.hidden_size, cfg.kda_num_heads, cfg.kda_head_dim
        p = hk * kd
        self.heads, self.head_dim, self.bound = hk, kd, cfg.gate_lower_bound
        self.q_proj, self.k_proj, self.v_proj, self.g_proj = (linear(d, p) for _ in range(4))
        self.o_proj = linear(p, d)
        self.f_a_proj, self.f_b_proj = linear(d, kd), linear(kd, p)
        self.b_proj = linear(d, hk)
        ks = cfg.short_conv_kernel_size
        self.q_conv1d, self.k_conv1d, self.v_conv1d = (nn.Conv1d(p, p, ks, groups=p, bias=False) for _ in range(3))
        self.A_log = nn.Parameter(torch.zeros(hk))
        self.dt_bias = nn.Parameter(torch.empty(p).uniform_(-6.0, -2.0))
        self.o_norm = RMSNorm(kd, cfg.rms_norm_eps)

    def conv(self, conv, x):  # spec 5.2: causal depthwise, SiLU; x [B, T, P]
        y = F.conv1d(F.pad(x.float().transpose(1, 2), (conv.kernel_size[0] - 1, 0)), conv.weight.float(),
                     groups=x.shape[-1])
        return F.silu(y).transpose(1, 2).to(x.dtype)

    def forward(self, x):
        b, t, _ = x.shape
        h, kd = self.heads, self.head_dim
        split = lambda y: y.reshape(b, t, h, kd).transpose(1, 2)  # [B, H, T, kd]
        q = split(self.conv(self.q_conv1d, self.q_proj(x))).float()
        k = split(self.conv(self.k_conv1d, self.k_proj(x))).float()
        v = split(self.conv(self.v_conv1d, self.v_proj(x)))
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * kd ** -0.5  # spec 5.3
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(self.b_proj(x).float()).transpose(1, 2)  # [B, H, T]
        f = self.f_b_proj(self.f_a_proj(x)).float()  # spec 5.4
        z = f + self.dt_bias.float()
        gate = self.bound * torch.sigmoid(torch.exp(self.A_log.float()).repeat_interleave(kd) * z)
        o = kda_chunked(q, k, v, split(gate), beta).transpose(1, 2)  # [B, T, H, kd]
        y = self.o_norm(o) * torch.sigmoid(split(self.g_proj(x)).transpose(1, 2).float())  # spec 5.6
        return self.o_proj(y.reshape(b, t, h * kd).to(x.dtype))


# ---- gated MLA (spec 6.1, naive form) ---------------------------------------------------------

class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, h = cfg.hidden_size, cfg.num_attention_heads
        self.h, self.nope, self.rope, self.vd, self.r = (h, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                                         cfg.v_head_dim, cfg.kv_lora_rank)
        self.q_a_proj = linear(d, cfg.q_lora_rank)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, MLA_NORM_EPS)
        self.q_b_proj = linear(cfg.q_lora_rank, h * (self.nope + self.rope))
        self.kv_a_proj_with_mqa = linear(d, self.r + self.rope)
        self.kv_a_layernorm = RMSNorm(self.r, MLA_NORM_EPS)
        self.kv_b_proj = linear(self.r, h * (self.nope + self.vd))
        self.g_proj = linear(d, h * self.vd)
        self.o_proj = linear(h * self.vd, d)
        self.scale = (self.nope + self.rope) ** -0.5

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).reshape(b, t, self.h, self.nope + self.rope)
        kv = self.kv_a_proj_with_mqa(x)
        c, k_pe = kv[..., :self.r], kv[..., self.r:]
        kvb = self.kv_b_proj(self.kv_a_layernorm(c)).reshape(b, t, self.h, self.nope + self.vd)
        k = torch.cat([kvb[..., :self.nope], k_pe[:, :, None, :].expand(b, t, self.h, self.rope)], -1)
        val = kvb[..., self.nope:]
        q, k, val = (y.transpose(1, 2) for y in (q, k, val))  # [B, H, T, .]
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, val, is_causal=True, scale=self.scale)
        else:  # PyTorch 1.x (Debian 12's): the same math
            s = (q.float() @ k.float().transpose(-1, -2)) * self.scale
            s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=x.device).tril(), float("-inf"))
            o = (torch.softmax(s, -1) @ val.float()).to(x.dtype)
        o = o.transpose(1, 2).reshape(b, t, self.h * self.vd)
        return self.o_proj(o * torch.sigmoid(self.g_proj(x).float()).to(o.dtype))


# ---- FFNs (spec 3.2, 7, 8) --------------------------------------------------------------------

class DenseFFN(nn.Module):
    def __init__(self, d, inter, cfg):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = linear(d, inter), linear(d, inter), linear(inter, d)
        self.betas = (cfg.situ_beta, cfg.situ_linear_beta)

    def forward(self, x):
        return self.down_proj(situ(self.gate_proj(x), self.up_proj(x), *self.betas).to(x.dtype))


class Expert(nn.Module):
    def __init__(self, latent, inter):
        super().__init__()
        self.w1, self.w3, self.w2 = linear(latent, inter), linear(latent, inter), linear(inter, latent)


class Gate(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size).normal_(0, 0.02))
        # Selection bias: not trained by gradient; LatentMoE.balance() moves it (auxiliary-loss-free
        # balancing, the role Quantile Balancing plays in K3 training).
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.num_experts))


class LatentMoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, lat = cfg.hidden_size, cfg.routed_expert_hidden_size
        self.top_k, self.betas, self.mxfp4 = cfg.num_experts_per_token, (cfg.situ_beta, cfg.situ_linear_beta), cfg.mxfp4
        self.gate = Gate(cfg)
        self.routed_expert_down_proj = linear(d, lat)
        self.routed_expert_norm = RMSNorm(lat, cfg.rms_norm_eps)
        self.routed_expert_up_proj = linear(lat, d)
        self.experts = nn.ModuleList(Expert(lat, cfg.moe_intermediate_size) for _ in range(cfg.num_experts))
        self.shared_experts = DenseFFN(d, cfg.num_shared_experts * cfg.moe_intermediate_size, cfg)
        self.fake_quant = False  # MXFP4 round trip of the expert weights in forward (train_k3.py turns it on)
        self.register_buffer("load", torch.zeros(cfg.num_experts), persistent=False)

    def expert_weight(self, w):
        return FakeMxfp4.apply(w) if self.fake_quant else w

    def forward(self, x):
        b, t, d = x.shape
        xf = x.reshape(-1, d)
        with torch.autocast(x.device.type, enabled=False):  # spec 7: the router runs in fp32
            scores = torch.sigmoid(xf.float() @ self.gate.weight.float().t())
        top = torch.topk(scores + self.gate.e_score_correction_bias.float(), self.top_k, -1).indices
        weights = scores.gather(-1, top)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        z = self.routed_expert_down_proj(xf)
        # Every expert on every row, weighted by the route (zero off the top-k): the same sum as
        # dispatching each row to its k experts, with no host synchronisation (E is small here).
        w1, w3, w2 = (torch.stack([self.expert_weight(getattr(e, n).weight) for e in self.experts]).to(z.dtype)
                      for n in ("w1", "w3", "w2"))  # [E, I, L], [E, I, L], [E, L, I]
        a = situ(torch.einsum("nl,eil->nei", z, w1), torch.einsum("nl,eil->nei", z, w3), *self.betas).to(z.dtype)
        y = torch.einsum("nei,eli->nel", a, w2)  # [N, E, L]
        route = torch.zeros(xf.shape[0], len(self.experts), device=x.device).scatter(1, top, weights)
        u = torch.einsum("ne,nel->nl", route, y.float())
        if self.training:
            self.load += torch.bincount(top.flatten(), minlength=self.load.numel()).float()
        y_r = self.routed_expert_up_proj(self.routed_expert_norm(u.to(x.dtype)))
        return (y_r + self.shared_experts(xf)).reshape(b, t, d)

    @torch.no_grad()
    def balance(self, rate):
        """Moves the selection bias toward equal load (over the steps since the last call)."""
        self.gate.e_score_correction_bias += rate * torch.sign(self.load.mean() - self.load)
        self.load.zero_()


# ---- the model (spec 3) -----------------------------------------------------------------------

class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = MLA(cfg) if cfg.is_mla(layer) else KDA(cfg)
        if cfg.is_moe(layer):
            self.block_sparse_moe = LatentMoE(cfg)
        else:
            self.mlp = DenseFFN(d, cfg.intermediate_size, cfg)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.self_attention_res = Mix(d, eps)
        self.mlp_res = Mix(d, eps)

    def ffn(self, x):
        return self.block_sparse_moe(x) if hasattr(self, "block_sparse_moe") else self.mlp(x)


class K3Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.layers = nn.ModuleList(DecoderLayer(cfg, l) for l in range(cfg.num_hidden_layers))
        self.output_attn_res = Mix(d, cfg.rms_norm_eps)
        self.norm = RMSNorm(d, cfg.rms_norm_eps)
        self.lm_head = linear(d, cfg.vocab_size)
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        out_std = std / math.sqrt(2 * self.cfg.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("conv1d.weight"):
                nn.init.normal_(p, 0.0, 0.25)
            elif p.dim() == 2 and not name.endswith("res.proj"):
                # Projections that write into the residual stream start smaller (GPT-2's rule).
                late = name.endswith(("o_proj.weight", "mlp.down_proj.weight", "shared_experts.down_proj.weight",
                                      "routed_expert_up_proj.weight"))
                nn.init.normal_(p, 0.0, out_std if late else std)

    def forward(self, ids, taps=None, head=True):
        """ids [B, T] -> logits [B, T, vocab] (fp32). taps: optional list of 0-based layers whose
        tapped hidden state (spec 13.1; the engine's model/model.h taps: the mixture the NEXT layer's
        attention side computes, so the last layer has none) is returned too, as a list of [B, T, D]; head=False returns (None, taps)."""
        assert taps is None or all(0 <= t < self.cfg.num_hidden_layers - 1 for t in taps), "a tap needs a next layer"
        cfg = self.cfg
        prefix = self.embed_tokens(ids)
        bank, tapped = [], {}
        for l, layer in enumerate(self.layers):
            h = layer.self_attention_res(bank + [prefix]) if bank else prefix
            if taps is not None and l - 1 in taps:
                tapped[l - 1] = h
            restart = l % cfg.attn_res_block_size == 0
            if restart:
                bank.append(prefix)
            a = layer.self_attn(layer.input_layernorm(h))
            prefix = a if restart else prefix + a
            h = layer.mlp_res(bank + [prefix])
            prefix = prefix + layer.ffn(layer.post_attention_layernorm(h))
        if not head:  # only the taps (a drafter's training): skip the final mix and lm_head
            return None, [tapped[t] for t in taps]
        h = self.output_attn_res(bank + [prefix])
        logits = self.lm_head(self.norm(h)).float()
        return (logits, [tapped[t] for t in taps]) if taps is not None else logits

    def moe_layers(self):
        return [l.block_sparse_moe for l in self.layers if hasattr(l, "block_sparse_moe")]
