#!/usr/bin/env python3
"""How transformers loads a tied Qwen2-VL checkpoint that also (or only) holds
lm_head.weight, for tests/vlm/io/hf_checkpoint_test.cpp.

It builds a tiny random Qwen2-VL with tie_word_embeddings=true, saves it, and writes three
variants of its directory, each with the same config.json:
  head_equal/    model.safetensors + lm_head.weight equal to model.embed_tokens.weight
  head_differs/  + lm_head.weight with other (random) values
  head_only/     lm_head.weight instead of model.embed_tokens.weight
Each is loaded back with Qwen2VLForConditionalGeneration.from_pretrained (fp32, eager) and
run on one fixed text-only batch; written to --out:
  <variant>/...                         the model directory
  <variant>.logits.safetensors          input_ids [1, L] int64, logits [1, L, V] f32,
                                        tied [1] int64 (1 when HF's lm_head.weight and
                                        embed_tokens.weight are the same tensor after loading)

Usage: python scripts/tied_head_reference.py --out DIR
"""
import argparse
import json
import os
import shutil
import sys

import torch

CFG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=512, hidden_act="silu",
    rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
    image_token_id=250, video_token_id=251, vision_start_token_id=248, vision_end_token_id=249,
    bos_token_id=0, eos_token_id=1, pad_token_id=3, tie_word_embeddings=True,
    vision_config=dict(depth=1, embed_dim=64, hidden_size=64, mlp_ratio=2, num_heads=2,
                       in_channels=3, patch_size=14, spatial_merge_size=2,
                       temporal_patch_size=2, hidden_act="quick_gelu"),
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.manual_seed(5)
    model = Qwen2VLForConditionalGeneration._from_config(Qwen2VLConfig(**CFG), dtype=torch.float32)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.normal_(0.0, 0.3)
    base = os.path.join(args.out, "base")
    model.save_pretrained(base)
    tensors = load_file(os.path.join(base, "model.safetensors"))
    embed_key = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    assert "lm_head.weight" not in tensors, "a tied save_pretrained writes no lm_head.weight"
    variants = {
        "head_equal": dict(tensors, **{"lm_head.weight": tensors[embed_key].clone()}),
        "head_differs": dict(tensors, **{"lm_head.weight": torch.randn_like(tensors[embed_key])}),
        "head_only": {("lm_head.weight" if k == embed_key else k): v for k, v in tensors.items()},
    }
    ids = torch.tensor([[5, 17, 42, 99, 7, 7, 120, 33]], dtype=torch.int64)
    for name, t in variants.items():
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(base, "config.json"), d)
        save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
        m = Qwen2VLForConditionalGeneration.from_pretrained(d, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
        with torch.no_grad():
            logits = m(input_ids=ids).logits.float()
        tied = m.lm_head.weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
        save_file({"input_ids": ids, "logits": logits.contiguous(),
                   "tied": torch.tensor([int(tied)])},
                  os.path.join(args.out, f"{name}.logits.safetensors"))
        print(f"{name}: tied after load = {tied}", file=sys.stderr)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
