#!/usr/bin/env python3
"""HF `generate` references for tests/vlm/model/generation_test.cpp, produced at test time.

For each family (qwen2_vl, qwen2_5_vl) it builds a tiny random model with transformers
whose vocabulary holds the real Qwen tokenizer's ids (151,936 rows, tied head, weights
re-drawn so that logits are peaked and greedy decoding repeats itself, which is what the
repetition penalty acts on), saves it, and for each generation setting in SETTINGS writes
<family>/<setting>/generation_config.json (GenerationConfig.save_pretrained). Prompts are
rendered by Qwen2VLProcessor (the real tokenizer, Qwen2-VL's chat template, HF's image
processor on random-noise PNGs; see chat_template_reference.py), one conversation per row,
then left-padded with <|endoftext|>. For each batch in BATCHES and each setting it runs

    model.generate(input_ids, attention_mask, pixel_values, image_grid_thw,
                   mm_token_type_ids, generation_config=<the saved file>, max_new_tokens=N)

on CPU in float32 and writes <family>.<setting>.<batch>.safetensors:
    input_ids, attention_mask [B, L] int64; pixel_values [P, 1176] f32 and
    image_grid_thw [N, 3] int64 (absent for text-only batches);
    generated [B, N] int64: HF's new tokens, up to and including the first eos of the
    row, -1 after it.
and manifest.json {"transformers", "torch", "families", "settings", "batches",
"max_new_tokens", "eos_extra": {family: id}}.

The eos ids of every setting are <|im_end|>, <|endoftext|> and one more id, chosen per
family as the 4th token a dry run (greedy, penalty 1.3, no extra eos) generates for row 0
of batch "mixed", so that some rows stop early while the others go on (HF then feeds
pad_token_id to the stopped rows).

Usage: python scripts/generate_reference.py --tokenizer DIR --out DIR
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from chat_template_reference import make_processor  # noqa: E402
import hf_reference  # noqa: E402  (the weight draw)

VOCAB = 151936
IM_END, ENDOFTEXT = 151645, 151643
MAX_NEW = 12
EOS_BATCH = "mixed"  # the dry run's batch (row 0, 4th token) for the extra eos id

TEXT = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=4096, hidden_act="silu",
    rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]},
    bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT, attention_dropout=0.0,
    use_sliding_window=False, tie_word_embeddings=True,
)
FAMILIES = {
    "qwen2_vl": dict(TEXT, vision_config=dict(
        depth=2, embed_dim=64, hidden_size=64, mlp_ratio=2, num_heads=2, in_channels=3,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu")),
    "qwen2_5_vl": dict(TEXT, vision_config=dict(
        depth=3, hidden_size=64, out_hidden_size=64, intermediate_size=96, num_heads=2,
        in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        hidden_act="silu", window_size=56, fullatt_block_indexes=[1], tokens_per_second=2)),
    # Qwen3-VL: nested text_config; 16-px patches (its prompts come from Qwen3-VL's processor
    # and chat template: chat_template_reference.make_processor(..., "qwen3_vl")), DeepStack
    # from blocks 0 and 1.
    "qwen3_vl": dict(
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
        vision_end_token_id=151653, tie_word_embeddings=True,
        text_config=dict(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, rms_norm_eps=1e-6,
            max_position_embeddings=4096, hidden_act="silu", attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6],
                             "mrope_interleaved": True},
            bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT, attention_dropout=0.0),
        vision_config=dict(
            depth=2, hidden_size=64, intermediate_size=96, num_heads=2, in_channels=3, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=36,
            deepstack_visual_indexes=[0, 1], hidden_act="gelu_pytorch_tanh")),
}

# generation_config.json contents (eos_token_id and pad_token_id added per family).
SETTINGS = {
    # greedy with a strong penalty: repeats are frequent in a random model, so it acts often
    "greedy_penalty": dict(do_sample=False, repetition_penalty=1.3),
    # the layout of the Qwen2-VL-Instruct files: near-greedy sampling plus a mild penalty
    "instruct_like": dict(do_sample=True, top_k=1, top_p=0.001, temperature=0.01,
                          repetition_penalty=1.05),
    # no penalty: shows the penalty changes the tokens (the test checks they differ)
    "greedy_plain": dict(do_sample=False),
}


def T(s):
    return {"type": "text", "text": s}


def I(h, w):
    return {"type": "image", "size": [h, w]}


# One conversation per row; every row ends with the generation prompt.
BATCHES = {
    "images": [
        [{"role": "user", "content": [I(56, 84), T("Read the text.")]}],
        [{"role": "user", "content": [T("What does this say?"), I(112, 140)]},
         {"role": "assistant", "content": "hello hello"},
         {"role": "user", "content": [T("again, please")]}],
    ],
    "mixed": [
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": [T("Count to five.")]}],
        [{"role": "user", "content": [I(56, 56), T("and"), I(84, 112), T("compare them")]}],
        [{"role": "user", "content": [T("Hi")]}],
    ],
    "text": [
        [{"role": "user", "content": [T("Write the word cat three times.")]}],
        [{"role": "user", "content": [T("Tell me a long story about a dog, a cat and a bird.")]}],
    ],
}


def build(family, cfg_dict):
    """hf_reference.py's weight draw, with embeddings drawn at std 0.5 (this script's
    references were made so; hf_reference.py uses 0.25)."""
    return hf_reference.build(family, cfg_dict, embed_std=0.5)


def make_batch(proc, convs, image_dir, seed):
    """Processor output per row, left-padded into one batch."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    rows, pixels, grids = [], [], []
    for r, conv in enumerate(convs):
        msgs = []
        for m in conv:
            c = m["content"]
            if isinstance(c, list):
                items = []
                for it in c:
                    if it["type"] == "image":
                        h, w = it["size"]
                        path = os.path.join(image_dir, f"s{seed}_r{r}_{len(items)}.png")
                        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
                        items.append({"type": "image", "image": path})
                    else:
                        items.append(it)
                c = items
            msgs.append({"role": m["role"], "content": c})
        enc = proc.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                       add_generation_prompt=True, return_tensors="pt")
        rows.append((enc["input_ids"][0], enc["mm_token_type_ids"][0]))
        if "pixel_values" in enc:
            pixels.append(enc["pixel_values"])
            grids.append(enc["image_grid_thw"])
    L = max(len(ids) for ids, _ in rows)
    B = len(rows)
    input_ids = torch.full((B, L), ENDOFTEXT, dtype=torch.int64)
    mask = torch.zeros((B, L), dtype=torch.int64)
    types = torch.zeros((B, L), dtype=torch.int64)
    for i, (ids, tt) in enumerate(rows):
        input_ids[i, L - len(ids):] = ids
        mask[i, L - len(ids):] = 1
        types[i, L - len(ids):] = torch.as_tensor(tt)
    out = dict(input_ids=input_ids, attention_mask=mask, mm_token_type_ids=types)
    if pixels:
        out["pixel_values"] = torch.cat(pixels).float().contiguous()
        out["image_grid_thw"] = torch.cat(grids).to(torch.int64).contiguous()
    return out


def run_generate(model, io, gen_dir, eos=None):
    from transformers import GenerationConfig
    gc = GenerationConfig.from_pretrained(gen_dir)
    if eos is not None:
        gc.eos_token_id = eos
    kwargs = {k: v for k, v in io.items()}
    with torch.no_grad():
        seq = model.generate(**kwargs, generation_config=gc, max_new_tokens=MAX_NEW)
    new = seq[:, io["input_ids"].shape[1]:]
    eos_ids = gc.eos_token_id if isinstance(gc.eos_token_id, list) else [gc.eos_token_id]
    out = torch.full((new.shape[0], MAX_NEW), -1, dtype=torch.int64)
    for i in range(new.shape[0]):
        for j, t in enumerate(new[i].tolist()):
            out[i, j] = t
            if t in eos_ids:
                break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import transformers
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    from transformers.utils import logging
    logging.set_verbosity_error()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    image_dir = os.path.join(args.out, "images")
    os.makedirs(image_dir, exist_ok=True)
    proc = make_processor(args.tokenizer)
    batches = {name: make_batch(proc, convs, image_dir, bi) for bi, (name, convs) in enumerate(BATCHES.items())}
    proc3 = make_processor(args.tokenizer, "qwen3_vl")  # Qwen3-VL's template, patch 16, mean/std 0.5, pixels
    batches3 = {name: make_batch(proc3, convs, image_dir, bi) for bi, (name, convs) in enumerate(BATCHES.items())}
    eos_extra = {}
    for fi, (family, cfg_dict) in enumerate(FAMILIES.items()):
        fam_batches = batches3 if family.startswith("qwen3") else batches
        torch.manual_seed(3000 + fi)
        model = build(family, cfg_dict)
        fam_dir = os.path.join(args.out, family)
        model.save_pretrained(fam_dir)
        # Dry run: the extra eos id.
        dry_dir = os.path.join(fam_dir, "dry")
        GenerationConfig(do_sample=False, repetition_penalty=1.3, pad_token_id=ENDOFTEXT,
                         eos_token_id=[IM_END, ENDOFTEXT]).save_pretrained(dry_dir)
        extra = int(run_generate(model, fam_batches[EOS_BATCH], dry_dir)[0, 3])
        eos_extra[family] = extra
        for sname, s in SETTINGS.items():
            sdir = os.path.join(fam_dir, sname)
            GenerationConfig(**s, pad_token_id=ENDOFTEXT, bos_token_id=ENDOFTEXT,
                             eos_token_id=[IM_END, ENDOFTEXT, extra]).save_pretrained(sdir)
            for bname, io in fam_batches.items():
                gen = run_generate(model, io, sdir)
                res = {k: v for k, v in io.items() if k != "mm_token_type_ids"}
                res["generated"] = gen
                save_file({k: v.contiguous() for k, v in res.items()},
                          os.path.join(args.out, f"{family}.{sname}.{bname}.safetensors"))
                print(f"{family}.{sname}.{bname}: {gen.tolist()}", file=sys.stderr)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                   "families": list(FAMILIES), "settings": list(SETTINGS),
                   "batches": list(BATCHES), "max_new_tokens": MAX_NEW, "eos_extra": eos_extra}, f)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
