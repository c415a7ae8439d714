#!/usr/bin/env python3
"""How transformers resolves Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 (and their MoE) config.json files, for
tests/vlm/model/config_test.cpp, config_qwen3_test.cpp and config_qwen35_test.cpp: every file is loaded with AutoConfig.from_pretrained (as
from_pretrained of the model would) and the values the model is built from are written
under vlmtrain's field names (vlm/model/config.h).

    .venv/bin/python scripts/config_reference.py --configs configs.json --out resolved.jsonl

--configs  a JSON list of config.json objects.
--count-params  also build each model on the meta device with the class its
           `architectures` names and write "params": the number of distinct parameters
           (tied weights once), as `sum(p.numel() for p in model.parameters())`.
--out      one JSON object per config, in order: {"ok": true, "family", "vision": {...},
           "text": {...}, "tie_word_embeddings", "image_token_id", "video_token_id",
           "vision_start_token_id", "vision_end_token_id", "bos_token_id", "eos_token_id"}
           or {"ok": false, "error": "..."} when transformers refuses the file.

Where the value comes from (transformers 5.23):
  text       config.text_config (the decoder reads it); rope_theta and mrope_section from
             its rope_parameters (mrope_section absent: [16, 24, 24], Qwen3-VL [24, 20, 20],
             Qwen3.5 [11, 11, 10], as the rotary embeddings default it); eos_token_id: the
             first when a list. Qwen3.5 adds layer_types, the linear-attention geometry and
             partial_rotary_factor (rope_parameters); the MoE families add the expert keys.
  vision     config.vision_config; Qwen2-VL's MLP width is int(embed_dim * mlp_ratio), as
             the vision block computes it.
  tie        config.tie_word_embeddings (what PreTrainedModel's tied-weights mapping reads).
"""
import argparse
import json
import os
import sys
import tempfile


def resolve(cfg):
    t, v = cfg.text_config, cfg.vision_config
    rope = t.rope_parameters or {}
    fam = cfg.model_type
    # The MoE families resolve as their dense siblings, plus the expert keys below.
    base = {"qwen3_vl_moe": "qwen3_vl", "qwen3_5_moe": "qwen3_5"}.get(fam, fam)
    vision = dict(depth=v.depth, num_heads=v.num_heads, patch_size=v.patch_size,
                  temporal_patch_size=v.temporal_patch_size, spatial_merge_size=v.spatial_merge_size,
                  in_chans=v.in_channels, hidden_act=v.hidden_act)
    if fam == "qwen2_vl":
        vision.update(embed_dim=v.embed_dim, out_hidden_size=v.hidden_size,
                      intermediate_size=int(v.embed_dim * v.mlp_ratio))
    elif base in ("qwen3_vl", "qwen3_5"):
        vision.update(embed_dim=v.hidden_size, out_hidden_size=v.out_hidden_size,
                      intermediate_size=v.intermediate_size,
                      num_position_embeddings=v.num_position_embeddings,
                      deepstack_visual_indexes=list(getattr(v, "deepstack_visual_indexes", [])),
                      rope_theta=float(v.rope_parameters["rope_theta"]))
    else:
        vision.update(embed_dim=v.hidden_size, out_hidden_size=v.out_hidden_size,
                      intermediate_size=v.intermediate_size, window_size=v.window_size,
                      fullatt_block_indexes=list(v.fullatt_block_indexes),
                      tokens_per_second=float(v.tokens_per_second))
    eos = getattr(t, "eos_token_id", None)  # Qwen3VLTextConfig has no default for it
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    default_section = {"qwen3_vl": [24, 20, 20], "qwen3_5": [11, 11, 10]}.get(base, [16, 24, 24])
    text = dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                intermediate_size=getattr(t, "intermediate_size", 0), num_hidden_layers=t.num_hidden_layers,
                num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
                rms_norm_eps=float(t.rms_norm_eps), rope_theta=float(rope["rope_theta"]),
                mrope_section=list(rope.get("mrope_section", default_section)),
                max_position_embeddings=t.max_position_embeddings, hidden_act=t.hidden_act)
    if base in ("qwen3_vl", "qwen3_5"):
        text.update(head_dim=t.head_dim, attention_bias=bool(t.attention_bias))
    if fam != base:  # Qwen3-VL-MoE, Qwen3.5-MoE
        text.update(num_experts=t.num_experts, num_experts_per_tok=t.num_experts_per_tok,
                    moe_intermediate_size=t.moe_intermediate_size,
                    shared_expert_intermediate_size=getattr(t, "shared_expert_intermediate_size", 0),
                    decoder_sparse_step=getattr(t, "decoder_sparse_step", 1),
                    mlp_only_layers=list(getattr(t, "mlp_only_layers", None) or []),
                    router_aux_loss_coef=float(t.router_aux_loss_coef),
                    output_router_logits=bool(t.output_router_logits))
    if base == "qwen3_5":
        text.update(layer_types=list(t.layer_types), linear_num_key_heads=t.linear_num_key_heads,
                    linear_num_value_heads=t.linear_num_value_heads, linear_key_head_dim=t.linear_key_head_dim,
                    linear_value_head_dim=t.linear_value_head_dim, linear_conv_kernel_dim=t.linear_conv_kernel_dim,
                    partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)))
    return dict(ok=True, family=fam, vision=vision, text=text,
                tie_word_embeddings=bool(cfg.tie_word_embeddings),
                image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
                vision_start_token_id=cfg.vision_start_token_id,
                vision_end_token_id=cfg.vision_end_token_id,
                bos_token_id=getattr(t, "bos_token_id", None), eos_token_id=eos)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count-params", action="store_true")
    args = ap.parse_args()
    try:
        import transformers
        from transformers import AutoConfig
        from transformers.utils import logging
    except ImportError as e:
        sys.exit(f"config_reference: cannot import transformers with {sys.executable} ({e}); "
                 f"run scripts/install-deps.sh (scripts/requirements.txt)")
    logging.set_verbosity_error()
    with open(args.configs, encoding="utf-8") as f:
        configs = json.load(f)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(configs):
            d = os.path.join(tmp, str(i))
            os.makedirs(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(c, f)
            try:
                cfg = AutoConfig.from_pretrained(d)
                row = resolve(cfg)
                if args.count_params:
                    import torch
                    model_class = getattr(transformers, c["architectures"][0])
                    with torch.device("meta"):
                        model = model_class(cfg)
                    row["params"] = sum(p.numel() for p in model.parameters())
                rows.append(row)
            except Exception as e:  # noqa: BLE001  (reported to the test, which decides)
                rows.append(dict(ok=False, error=f"{type(e).__name__}: {e}"))
    with open(args.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"config_reference: transformers {transformers.__version__}, {len(rows)} configs "
          f"({sum(not r['ok'] for r in rows)} refused)")


if __name__ == "__main__":
    main()
