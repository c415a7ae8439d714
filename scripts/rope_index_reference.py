#!/usr/bin/env python3
"""HF's M-RoPE position ids (Qwen2VLModel / Qwen2_5_VLModel.get_rope_index of the pinned
transformers) for tests/vlm/model/rope_index_test.cpp.

    .venv/bin/python scripts/rope_index_reference.py --cases cases.json --out out.jsonl

--cases  a JSON list of {"family": "qwen2_vl" | "qwen2_5_vl" | "qwen3_vl", "input_ids": [[...]],
         "attention_mask": [[...]], "image_grid_thw": [[t, h, w], ...]} (ids use the
         default special ids: <|image_pad|> 151655, <|vision_start|> 151652).
--out    one JSON object per case: {"position_ids": [3][B][L], "rope_deltas": [B]}.

mm_token_type_ids is built as the processor builds it (1 where input_ids is the image
token), which is what HF's get_rope_index groups into images. The model is a tiny random
one: get_rope_index reads only config.vision_config.spatial_merge_size (2).
"""
import argparse
import json
import sys

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        import transformers
        from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLModel, Qwen2VLConfig, Qwen2VLModel,
                                  Qwen3VLConfig, Qwen3VLModel)
    except ImportError as e:
        sys.exit(f"rope_index_reference: cannot import transformers with {sys.executable} ({e})")
    text = dict(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    models = {
        "qwen2_vl": Qwen2VLModel(Qwen2VLConfig(**text, vision_config=dict(
            depth=1, embed_dim=32, hidden_size=32, num_heads=2))),
        "qwen2_5_vl": Qwen2_5_VLModel(Qwen2_5_VLConfig(**text, vision_config=dict(
            depth=1, hidden_size=32, out_hidden_size=32, intermediate_size=32, num_heads=2,
            fullatt_block_indexes=[0]))),
        "qwen3_vl": Qwen3VLModel(Qwen3VLConfig(
            text_config=dict(vocab_size=256, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                               out_hidden_size=32, num_position_embeddings=16,
                               deepstack_visual_indexes=[]))),
    }
    with open(args.cases) as f:
        cases = json.load(f)
    with open(args.out, "w") as f:
        for c in cases:
            m = models[c["family"]]
            ids = torch.tensor(c["input_ids"], dtype=torch.int64)
            mask = torch.tensor(c["attention_mask"], dtype=torch.int64)
            grid = torch.tensor(c["image_grid_thw"], dtype=torch.int64).view(-1, 3)
            types = (ids == m.config.image_token_id).to(torch.int32)
            pos, deltas = m.get_rope_index(ids, mm_token_type_ids=types,
                                           image_grid_thw=grid if len(grid) else None,
                                           attention_mask=mask)
            f.write(json.dumps({"position_ids": pos.tolist(), "rope_deltas": deltas.view(-1).tolist()}) + "\n")
    print(f"rope_index_reference: transformers {transformers.__version__}, {len(cases)} cases")


if __name__ == "__main__":
    main()
