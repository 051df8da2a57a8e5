"""train/checkpoint.py: k3_torch models to and from the HF layout k3serve loads (spec 4, 9).

Names: `model.` before everything but `lm_head.weight`; a Mix's pseudo-query and norm become
`<side>_res_proj.weight` [1, D] and `<side>_res_norm.weight` [D]. Dtypes: BF16 (round to nearest
even), except the F32 tensors of spec 4 (KDA A_log, dt_bias, conv weights, o_norm; the router's
e_score_correction_bias); with cfg.mxfp4 the routed experts are `weight_packed` (U8 [out, in/2],
the even element in the low nibble) + `weight_scale` (U8 E8M0 [out, in/32]).

Pure Python safetensors (no package needed): an 8-byte little-endian header length, the JSON
header, the data. Shards of at most `shard_bytes` get a model.safetensors.index.json.
"""
import json
import os
import re
import struct

import torch

from k3_torch import K3Config, K3Model, mxfp4_dequantize, mxfp4_quantize

F32_SUFFIXES = ("A_log", "dt_bias", "conv1d.weight", "o_norm.weight", "e_score_correction_bias")
EXPERT_RE = re.compile(r"\.experts\.\d+\.w[123]\.weight$")
DTYPES = {"BF16": (torch.bfloat16, 2), "F32": (torch.float32, 4), "U8": (torch.uint8, 1), "I64": (torch.int64, 8),
          "I32": (torch.int32, 4)}


def hf_name(name):
    name = re.sub(r"(self_attention_res|mlp_res|output_attn_res)\.(proj|norm)$", r"\1_\2.weight", name)
    return name if name.startswith("lm_head.") else "model." + name


def export_tensors(model):
    """{hf name: tensor} exactly as written (bf16 / f32 / u8)."""
    out = {}
    state = model.state_dict()
    for name, t in state.items():
        n = hf_name(name)
        t = t.detach().cpu()
        if model.cfg.mxfp4 and EXPERT_RE.search(n):
            codes, exp = mxfp4_quantize(t.float())
            base = n[: -len(".weight")]
            out[base + ".weight_packed"] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).contiguous()
            out[base + ".weight_scale"] = (exp + 127).to(torch.uint8).contiguous()
        elif n.endswith(F32_SUFFIXES):
            out[n] = t.float().contiguous()
        else:
            out[n] = t.to(torch.bfloat16).contiguous()
    return out


def round_like_export(model):
    """Sets every parameter to the value the checkpoint holds (bf16 rounding, the MXFP4 round trip),
    so a float32 forward in PyTorch computes what k3serve computes from the files."""
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            n = hf_name(name)
            if model.cfg.mxfp4 and EXPERT_RE.search(n):
                p.copy_(mxfp4_dequantize(*mxfp4_quantize(p.float())))
            elif not n.endswith(F32_SUFFIXES) and p.dtype.is_floating_point:
                p.copy_(p.to(torch.bfloat16).float())


def tensor_bytes(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors):
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))  # aligned: widest first
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    dtype_name = {dtype: name for name, (dtype, _) in DTYPES.items()}
    for n in names:
        t = tensors[n]
        size = t.numel() * t.element_size()
        header[n] = {"dtype": dtype_name[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((-len(blob)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for n in names:
            f.write(tensor_bytes(tensors[n]))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        raw = bytearray(data[begin:end])
        if dtype == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        out[name] = t.reshape(info["shape"]) if info["shape"] else t.reshape(())
    return out


def save(model, out_dir, shard_bytes=15 << 20):
    """config.json + model.safetensors (or shards of at most shard_bytes and an index)."""
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.endswith(".safetensors") or f == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, f))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.cfg.to_hf(), f, indent=2)
        f.write("\n")
    tensors = export_tensors(model)
    shards, current, size = [], {}, 0
    for n in sorted(tensors):
        b = tensors[n].numel() * tensors[n].element_size()
        if current and size + b > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[n] = tensors[n]
        size += b
    shards.append(current)
    if len(shards) == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), shards[0])
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        file = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write_safetensors(os.path.join(out_dir, file), shard)
        weight_map.update({n: file for n in shard})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                   "weight_map": weight_map}, f, indent=1)
        f.write("\n")


def load(model_dir):
    """A K3Model holding a checkpoint folder's weights (float32; MXFP4 experts dequantized)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = K3Config.from_hf(json.load(f))
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(model_dir, f)))
    model = K3Model(cfg)
    state = {}
    for name in model.state_dict():
        n = hf_name(name)
        if n in tensors:
            state[name] = tensors[n].float()
            continue
        base = n[: -len(".weight")]
        packed, scale = tensors[base + ".weight_packed"], tensors[base + ".weight_scale"]
        codes = torch.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
        state[name] = mxfp4_dequantize(codes, scale.to(torch.int32) - 127)
    shapes = {n: t.shape for n, t in model.state_dict().items()}
    for name, t in state.items():
        state[name] = t.reshape(shapes[name])
    model.load_state_dict(state)
    return model
