#!/usr/bin/env python3
"""HF transformers' model of a vlmtrain preset (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5: the
class AutoModelForImageTextToText gives the config's model_type), random init from the same
config, timed on the same batch as bench/step_bench (the GPU run: scripts/gpu/device_run.sh
bench). One JSON line on stdout.

    build/bench/step_bench --preset qwen2-vl-2b --dump-config /tmp/q2b.json
    python3 scripts/gpu/hf_vlm_bench.py --config /tmp/q2b.json --text 1022 --image-tokens 1024

Training step: forward with labels, backward, global grad-norm clip 1.0, AdamW (fused when
available), zero_grad. Precision, to match vlmtrain's bf16 run in bytes per parameter
(bf16 compute, fp32 master + Adam state): fp32 parameters with torch.autocast(bfloat16)
(what HF Trainer's bf16=True does); attention via SDPA (attn_implementation="sdpa"); use
--pure-bf16 for bf16 parameters and optimizer state instead (less memory, not the same
numerics). Batch: --samples B rows of [T/2 prompt] <vision_start> [K image tokens]
<vision_end> [T - T/2 answer, supervised], one image of grid (1, 2, 2K) patches per row.

MFU (PaLM convention, as step_bench): per LLM token 6 x P_LLM + 12 x layers x L x hidden,
per patch 6 x P_vision_blocks + 12 x depth x patches_per_image x embed, merger per 4
patches; recompute not counted; peak --peak-tflops (dense bf16 per GPU, H100/H200 SXM: 989).
That formula is Qwen2-VL's; for the other families pass --flops-per-step (device_run.sh
passes step_bench's flops_per_rank_step for the same batch), else MFU is reported as 0.
Peak memory: torch.cuda.max_memory_allocated (same counter as step_bench's allocator stat).
"""
import argparse
import inspect
import json
import statistics
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="HF config.json (step_bench --dump-config)")
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--text", type=int, default=1790)
    ap.add_argument("--image-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--pure-bf16", action="store_true")
    ap.add_argument("--ckpt", action="store_true",
                    help="gradient checkpointing on the LLM's decoder layers (as step_bench --ckpt)")
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="PEFT LoRA of rank R (alpha 2R, dropout 0) on q/k/v/o and gate/up/down of every "
                         "LLM layer, the rest frozen except visual.merger (as step_bench --mix lora)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of this script")
    ap.add_argument("--flops-per-step", type=float, default=0.0,
                    help="the step's FLOPs (step_bench's flops_per_rank_step); default: the Qwen2-VL formula")
    a = ap.parse_args()

    import transformers
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg_dict = json.load(open(a.config))
    model_type = cfg_dict["model_type"]
    cfg = AutoConfig.for_model(model_type, **{k: v for k, v in cfg_dict.items() if k != "model_type"})
    text_dict = cfg_dict.get("text_config", {})

    def key(name):  # a text key at the top (Qwen2-VL) or in text_config (the later families)
        return cfg_dict.get(name, text_dict.get(name))
    for c in (cfg, getattr(cfg, "vision_config", None), getattr(cfg, "text_config", None)):
        if c is not None:
            c._attn_implementation = "sdpa"
    cfg.use_cache = False
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(7)
    with torch.device(dev):  # random init on the device itself (minutes on the host for 2B)
        model = AutoModelForImageTextToText.from_config(cfg)
    # newer transformers ask for mm_token_type_ids (read before PEFT wraps the forward)
    wants_mm_types = "mm_token_type_ids" in inspect.signature(type(model).forward).parameters
    model = model.to(dev, torch.bfloat16 if a.pure_bf16 else torch.float32)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    visual = model.visual if hasattr(model, "visual") else model.model.visual
    language = model.language_model if hasattr(model, "language_model") else model.model.language_model
    if a.ckpt:
        language.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        language.config.use_cache = False
    if a.lora:
        import peft
        lcfg = peft.LoraConfig(r=a.lora, lora_alpha=2 * a.lora, lora_dropout=0.0, bias="none",
                               target_modules=r".*layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)",
                               modules_to_save=None)
        model = peft.get_peft_model(model, lcfg)
        for name, p in model.named_parameters():  # the merger trains as in the vlmtrain recipe
            if ".visual.merger." in name or name.startswith("visual.merger."):
                p.requires_grad_(True)
        if a.ckpt:
            model.enable_input_require_grads()
    trained = [p for p in model.parameters() if p.requires_grad]
    n_trained = sum(p.numel() for p in trained)
    try:
        opt = torch.optim.AdamW(trained, lr=1e-4, weight_decay=0.01, fused=True)
        fused = True
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(trained, lr=1e-4, weight_decay=0.01)
        fused = False

    # The batch (same layout as bench/step_bench make_batch).
    b, k, t = a.samples, a.image_tokens, a.text
    p, seq = t // 2, t + k + 2
    img, vs, ve = cfg_dict["image_token_id"], cfg_dict["vision_start_token_id"], cfg_dict["vision_end_token_id"]
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(10, min(key("bos_token_id") or key("vocab_size"), key("vocab_size")) - 1, (b, seq), generator=g)
    ids[:, p] = vs
    ids[:, p + 1:p + 1 + k] = img
    ids[:, p + 1 + k] = ve
    labels = torch.full((b, seq), -100, dtype=torch.long)
    labels[:, p + k + 2:] = ids[:, p + k + 2:]
    vis = cfg_dict["vision_config"]
    patch_dim = (vis.get("in_chans", vis.get("in_channels", 3)) * vis.get("temporal_patch_size", 2)
                 * vis.get("patch_size", 14) ** 2)
    pixels = torch.randn(b * 4 * k, patch_dim, generator=g)
    grid = torch.tensor([[1, 2, 2 * k]] * b)
    batch = dict(input_ids=ids.to(dev), attention_mask=torch.ones_like(ids).to(dev), labels=labels.to(dev),
                 pixel_values=pixels.to(dev, torch.bfloat16 if a.pure_bf16 else torch.float32),
                 image_grid_thw=grid.to(dev))
    if wants_mm_types:
        batch["mm_token_type_ids"] = (ids == img).long().to(dev)  # 1 on image tokens (newer transformers ask)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    times, losses = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    for s in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=not a.pure_bf16):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        losses.append(loss.item())
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)

    # FLOPs (convention in the docstring; not computed for LoRA, whose frozen base still
    # runs its input-gradient matmuls: tokens/s and memory are the comparison there).
    p_merger = sum(x.numel() for x in visual.merger.parameters())
    p_vis = sum(x.numel() for x in visual.parameters()) - p_merger
    p_llm = n_params - p_vis - p_merger  # n_params was counted before PEFT added adapters
    if cfg_dict.get("tie_word_embeddings"):
        p_llm += key("vocab_size") * key("hidden_size")  # the head's matmul costs like an untied one
    p_llm -= key("vocab_size") * key("hidden_size")  # the embedding lookup costs nothing
    tokens, patches, per_image = b * seq, b * 4 * k, 4 * k
    embed = vis.get("embed_dim", vis.get("hidden_size"))
    flops = (6 * p_llm * tokens + 12 * key("num_hidden_layers") * seq * key("hidden_size") * tokens
             + 6 * p_vis * patches + 12 * vis["depth"] * per_image * embed * patches + 6 * p_merger * patches / 4)
    if a.flops_per_step > 0:
        flops = a.flops_per_step
    elif model_type != "qwen2_vl":
        flops = 0  # the formula above is Qwen2-VL's (no linear attention, no deepstack)
    if a.lora:
        flops = 0  # no convention (see above); MFU 0 as in step_bench --mix lora
    print(json.dumps({"impl": "hf-transformers", "model_type": model_type, "transformers": transformers.__version__,
                      "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
                      "precision": "pure bf16" if a.pure_bf16 else "fp32 params + autocast bf16", "attn": "sdpa",
                      "mix": f"lora r{a.lora}" if a.lora else "full",
                      "ckpt": bool(getattr(language, "is_gradient_checkpointing", False)), "fused_adamw": fused,
                      "params": n_params, "trainable_params": n_trained, "samples": b, "seq_len": seq,
                      "image_tokens": k, "steps": a.steps, "warmup": a.warmup, "step_s": step_s, "step_s_all": times,
                      "tokens_per_s": tokens / step_s, "images_per_s": b / step_s, "flops_per_step": flops,
                      "mfu": flops / step_s / (a.peak_tflops * 1e12), "peak_tflops": a.peak_tflops,
                      "losses": losses,
                      "peak_device_bytes": torch.cuda.max_memory_allocated(dev) if cuda else 0}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
