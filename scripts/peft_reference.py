#!/usr/bin/env python3
"""PEFT LoRA references for tests/vlm/io/lora_peft_test.cpp, produced at test time.

make --out DIR
  Builds a tiny random qwen2_vl with hf_reference.build, saves it, and for each variant in
  VARIANTS applies peft.get_peft_model (init_lora_weights=False, so lora_B is random and
  non-zero) to the text decoder's q/k/v/o of every layer and the vision tower's qkv, saves
  the adapter, and runs each batch of BATCHES (hf_reference batch helpers, fp32, eager
  attention, eval mode) forward and back. Written under DIR:
    base/config.json, base/model.safetensors     the base model (save_pretrained, fp32)
    <variant>/adapter_config.json, <variant>/adapter_model.safetensors   (save_pretrained)
    rslora_legacy/   the rslora adapter with transformers 4's module names
                     (base_model.model.model.layers.N..., base_model.model.visual...)
    <variant>.<batch>.io.safetensors
        input_ids, attention_mask, labels [B, L] int64; pixel_values [P, 1176] f32;
        image_grid_thw [N, 3] int64; logits [B, L, V] f32; loss_sum [1] f32 (summed shifted
        cross-entropy); n_tokens [1] int64
    <variant>.<batch>.grads.safetensors
        d loss_sum / d every adapter weight, named as in adapter_model.safetensors
    manifest.json   {"transformers", "peft", "torch", "variants", "batches",
                     "modules": {variant: {nested module: {"r", "alpha", "scaling"}}}}

load --base DIR --adapter DIR --io FILE --out FILE
  Loads the base (the class its config.json's architectures names) with from_pretrained and the adapter with PeftModel.from_pretrained
  (is_trainable, so gradients flow; eval mode), checks that every tensor of the adapter file
  was loaded unchanged (and nothing else is an adapter), runs the batch of FILE (an io file
  from `make`) forward and back, and writes logits, loss_sum, n_tokens and the adapter
  gradients (file names) to FILE. Prints, as its last line, {"modules": {module: {"r",
  "alpha", "scaling"}}} as PEFT resolved them.

Usage: python scripts/peft_reference.py make --out DIR   (needs torch, transformers, peft, safetensors)
"""
import argparse
import copy
import json
import os
import sys

import torch

import hf_reference as H

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "attn.qkv"]
# Qwen3.5 (base_qwen3_5, variant qwen3_5_plain): the Gated DeltaNet projections too.
Q35_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "out_proj", "attn.qkv"]
# Variant -> LoraConfig arguments. rslora: one module with its own rank and alpha (a suffix
# key), the vision tower's first block with its own alpha (a regex key), dropout (identity
# in eval mode, but read from the config).
VARIANTS = {
    "plain": dict(r=4, lora_alpha=8),
    "rslora": dict(r=4, lora_alpha=6, use_rslora=True, lora_dropout=0.1,
                   rank_pattern={"layers.1.self_attn.v_proj": 6},
                   alpha_pattern={"layers.1.self_attn.v_proj": 3, r"visual\.blocks\.0\.attn\.qk.": 5}),
}
BATCHES = ["images_left", "multi_image_right"]
FAMILY = "qwen2_vl"
IO_KEYS = ["input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw"]


def lora_modules(model):
    """{nested module name: {"r", "alpha", "scaling"}} for every LoRA layer of a PEFT model."""
    from peft.tuners.lora import LoraLayer
    out = {}
    for name, m in model.base_model.model.named_modules():
        if isinstance(m, LoraLayer) and "default" in m.r:
            out[name] = {"r": m.r["default"], "alpha": m.lora_alpha["default"], "scaling": m.scaling["default"]}
    return out


def run(peft_model, io):
    """Forward and back on the HF model inside `peft_model`; logits, loss and adapter grads
    (named as in the adapter file)."""
    from peft import get_peft_model_state_dict
    hf = peft_model.base_model.model
    res, grads = H.run_batch(hf, {k: io[k] for k in IO_KEYS if k in io}, torch.float32)
    named = {"base_model.model." + n: g for n, g in grads.items()}  # modules_to_save need theirs too
    adapter_grads = {k: g for k, g in get_peft_model_state_dict(peft_model, state_dict=named).items()
                     if ".lora_" in k}
    params = {k for k in get_peft_model_state_dict(peft_model) if ".lora_" in k}  # not modules_to_save
    assert set(adapter_grads) == params, (sorted(adapter_grads), sorted(params))
    for k, g in adapter_grads.items():
        assert g.abs().max() > 0, f"adapter gradient {k} is zero: the batch does not reach it"
    keep = ["logits", "loss_sum", "n_tokens"]
    return {k: res[k] for k in keep}, {k: g.contiguous() for k, g in adapter_grads.items()}


def legacy_name(n):
    return (n.replace("base_model.model.model.language_model.", "base_model.model.model.")
             .replace("base_model.model.model.visual.", "base_model.model.visual."))


def cmd_make(args):
    import peft
    import transformers
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(2024)
    base = H.build(FAMILY, H.FAMILIES[FAMILY])
    base.save_pretrained(os.path.join(args.out, "base"))
    manifest = {"transformers": transformers.__version__, "peft": peft.__version__, "torch": torch.__version__,
                "variants": list(VARIANTS), "batches": BATCHES, "modules": {}}
    for vi, (variant, kw) in enumerate(VARIANTS.items()):
        torch.manual_seed(3000 + vi)
        cfg = LoraConfig(target_modules=TARGETS, init_lora_weights=False, **kw)
        pm = get_peft_model(copy.deepcopy(base), cfg)
        pm.eval()
        adir = os.path.join(args.out, variant)
        pm.save_pretrained(adir)
        manifest["modules"][variant] = lora_modules(pm)
        for bi, bname in enumerate(BATCHES):
            gen = torch.Generator().manual_seed(500 + bi)
            io = H.make_batch(H.BATCHES[bname], gen)
            res, grads = run(pm, io)
            stem = os.path.join(args.out, f"{variant}.{bname}")
            save_file({**io, **res}, stem + ".io.safetensors")
            save_file(grads, stem + ".grads.safetensors")
            print(f"{variant}.{bname}: loss_sum {res['loss_sum'].item():.6f}, {len(grads)} adapter gradients",
                  file=sys.stderr)
    # Qwen3.5: a second base (its own directory), an adapter on the full layers' attention and
    # the Gated DeltaNet projections, 16-px patches.
    torch.manual_seed(2025)
    q35 = H.build("qwen3_5", H.FAMILIES["qwen3_5"])
    q35.save_pretrained(os.path.join(args.out, "base_qwen3_5"))
    torch.manual_seed(3100)
    pm = get_peft_model(copy.deepcopy(q35), LoraConfig(target_modules=Q35_TARGETS, init_lora_weights=False,
                                                      r=4, lora_alpha=8))
    pm.eval()
    pm.save_pretrained(os.path.join(args.out, "qwen3_5_plain"))
    manifest["variants"].append("qwen3_5_plain")
    manifest["modules"]["qwen3_5_plain"] = lora_modules(pm)
    for bi, bname in enumerate(BATCHES):
        gen = torch.Generator().manual_seed(600 + bi)
        io = H.make_batch(H.BATCHES[bname], gen, patch=16)
        res, grads = run(pm, io)
        stem = os.path.join(args.out, f"qwen3_5_plain.{bname}")
        save_file({**io, **res}, stem + ".io.safetensors")
        save_file(grads, stem + ".grads.safetensors")
        print(f"qwen3_5_plain.{bname}: loss_sum {res['loss_sum'].item():.6f}, {len(grads)} adapter gradients",
              file=sys.stderr)
    # The rslora adapter as transformers 4 named its modules.
    legacy = os.path.join(args.out, "rslora_legacy")
    os.makedirs(legacy, exist_ok=True)
    tensors = load_file(os.path.join(args.out, "rslora", "adapter_model.safetensors"))
    renamed = {legacy_name(n): t for n, t in tensors.items()}
    assert len(renamed) == len(tensors) and any(n not in tensors for n in renamed)
    save_file(renamed, os.path.join(legacy, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(args.out, "rslora", "adapter_config.json")) as f:
        text = f.read()
    with open(os.path.join(legacy, "adapter_config.json"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(json.dumps({"transformers": transformers.__version__, "peft": peft.__version__}))


def cmd_load(args):
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file, save_file
    import transformers
    with open(os.path.join(args.base, "config.json"), encoding="utf-8") as f:
        arch = json.load(f)["architectures"][0]  # Qwen2VL / Qwen2_5_VL / Qwen3VL ...ForConditionalGeneration
    base = getattr(transformers, arch).from_pretrained(args.base, dtype=torch.float32, attn_implementation="eager")
    pm = PeftModel.from_pretrained(base, args.adapter, is_trainable=True)
    pm.eval()
    loaded = get_peft_model_state_dict(pm)
    stored = load_file(os.path.join(args.adapter, "adapter_model.safetensors"))
    missing, extra = sorted(set(stored) - set(loaded)), sorted(set(loaded) - set(stored))
    if missing or extra:
        sys.exit(f"PEFT did not load the adapter as written: not loaded {missing}, not in the file {extra}")
    for k, t in stored.items():
        if not torch.equal(loaded[k], t.to(loaded[k].dtype)):
            sys.exit(f"PEFT holds {k} with other values than the file")
    io = load_file(args.io)
    res, grads = run(pm, io)
    save_file({**res, **{"grad." + k: g for k, g in grads.items()}}, args.out)
    print(json.dumps({"modules": lora_modules(pm)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("--out", required=True)
    ld = sub.add_parser("load")
    for a in ("--base", "--adapter", "--io", "--out"):
        ld.add_argument(a, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny tensors: threads only cost time
    cmd_make(args) if args.cmd == "make" else cmd_load(args)


if __name__ == "__main__":
    main()
