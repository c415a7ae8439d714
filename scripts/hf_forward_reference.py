#!/usr/bin/env python3
"""transformers' forward of an HF model directory on one batch, for tests that check what
`vlmtrain export` writes (tests/app/cli/export_qwen3_test.cpp).

  python scripts/hf_forward_reference.py --model DIR --io IO --out OUT

DIR: an HF directory; the model class is the one its config.json's `architectures` names
(Qwen2VL / Qwen2_5_VL / Qwen3VL ForConditionalGeneration), loaded with from_pretrained in
fp32 with eager attention (so the files, their tensor names and config.json must be what
transformers reads, or it fails). IO: a safetensors file with input_ids, attention_mask,
labels, pixel_values, image_grid_thw. OUT: logits [B, L, V] f32, loss_sum [1] (summed
shifted cross-entropy), n_tokens [1]; HF computes its own M-RoPE position ids
(hf_reference.run_batch). Prints {"class", "params", "missing", "unexpected"} as its last line.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as H  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--io", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers
    from safetensors.torch import load_file, save_file
    torch.set_num_threads(1)
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        arch = json.load(f)["architectures"][0]
    model, info = getattr(transformers, arch).from_pretrained(
        args.model, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"]:
        sys.exit(f"hf_forward_reference: {args.model}: transformers did not load every tensor: "
                 f"missing {sorted(info['missing_keys'])}, unexpected {sorted(info['unexpected_keys'])}")
    model.eval()
    io = load_file(args.io)
    keys = ["input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw"]
    res, _ = H.run_batch(model, {k: io[k] for k in keys if k in io}, torch.float32)
    save_file({k: res[k].contiguous() for k in ("logits", "loss_sum", "n_tokens")}, args.out)
    print(json.dumps({"class": arch, "params": sum(p.numel() for p in model.parameters()),
                      "missing": len(info["missing_keys"]), "unexpected": len(info["unexpected_keys"])}))


if __name__ == "__main__":
    main()
