#!/usr/bin/env python3
"""Writes HF-reference goldens for tests/vlm/hf_parity_test.cpp.

Runs where PyTorch and transformers are installed (CPU fp32 is enough; e.g. the lent GPU
machine). For each family it builds a small random Qwen2-VL / Qwen2.5-VL from a config
dict with transformers, randomises norms and biases (so that ones/zeros cannot hide a bug),
runs one left-padded batch of two prompts with two images through the reference
(eager attention, fp32), and writes under tests/golden/:

  <name>.config.json          the HF config (vlmtrain parses it with parse_hf_config)
  <name>.weights.safetensors  the weights under the legacy HF names (visual.*, model.*, lm_head.weight)
  <name>.io.safetensors       input_ids, attention_mask, pixel_values, image_grid_thw, labels,
                              logits [B, L, V] fp32, loss_sum (sum of shifted token CE), n_tokens

Usage: python3 scripts/make_goldens.py [--out tests/golden]
Writes its own safetensors (no `safetensors` package needed). About 1-2 MB per family.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
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


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def legacy_name(name):
    # Newer transformers nest the towers: model.visual.* / model.language_model.*
    if name.startswith("model.visual."):
        return name[len("model."):]
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def build(cfg_dict):
    import transformers
    if cfg_dict["model_type"] == "qwen2_vl":
        from transformers import Qwen2VLConfig as C, Qwen2VLForConditionalGeneration as M
    else:
        from transformers import Qwen2_5_VLConfig as C, Qwen2_5_VLForConditionalGeneration as M
    cfg = C(**cfg_dict)
    for c in (cfg, getattr(cfg, "vision_config", None), getattr(cfg, "text_config", None)):
        if c is not None:
            c._attn_implementation = "eager"
    model = M(cfg).to(torch.float32).eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", file=sys.stderr)
    return model


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "golden"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, cfg_dict in CONFIGS.items():
        torch.manual_seed(0)
        model = build(cfg_dict)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(".bias"):
                    p.normal_(0.0, 0.02)
                elif "norm" in n or "ln_q" in n:
                    p.add_(0.1 * torch.randn_like(p))
        ids, mask, labels, pixels, grid = batch(cfg_dict)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid)
        logits = out.logits.float()
        lg = logits[:, :-1].reshape(-1, logits.shape[-1])
        lb = labels[:, 1:].reshape(-1)
        loss_sum = torch.nn.functional.cross_entropy(lg, lb, ignore_index=-100, reduction="sum")
        n_tokens = int((lb != -100).sum())
        weights = {}
        for n, t in model.state_dict().items():
            weights[legacy_name(n)] = t.float()
        if cfg_dict.get("tie_word_embeddings"):
            weights.pop("lm_head.weight", None)
        write_safetensors(os.path.join(args.out, f"{name}.weights.safetensors"), weights)
        write_safetensors(os.path.join(args.out, f"{name}.io.safetensors"), {
            "input_ids": ids, "attention_mask": mask, "labels": labels, "pixel_values": pixels,
            "image_grid_thw": grid, "logits": logits, "loss_sum": loss_sum.reshape(1),
            "n_tokens": torch.tensor([n_tokens], dtype=torch.int64)})
        with open(os.path.join(args.out, f"{name}.config.json"), "w") as f:
            json.dump(cfg_dict, f, indent=2)
        print(f"{name}: loss_sum {loss_sum.item():.6f} over {n_tokens} tokens, "
              f"logits {tuple(logits.shape)}", file=sys.stderr)


if __name__ == "__main__":
    main()
