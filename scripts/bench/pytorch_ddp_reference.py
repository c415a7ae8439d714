#!/usr/bin/env python3
"""PyTorch DDP reference for bench/step_bench: the same Qwen2-VL-shaped model (plain
PyTorch modules, no transformers), the same fixed synthetic batch shapes, the same
optimizer work (AdamW, global grad-norm clip), wrapped in torch.nn.parallel's
DistributedDataParallel over Gloo. Timed per step; rank 0 prints one JSON line.

    .venv/bin/python scripts/bench/pytorch_ddp_reference.py --preset small --world 2 --threads 1

Runs with the project's environment (.venv/: torch 2.11, the LibTorch vlmtrain links). The model mirrors vlm/ module for
module (vision: linear patch embed, 2D rotary, LayerNorm blocks with quick_gelu MLP,
attention within each image; merger LN + 2-layer MLP; LLM: RMSNorm, GQA attention with
M-RoPE and a causal mask, SwiGLU MLP, tied head, summed cross entropy over answer
tokens), using the same attention call as vlm/model/attention.cpp (SDPA, GQA without repeated
K/V, a bool mask). The
parameter count is printed so the driver can check it against step_bench's.

Batch per rank (as step_bench): B samples of [T/2 prompt] <vs> [K image tokens] <ve>
[T - T/2 answer], one image of grid (1, 2, 2K) patches each.
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# Mirrors vlm/model/config.cpp presets (qwen2_vl family).
PRESETS = {
    "tiny": dict(v_depth=4, v_embed=128, v_heads=4, v_inter=512, v_out=256,
                 vocab=2048, hidden=256, inter=768, layers=4, heads=4, kv_heads=2,
                 mrope=(2, 2, 28), theta=100.0, image_token=2046, vs=2044, ve=2045, bos=2041),
    "small": dict(v_depth=6, v_embed=384, v_heads=6, v_inter=1536, v_out=512,
                  vocab=8192, hidden=512, inter=1408, layers=8, heads=8, kv_heads=2,
                  mrope=(2, 2, 28), theta=100.0, image_token=8190, vs=8188, ve=8189, bos=8185),
}
PATCH_DIM = 3 * 2 * 14 * 14


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def attention(q, k, v, mask):
    # q [N, H, L, D], k/v [N, Hkv, L, D]; mask bool, True = attend.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(q.shape[-1]),
                                          enable_gqa=k.shape[1] != q.shape[1])


class VisionBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        e = c["v_embed"]
        self.h = c["v_heads"]
        self.norm1, self.norm2 = nn.LayerNorm(e, eps=1e-6), nn.LayerNorm(e, eps=1e-6)
        self.qkv, self.proj = nn.Linear(e, 3 * e), nn.Linear(e, e)
        self.fc1, self.fc2 = nn.Linear(e, c["v_inter"]), nn.Linear(c["v_inter"], e)

    def forward(self, x, cos, sin, n_img):
        s, e = x.shape
        d = e // self.h
        q, k, v = self.qkv(self.norm1(x)).reshape(s, 3, self.h, d).unbind(1)
        cs, sn = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cs + rotate_half(q) * sn
        k = k * cs + rotate_half(k) * sn
        per = s // n_img  # equal-size images: batched attention per image

        def take(t):
            return t.reshape(n_img, per, self.h, d).transpose(1, 2)

        o = attention(take(q), take(k), take(v), None).transpose(1, 2).reshape(s, e)
        x = x + self.proj(o)
        h = self.fc1(self.norm2(x))
        return x + self.fc2(h * torch.sigmoid(1.702 * h))


class Vision(nn.Module):
    def __init__(self, c):
        super().__init__()
        e = c["v_embed"]
        self.c = c
        self.patch_embed = nn.Linear(PATCH_DIM, e, bias=False)
        self.blocks = nn.ModuleList(VisionBlock(c) for _ in range(c["v_depth"]))
        self.ln_q = nn.LayerNorm(e, eps=1e-6)
        self.mlp0, self.mlp2 = nn.Linear(4 * e, 4 * e), nn.Linear(4 * e, c["v_out"])
        hd = e // c["v_heads"]
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, hd // 2, 2).float() / (hd // 2)),
                             persistent=False)

    def rotary(self, gh, gw, n_img):
        # 2D positions in merge-block order (2x2 blocks), as the HF vision rotary.
        hp = torch.arange(gh).unsqueeze(1).expand(gh, gw).reshape(gh // 2, 2, gw // 2, 2).permute(0, 2, 1, 3).flatten()
        wp = torch.arange(gw).unsqueeze(0).expand(gh, gw).reshape(gh // 2, 2, gw // 2, 2).permute(0, 2, 1, 3).flatten()
        f = torch.cat([hp[:, None] * self.inv_freq, wp[:, None] * self.inv_freq], -1).repeat(n_img, 1)
        emb = torch.cat([f, f], -1)
        return emb.cos(), emb.sin()

    def forward(self, pixels, gh, gw, n_img):
        x = self.patch_embed(pixels)
        cos, sin = self.rotary(gh, gw, n_img)
        for b in self.blocks:
            x = b(x, cos, sin, n_img)
        x = self.ln_q(x).reshape(-1, 4 * x.shape[-1])
        return self.mlp2(F.gelu(self.mlp0(x)))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h, self.hkv = c["hidden"], c["heads"], c["kv_heads"]
        hd = d // self.h
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, self.hkv * hd)
        self.v_proj, self.o_proj = nn.Linear(d, self.hkv * hd), nn.Linear(d, d, bias=False)
        self.gate_proj = nn.Linear(d, c["inter"], bias=False)
        self.up_proj = nn.Linear(d, c["inter"], bias=False)
        self.down_proj = nn.Linear(c["inter"], d, bias=False)

    def forward(self, x, cos, sin, mask):
        b, l, d = x.shape
        hd = d // self.h
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, l, self.h, hd).transpose(1, 2)
        k = self.k_proj(y).view(b, l, self.hkv, hd).transpose(1, 2)
        v = self.v_proj(y).view(b, l, self.hkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        x = x + self.o_proj(attention(q, k, v, mask).transpose(1, 2).reshape(b, l, d))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.visual = Vision(c)
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        hd = c["hidden"] // c["heads"]
        self.register_buffer("inv_freq", 1.0 / c["theta"] ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

    def mrope(self, pos):
        # pos [3, B, L] -> cos/sin [B, 1, L, hd] with the M-RoPE sections (t, h, w).
        f = pos[..., None].float() * self.inv_freq  # [3, B, L, hd/2]
        parts, start = [], 0
        for i, n in enumerate(self.c["mrope"]):
            parts.append(f[i, ..., start:start + n])
            start += n
        f = torch.cat(parts, -1)
        emb = torch.cat([f, f], -1).unsqueeze(1)
        return emb.cos(), emb.sin()

    def forward(self, ids, labels, pos, pixels, gh, gw):
        b, l = ids.shape
        x = self.embed_tokens(ids)
        img = self.visual(pixels, gh, gw, b)
        x = x.masked_scatter((ids == self.c["image_token"]).unsqueeze(-1), img.to(x.dtype))
        cos, sin = self.mrope(pos)
        mask = torch.ones(l, l, dtype=torch.bool).tril()
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = F.linear(self.norm(x), self.embed_tokens.weight).float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100, reduction="sum")


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def make_batch(c, a, rank):
    g = torch.Generator().manual_seed(1234 + rank)
    b, k, t = a.samples, a.image_tokens, a.text
    p, l = t // 2, t + k + 2
    ids = torch.randint(10, c["bos"] - 1, (b, l), generator=g)
    ids[:, p] = c["vs"]
    ids[:, p + 1:p + 1 + k] = c["image_token"]
    ids[:, p + 1 + k] = c["ve"]
    labels = torch.full((b, l), -100, dtype=torch.long)
    labels[:, p + k + 2:] = ids[:, p + k + 2:]
    # M-RoPE ids: text counts up, the image's tokens share t and take (h, w) of the
    # merged grid (1 x K), text after the image resumes at max + 1.
    pos = torch.arange(l).repeat(3, b, 1)
    img = torch.arange(k)
    pos[0, :, p + 1:p + 1 + k] = p + 1
    pos[1, :, p + 1:p + 1 + k] = p + 1
    pos[2, :, p + 1:p + 1 + k] = p + 1 + img
    after = torch.arange(l - (p + 1 + k)) + p + 1 + k
    pos[:, :, p + 1 + k:] = after
    pixels = torch.randn(b * 4 * k, PATCH_DIM, generator=g)
    return ids, labels, pos, pixels, 2, 2 * k


def run_rank(a):
    torch.set_num_threads(a.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    c = PRESETS[a.preset]
    torch.manual_seed(7)
    model = Model(c)
    for p in model.parameters():  # HF-like init, as vlm::materialize
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4)
    ids, labels, pos, pixels, gh, gw = make_batch(c, a, rank)
    local_sup = torch.tensor([float((labels[:, 1:] != -100).sum())])
    times, cpu = [], []
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        sup = local_sup.clone()
        dist.all_reduce(sup)
        # DDP averages gradients over ranks: scale by N / global tokens so the update
        # equals the sum over ranks / global tokens (as vlmtrain's reduction).
        loss = ddp(ids, labels, pos, pixels, gh, gw) * (world / sup.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    tc = torch.tensor(cpu, dtype=torch.float64)  # summed over ranks
    dist.all_reduce(tc)
    med = median(tt.tolist())
    if rank == 0:
        l = a.text + a.image_tokens + 2
        print(json.dumps({"impl": "pytorch-ddp", "torch": torch.__version__, "preset": a.preset, "world": world,
                          "threads_per_rank": torch.get_num_threads(), "params": n_params,
                          "samples_per_rank": a.samples, "seq_len": l, "steps": a.steps, "warmup": a.warmup,
                          "step_s": med, "step_s_all": tt.tolist(),
                          "cpu_s_per_rank": median(tc.tolist()) / world,
                          "tokens_per_s": world * a.samples * l / med, "images_per_s": world * a.samples / med}),
              flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--text", type=int, default=96)
    ap.add_argument("--image-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    if "RANK" in os.environ:
        return run_rank(a)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(a.threads))
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env,
                                      stdout=None if r == 0 else subprocess.DEVNULL))
    rcs = [p.wait() for p in procs]
    return max(rcs)


if __name__ == "__main__":
    sys.exit(main())
