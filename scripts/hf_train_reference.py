#!/usr/bin/env python3
"""HF transformers + torch AdamW replay of a vlmtrain run, for the training parity test
(tests/app/train/train_hf_parity_dist_test.cpp).

  init   builds a tiny random Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 (or MoE) with transformers (hf_reference.py's
         shapes and weight draw) whose vocabulary and special token ids are the given
         tokenizer's, and saves it (config.json + model.safetensors): the run's start.
  train  loads that directory with transformers and replays the micro-batches a
         `vlmtrain train` run consumed (VLMTRAIN_DUMP_BATCHES: every rank's micro-batches of
         every step, see app/train/batch_dump.h), with HF computing its own M-RoPE position ids:
         per step, loss = sum over all ranks' micro-batches of the summed token
         cross-entropy / the step's supervised tokens (the objective vlmtrain documents:
         every supervised token of the global batch weighs the same), back-propagated;
         torch.nn.utils.clip_grad_norm_; torch.optim.AdamW with vlmtrain's parameter groups
         (per-module lr globs, no weight decay on biases and norms) and its lr schedule
         (app/train/lr_schedule.cpp: linear warmup (s+1)/w, then cosine / linear / constant to
         min_lr_ratio); MoE with --router-aux-coef c: plus c / (the step's micro-batches on all
         ranks) x each micro-batch's load-balancing loss (HF's aux_loss). Prints one JSON line per step {"step", "loss", "grad_norm", "lr"} and
         checks the dumped position_ids against the ones HF computed.

Usage:
  python scripts/hf_train_reference.py init --out DIR --family qwen2_vl --vocab-size V \
      --image-token-id I --vision-start-id S --vision-end-id E --eos-id X --seed N
  python scripts/hf_train_reference.py train --model DIR --batches DUMP --steps N --lr LR \
      --weight-decay WD --betas B1,B2 --eps EPS --grad-clip C --warmup W --decay cosine \
      --min-lr-ratio R [--group 'GLOB=LR' ...] [--no-decay GLOBS]
"""
import argparse
import fnmatch
import glob
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402  (the tiny shapes and the weight draw)


def model_class(family):
    if family == "qwen3_vl_moe":
        from transformers import Qwen3VLMoeConfig as C, Qwen3VLMoeForConditionalGeneration as M
    elif family == "qwen3_5_moe":
        from transformers import Qwen3_5MoeConfig as C, Qwen3_5MoeForConditionalGeneration as M
    elif family == "qwen3_5":
        from transformers import Qwen3_5Config as C, Qwen3_5ForConditionalGeneration as M
    elif family == "qwen3_vl":
        from transformers import Qwen3VLConfig as C, Qwen3VLForConditionalGeneration as M
    elif family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig as C, Qwen2_5_VLForConditionalGeneration as M
    else:
        from transformers import Qwen2VLConfig as C, Qwen2VLForConditionalGeneration as M
    return C, M


def cmd_init(a):
    cfg = dict(hf_reference.FAMILIES[a.family])
    cfg.update(image_token_id=a.image_token_id, video_token_id=a.image_token_id,
               vision_start_token_id=a.vision_start_id, vision_end_token_id=a.vision_end_id)
    # The text keys: top level (Qwen2 families) or text_config (Qwen3-VL's nested layout).
    text = cfg
    if "text_config" in cfg:
        text = cfg["text_config"] = dict(cfg["text_config"])
    text.update(vocab_size=a.vocab_size, eos_token_id=a.eos_id, bos_token_id=a.eos_id)
    text.pop("pad_token_id", None)
    if a.pad_token_id >= 0:  # HF then freezes that embedding row (nn.Embedding padding_idx)
        text["pad_token_id"] = a.pad_token_id
    torch.manual_seed(a.seed)
    model = hf_reference.build(a.family, cfg)
    if a.family.startswith("qwen3_5"):  # the decays as transformers initialises them (MoE too)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("linear_attn.A_log"):
                    p.copy_(torch.empty_like(p).uniform_(0.01, 16).log())
                elif n.endswith("linear_attn.dt_bias"):
                    p.fill_(1.0)
    model.save_pretrained(a.out)
    print(json.dumps({"out": a.out, "params": sum(p.numel() for p in model.parameters())}))


# ---------------------------------------------------------------- train (replay)
def vlmtrain_name(hf_name):
    """HF 5.x parameter name -> vlmtrain's (= the checkpoint's) name."""
    if hf_name.startswith("model.visual."):
        return hf_name[len("model."):]
    if hf_name.startswith("model.language_model."):
        return "model." + hf_name[len("model.language_model."):]
    return hf_name


def glob_match(pattern, name):  # app's glob: '*' any run (dots too), '|' alternatives, whole string
    return any(fnmatch.fnmatchcase(name, p) for p in pattern.split("|"))


def lr_factor(step, a):  # app/train/lr_schedule.cpp, step 0-based
    if step < a.warmup:
        return (step + 1) / a.warmup
    if a.decay == "constant":
        return 1.0
    p = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    r = a.min_lr_ratio
    if a.decay == "cosine":
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * p))
    return r + (1 - r) * (1 - p)


def param_groups(model, a):
    rules = []
    for g in a.group:
        pat, lr = g.rsplit("=", 1)
        rules.append((pat, float(lr)))
    groups = {}
    for n, p in model.named_parameters():
        name = vlmtrain_name(n)
        lr = next((lr for pat, lr in rules if glob_match(pat, name)), a.lr)
        wd = 0.0 if glob_match(a.no_decay, name) else a.weight_decay
        groups.setdefault((lr, wd), []).append(p)
    return [dict(params=ps, lr=lr, weight_decay=wd, base_lr=lr) for (lr, wd), ps in groups.items()]


def load_step(dump, step):
    from safetensors import safe_open
    out = []
    for path in sorted(glob.glob(os.path.join(dump, f"step-{step:06d}.rank-*.mb-*.safetensors"))):
        with safe_open(path, "pt") as f:
            meta = f.metadata()
            t = {k: f.get_tensor(k) for k in f.keys()}
        out.append((path, meta, t))
    if not out:
        sys.exit(f"hf_train_reference: no micro-batches of step {step} in {dump} "
                 "(expected step-NNNNNN.rank-R.mb-K.safetensors from VLMTRAIN_DUMP_BATCHES)")
    return out


def forward_loss(model, t, image_token_id, aux=False):
    """Summed token cross-entropy of one micro-batch and HF's position ids [3, B, L] (and, with
    aux, the MoE load-balancing loss: output_router_logits, the attention mask)."""
    captured = {}
    hook = model.model.language_model.rotary_emb.register_forward_pre_hook(
        lambda _m, args: captured.__setitem__("pos", args[1].detach().clone()))
    kw = dict(input_ids=t["input_ids"], attention_mask=t["attention_mask"])
    if "pixel_values" in t:
        kw.update(pixel_values=t["pixel_values"], image_grid_thw=t["image_grid_thw"],
                  mm_token_type_ids=(t["input_ids"] == image_token_id).to(torch.int32))
    if aux:
        kw["output_router_logits"] = True
    out = model(**kw)
    logits = out.logits.float()
    hook.remove()
    V = logits.shape[-1]
    loss_sum = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, V), t["labels"][:, 1:].reshape(-1),
                                                 ignore_index=-100, reduction="sum")
    pos = captured["pos"]
    if pos.dim() == 2:
        pos = pos[None]
    return loss_sum, pos.expand(3, *t["input_ids"].shape), (out.aux_loss if aux else None)


def cmd_train(a):
    import transformers
    torch.set_num_threads(a.threads)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    _, M = model_class(cfg["model_type"])
    extra = dict(experts_implementation="eager") if cfg["model_type"].endswith("_moe") else {}
    model = M.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager", **extra).train()
    image_token_id = cfg.get("image_token_id", cfg.get("text_config", {}).get("image_token_id"))
    b1, b2 = (float(x) for x in a.betas.split(","))
    groups = param_groups(model, a)
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(b1, b2), eps=a.eps, foreach=False)
    params = list(model.parameters())
    max_pos_diff = 0
    for step in range(1, a.steps + 1):
        mbs = load_step(a.batches, step)
        sup = [int((t["labels"][:, 1:] != -100).sum()) for _, _, t in mbs]
        for (path, meta, _), n in zip(mbs, sup):
            if int(meta["supervised_tokens"]) != n:
                sys.exit(f"{path}: metadata says {meta['supervised_tokens']} supervised tokens, labels hold {n}")
        total = max(1, sum(sup))
        loss_total = 0.0
        for (path, meta, t), n in zip(mbs, sup):
            if meta["filler"] == "1":  # fully masked stand-in: contributes nothing by definition
                continue
            loss_sum, pos, aux = forward_loss(model, t, image_token_id, a.router_aux_coef > 0)
            objective = loss_sum / total
            if aux is not None:  # vlmtrain: coef x the mean over the step's micro-batches (all ranks)
                objective = objective + a.router_aux_coef / len(mbs) * aux
            objective.backward()
            loss_total += loss_sum.item()
            real = t["attention_mask"].bool()
            d = (pos - t["position_ids"]).abs()[:, real]
            max_pos_diff = max(max_pos_diff, int(d.max()) if d.numel() else 0)
        gnorm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip if a.grad_clip > 0 else float("inf"))
        f = lr_factor(step - 1, a)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * f
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(json.dumps({"step": step, "loss": loss_total / total, "grad_norm": float(gnorm), "lr": a.lr * f,
                          "micro_batches": len(mbs), "supervised_tokens": total}), flush=True)
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                      "max_position_id_diff": max_pos_diff}), flush=True)
    if max_pos_diff != 0:
        sys.exit(f"hf_train_reference: the dumped position_ids differ from HF's by up to {max_pos_diff}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("init")
    i.add_argument("--out", required=True)
    i.add_argument("--family", default="qwen2_vl", choices=list(hf_reference.FAMILIES))
    i.add_argument("--vocab-size", type=int, required=True)
    i.add_argument("--image-token-id", type=int, required=True)
    i.add_argument("--vision-start-id", type=int, required=True)
    i.add_argument("--vision-end-id", type=int, required=True)
    i.add_argument("--eos-id", type=int, required=True)
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--pad-token-id", type=int, default=-1, help="config pad_token_id (-1: none)")
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--batches", required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--betas", default="0.9,0.999")
    t.add_argument("--eps", type=float, default=1e-8)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--warmup", type=int, default=0)
    t.add_argument("--decay", default="cosine", choices=["cosine", "linear", "constant"])
    t.add_argument("--min-lr-ratio", type=float, default=0.0)
    t.add_argument("--group", action="append", default=[], help="GLOB=LR on vlmtrain names, first match wins")
    t.add_argument("--no-decay", default="*.bias|*norm*.weight|*ln_q.weight")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--router-aux-coef", type=float, default=0.0,
                   help="MoE: model.router_aux_loss_coef of the run (its load-balancing term)")
    a = ap.parse_args()
    cmd_init(a) if a.cmd == "init" else cmd_train(a)


if __name__ == "__main__":
    main()
