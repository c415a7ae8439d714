#!/usr/bin/env python3
"""A second, straightforward implementation of the Qwen2-VL / Qwen2.5-VL forward in plain
PyTorch, written from a prose description of the architecture (no transformers import). It writes, from random
weights, for each of qwen2_vl_small and qwen2_5_vl_small under --out:

  <name>.config.json          the config (legacy top-level layout, parsed by parse_hf_config)
  <name>.weights.safetensors  the weights under the legacy HF names (visual.*, model.*, lm_head.weight)
  <name>.io.safetensors       input_ids, attention_mask, pixel_values, image_grid_thw, labels,
                              logits [B, L, V] fp32, loss_sum (sum of shifted token CE), n_tokens

    python3 scripts/spec_reference.py --out /tmp/spec_ref

tests/vlm/model/hf_parity_test.cpp (SpecReference) runs it and compares. This checks the C++
model against an independent reading of the spec (index bookkeeping, permutations, rotary
layout); the HF transformers comparison (scripts/hf_reference.py, HfParity) is the other
half, since a misreading of the spec shared by both implementations would go unnoticed
here. Loops are written per token / per segment on purpose, in a different style from the
C++ code. Writes its own safetensors (no `safetensors` package needed).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DTYPES = {torch.float32: "F32", torch.int64: "I64"}

# Small shapes: vision head_dim 32 (2D rotary 8+8 frequencies), text head_dim 32
# (mrope_section sums to 16), window 56 px = 2x2 merged tokens so windows are exercised
# by the 4x4 and 4x8 patch images below.
COMMON_TEXT = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=512, hidden_act="silu", tie_word_embeddings=False,
    rope_scaling={"type": "mrope", "rope_type": "default", "mrope_section": [4, 6, 6]},
    image_token_id=250, video_token_id=251, vision_start_token_id=248, vision_end_token_id=249,
    vision_token_id=252, bos_token_id=0, eos_token_id=1, attention_dropout=0.0,
    use_sliding_window=False, torch_dtype="float32",
)

CONFIGS = {
    "qwen2_vl_small": dict(
        COMMON_TEXT, model_type="qwen2_vl", architectures=["Qwen2VLForConditionalGeneration"],
        vision_config=dict(depth=2, embed_dim=64, hidden_size=64, mlp_ratio=2.0, num_heads=2,
                           in_chans=3, in_channels=3, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2, hidden_act="quick_gelu")),
    "qwen2_5_vl_small": dict(
        COMMON_TEXT, model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"],
        tie_word_embeddings=True,
        vision_config=dict(depth=3, hidden_size=64, out_hidden_size=64, intermediate_size=96,
                           num_heads=2, in_chans=3, in_channels=3, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, hidden_act="silu",
                           window_size=56, fullatt_block_indexes=[1], tokens_per_second=2)),
}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def batch(c):
    img, vs, ve = c["image_token_id"], c["vision_start_token_id"], c["vision_end_token_id"]
    # Prompt 0: image (1,4,4) -> 4 tokens; prompt 1: image (1,4,8) -> 8 tokens. Left-padded.
    s0 = [5, 6, 7, vs] + [img] * 4 + [ve, 20, 21, 22, 23, 24, 25]
    s1 = [8, vs] + [img] * 8 + [ve, 30, 31, 32, 33, 34, 35, 36, 37]
    ans = (6, 8)
    L = max(len(s0), len(s1))
    ids = torch.full((2, L), 3, dtype=torch.int64)
    mask = torch.zeros((2, L), dtype=torch.int64)
    labels = torch.full((2, L), -100, dtype=torch.int64)
    for i, (s, a) in enumerate(((s0, ans[0]), (s1, ans[1]))):
        off = L - len(s)
        ids[i, off:] = torch.tensor(s)
        mask[i, off:] = 1
        labels[i, L - a:] = torch.tensor(s[-a:])
    g = torch.Generator().manual_seed(11)
    pixels = torch.randn(16 + 32, 3 * 2 * 14 * 14, generator=g)
    grid = torch.tensor([[1, 4, 4], [1, 4, 8]], dtype=torch.int64)
    return ids, mask, labels, pixels, grid


def dims(c):
    v = c["vision_config"]
    v2 = c["model_type"] == "qwen2_vl"
    E = v["embed_dim"] if v2 else v["hidden_size"]
    O = v["hidden_size"] if v2 else v["out_hidden_size"]
    I = int(E * v["mlp_ratio"]) if v2 else v["intermediate_size"]
    return v2, v, E, O, I


def param_shapes(c):
    v2, v, E, O, I = dims(c)
    S = {"visual.patch_embed.proj.weight": (E, 3, 2, 14, 14)}
    for b in range(v["depth"]):
        p = f"visual.blocks.{b}."
        for n in ("norm1", "norm2"):
            S[p + n + ".weight"] = (E,)
            if v2:
                S[p + n + ".bias"] = (E,)
        S[p + "attn.qkv.weight"], S[p + "attn.qkv.bias"] = (3 * E, E), (3 * E,)
        S[p + "attn.proj.weight"], S[p + "attn.proj.bias"] = (E, E), (E,)
        if v2:
            S[p + "mlp.fc1.weight"], S[p + "mlp.fc1.bias"] = (I, E), (I,)
            S[p + "mlp.fc2.weight"], S[p + "mlp.fc2.bias"] = (E, I), (E,)
        else:
            for n in ("gate_proj", "up_proj"):
                S[p + f"mlp.{n}.weight"], S[p + f"mlp.{n}.bias"] = (I, E), (I,)
            S[p + "mlp.down_proj.weight"], S[p + "mlp.down_proj.bias"] = (E, I), (E,)
    S["visual.merger.ln_q.weight"] = (E,)
    if v2:
        S["visual.merger.ln_q.bias"] = (E,)
    S["visual.merger.mlp.0.weight"], S["visual.merger.mlp.0.bias"] = (4 * E, 4 * E), (4 * E,)
    S["visual.merger.mlp.2.weight"], S["visual.merger.mlp.2.bias"] = (O, 4 * E), (O,)
    d, V = c["hidden_size"], c["vocab_size"]
    hd = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    It = c["intermediate_size"]
    S["model.embed_tokens.weight"] = (V, d)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        S[p + "input_layernorm.weight"] = S[p + "post_attention_layernorm.weight"] = (d,)
        S[p + "self_attn.q_proj.weight"], S[p + "self_attn.q_proj.bias"] = (d, d), (d,)
        for n in ("k_proj", "v_proj"):
            S[p + f"self_attn.{n}.weight"], S[p + f"self_attn.{n}.bias"] = (kv, d), (kv,)
        S[p + "self_attn.o_proj.weight"] = (d, d)
        S[p + "mlp.gate_proj.weight"] = S[p + "mlp.up_proj.weight"] = (It, d)
        S[p + "mlp.down_proj.weight"] = (d, It)
    S["model.norm.weight"] = (d,)
    if not c.get("tie_word_embeddings"):
        S["lm_head.weight"] = (V, d)
    return S


def rms(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def ln(x, w, b, eps=1e-6):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rot(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def softmax_attend(q, k, v, allowed, scale):
    # q [Lq, D], k/v [Lk, D], allowed [Lq, Lk] bool
    s = (q @ k.T) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1) @ v


def vision(W, c, pixels, grid):
    v2, v, E, O, I = dims(c)
    H = v["num_heads"]
    D = E // H
    x = pixels @ W["visual.patch_embed.proj.weight"].reshape(E, -1).T
    # per-patch metadata, decoded from the row index (spec section 2 formula)
    rows, cols, img_of, frame_of = [], [], [], []
    for i, (t, gh, gw) in enumerate(grid.tolist()):
        for r in range(t * gh * gw):
            mw = r % 2; mh = (r // 2) % 2; bw = (r // 4) % (gw // 2); bh = (r // 4 // (gw // 2)) % (gh // 2)
            tt = r // (gh * gw)
            rows.append(2 * bh + mh); cols.append(2 * bw + mw); img_of.append(i); frame_of.append(tt)
    S = len(rows)
    # rotary angles: inv_freq over head_dim/2 = 2*(D/4) angles
    q4 = D // 4
    inv = [10000.0 ** (-2.0 * k / (D // 2)) for k in range(q4)]
    ang = torch.tensor([[rows[s] * f for f in inv] + [cols[s] * f for f in inv] for s in range(S)], dtype=torch.float32)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()
    # segments: full = same image and frame; window (2.5) = same image, frame and window
    full_key = [(img_of[s], frame_of[s]) for s in range(S)]
    if not v2:
        w = v["window_size"] // 2 // 14
        win_key = [(img_of[s], frame_of[s], (rows[s] // 2) // w, (cols[s] // 2) // w) for s in range(S)]
    fk = torch.tensor([hash(k) for k in full_key])
    full_allowed = fk[:, None] == fk[None, :]
    if not v2:
        wk = torch.tensor([hash(k) for k in win_key])
        win_allowed = wk[:, None] == wk[None, :]
    for b in range(v["depth"]):
        p = f"visual.blocks.{b}."
        n1 = ln(x, W[p + "norm1.weight"], W[p + "norm1.bias"]) if v2 else rms(x, W[p + "norm1.weight"], 1e-6)
        qkv = n1 @ W[p + "attn.qkv.weight"].T + W[p + "attn.qkv.bias"]
        allowed = full_allowed if (v2 or b in v["fullatt_block_indexes"]) else win_allowed
        outs = []
        for h in range(H):
            q = rot(qkv[:, h * D:(h + 1) * D], cos, sin)
            k = rot(qkv[:, E + h * D:E + (h + 1) * D], cos, sin)
            vv = qkv[:, 2 * E + h * D:2 * E + (h + 1) * D]
            outs.append(softmax_attend(q, k, vv, allowed, 1 / math.sqrt(D)))
        x = x + torch.cat(outs, -1) @ W[p + "attn.proj.weight"].T + W[p + "attn.proj.bias"]
        n2 = ln(x, W[p + "norm2.weight"], W[p + "norm2.bias"]) if v2 else rms(x, W[p + "norm2.weight"], 1e-6)
        if v2:
            h1 = n2 @ W[p + "mlp.fc1.weight"].T + W[p + "mlp.fc1.bias"]
            x = x + (h1 * torch.sigmoid(1.702 * h1)) @ W[p + "mlp.fc2.weight"].T + W[p + "mlp.fc2.bias"]
        else:
            g = n2 @ W[p + "mlp.gate_proj.weight"].T + W[p + "mlp.gate_proj.bias"]
            u = n2 @ W[p + "mlp.up_proj.weight"].T + W[p + "mlp.up_proj.bias"]
            x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T + W[p + "mlp.down_proj.bias"]
    m = "visual.merger."
    n = ln(x, W[m + "ln_q.weight"], W[m + "ln_q.bias"]) if v2 else rms(x, W[m + "ln_q.weight"], 1e-6)
    groups = torch.stack([torch.cat([n[4 * g + j] for j in range(4)]) for g in range(S // 4)])
    h = groups @ W[m + "mlp.0.weight"].T + W[m + "mlp.0.bias"]
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    return h @ W[m + "mlp.2.weight"].T + W[m + "mlp.2.bias"]


def positions(c, ids, mask, grid):
    B, L = ids.shape
    pos = torch.ones(3, B, L, dtype=torch.int64)
    img = 0
    for b in range(B):
        nxt = 0
        j = 0
        while j < L:
            if mask[b, j] == 0:
                j += 1
                continue
            if ids[b, j] != c["image_token_id"]:
                pos[:, b, j] = nxt; nxt += 1; j += 1
                continue
            t, gh, gw = grid[img].tolist(); img += 1
            hh, ww = gh // 2, gw // 2
            tfac = 1 if c["model_type"] == "qwen2_vl" else 0
            for k in range(t * hh * ww):
                tt, r, cc = k // (hh * ww), (k // ww) % hh, k % ww
                pos[0, b, j], pos[1, b, j], pos[2, b, j] = nxt + tt * tfac, nxt + r, nxt + cc
                j += 1
            nxt += max((t - 1) * tfac, hh - 1, ww - 1) + 1
    return pos


def forward(W, c, ids, mask, pixels, grid):
    d = c["hidden_size"]; H = c["num_attention_heads"]; KV = c["num_key_value_heads"]; D = d // H
    eps = c["rms_norm_eps"]; theta = c["rope_theta"]; sec = c["rope_scaling"]["mrope_section"]
    x = W["model.embed_tokens.weight"][ids]
    feats = vision(W, c, pixels, grid)
    flat = x.reshape(-1, d).clone()
    where = (ids.reshape(-1) == c["image_token_id"]).nonzero().reshape(-1)
    assert len(where) == feats.shape[0]
    for n, i in enumerate(where.tolist()):
        flat[i] = feats[n]
    x = flat.reshape(ids.shape[0], ids.shape[1], d)
    pos = positions(c, ids, mask, grid)
    B, L = ids.shape
    stream = [0] * sec[0] + [1] * sec[1] + [2] * sec[2]
    inv = [theta ** (-2.0 * k / D) for k in range(D // 2)]
    ang = torch.zeros(B, L, D // 2)
    for b in range(B):
        for t in range(L):
            for k in range(D // 2):
                ang[b, t, k] = float(pos[stream[k], b, t]) * inv[k]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        hn = rms(x, W[p + "input_layernorm.weight"], eps)
        q = hn @ W[p + "self_attn.q_proj.weight"].T + W[p + "self_attn.q_proj.bias"]
        k = hn @ W[p + "self_attn.k_proj.weight"].T + W[p + "self_attn.k_proj.bias"]
        v = hn @ W[p + "self_attn.v_proj.weight"].T + W[p + "self_attn.v_proj.bias"]
        out = torch.zeros(B, L, d)
        for b in range(B):
            allowed = torch.zeros(L, L, dtype=torch.bool)
            for i in range(L):
                for j in range(i + 1):
                    allowed[i, j] = bool(mask[b, j]) or i == j
            for h in range(H):
                g = h // (H // KV)
                qh = rot(q[b, :, h * D:(h + 1) * D], cos[b], sin[b])
                kh = rot(k[b, :, g * D:(g + 1) * D], cos[b], sin[b])
                out[b, :, h * D:(h + 1) * D] = softmax_attend(qh, kh, v[b, :, g * D:(g + 1) * D], allowed, 1 / math.sqrt(D))
        x = x + out @ W[p + "self_attn.o_proj.weight"].T
        hn = rms(x, W[p + "post_attention_layernorm.weight"], eps)
        x = x + (torch.nn.functional.silu(hn @ W[p + "mlp.gate_proj.weight"].T) * (hn @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else W["lm_head.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_default_dtype(torch.float32)
    for name, c in CONFIGS.items():
        g = torch.Generator().manual_seed(5)
        W = {}
        for k, s in param_shapes(c).items():
            if k.endswith(".bias"):
                W[k] = 0.02 * torch.randn(s, generator=g)
            elif "norm" in k or "ln_q" in k:
                W[k] = 1 + 0.1 * torch.randn(s, generator=g)
            else:
                W[k] = 0.05 * torch.randn(s, generator=g)
        ids, mask, labels, pixels, grid = batch(c)
        with torch.no_grad():
            logits = forward(W, c, ids, mask, pixels, grid)
        lg = logits[:, :-1].reshape(-1, logits.shape[-1])
        lb = labels[:, 1:].reshape(-1)
        loss_sum = torch.nn.functional.cross_entropy(lg, lb, ignore_index=-100, reduction="sum")
        write_safetensors(os.path.join(args.out, f"{name}.weights.safetensors"), W)
        write_safetensors(os.path.join(args.out, f"{name}.io.safetensors"), {
            "input_ids": ids, "attention_mask": mask, "labels": labels, "pixel_values": pixels,
            "image_grid_thw": grid, "logits": logits, "loss_sum": loss_sum.reshape(1),
            "n_tokens": torch.tensor([int((lb != -100).sum())], dtype=torch.int64)})
        with open(os.path.join(args.out, f"{name}.config.json"), "w") as f:
            json.dump(c, f, indent=2)
        print(f"{name}: loss_sum {loss_sum.item():.6f}", file=sys.stderr)


if __name__ == "__main__":
    main()
