#!/usr/bin/env python3
"""CPU training-step benchmark, vlmtrain vs HF transformers, world 1 (issue #30 item 1, row (a)).

Both train the same HF directory (--model: e.g. a `vlmtrain export --dtype fp32` of a
small-preset checkpoint) on exactly the same micro-batches, with the same thread count:

  1. parity: `vlmtrain train` (recipes/ocr_tiny.toml with --set overrides: model.path =
     --model, world 1, plain DDP at world 1, log.every = 1) runs --steps steps with
     VLMTRAIN_DUMP_BATCHES, once without and once with activation checkpointing; HF
     (transformers, torch.optim.AdamW with vlmtrain's parameter groups and lr schedule,
     the summed-token loss of scripts/hf_train_reference.py) replays those dumps and the
     per-step losses must agree within --tol relative (the first --check-steps steps).
  2. timing: --rounds rounds, each alternating a vlmtrain run of --steps steps and an HF
     run of --steps steps on the same dumped micro-batches (preloaded; no dump while
     timing), for ckpt off and on. vlmtrain's step time is metrics.jsonl `step_s`
     (log.every = 1: one step's wall time, data wait included); HF's is the wall time of
     forward + backward over the step's micro-batches + clip_grad_norm_ + AdamW step +
     zero_grad. The first step of every run is warm-up and left out; per run the median
     of the rest, then the median over rounds.

Threads: OMP_NUM_THREADS=N in vlmtrain's environment (app/train/trainer.cpp keeps LibTorch's
default, which honours OMP_NUM_THREADS, when it is set), torch.set_num_threads(N) here.

  python scripts/bench_hf_step.py --model HF_DIR --data SYNTH_DIR --out bench.json
"""
import argparse
import json
import os
import re
import resource
import platform
import statistics
import subprocess
import sys
import time
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_train_reference as ref  # noqa: E402  (load_step, forward_loss, param_groups, lr_factor)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CKPT_MATCH = "model.layers.*|visual.blocks.*"
VIT_GROUP = "visual.patch_embed.*|visual.blocks.*"  # recipes/ocr_tiny.toml's [[optim.group]]


def loadavg():
    with open("/proc/loadavg") as f:
        return f.read().strip()


def vlmtrain_sets(a, out_dir, ckpt):
    """The recipe overrides both benches give `vlmtrain` (the tiny recipe on the HF directory
    and data of `a`, no eval, no checkpoints, no sharding rules); the caller adds the policy."""
    return [
        f"run.output_dir={out_dir}", "model.preset=", f"model.path={a.model}",
        f"model.tokenizer={os.path.join(a.data, 'tokenizer.model')}",
        f"data.train={os.path.join(a.data, 'train.jsonl')}", "data.eval=[]", "data.synth.generate_if_missing=false",
        "data.num_workers=1", f"batch.samples_per_rank={a.samples}", f"batch.max_tokens={a.max_tokens}",
        f"schedule.steps={a.steps}", f"schedule.warmup_steps={a.warmup}", "schedule.decay=cosine",
        f"schedule.min_lr_ratio={a.min_lr_ratio}", f"optim.lr={a.lr}", f"optim.weight_decay={a.weight_decay}",
        f"optim.grad_clip={a.grad_clip}", "precision.param_dtype=fp32", "precision.reduce_dtype=fp32",
        "eval.every=0", "eval.at_end=false", "log.every=1", "checkpoint.every=0", "checkpoint.save_final=false",
        "sharding.module=[]", f"activation_checkpointing.match={CKPT_MATCH if ckpt else ''}",
    ]


def vlmtrain_command(a, head, sets, out_dir, dump=None):
    """argv and environment of a fresh vlmtrain run in out_dir (removed first: not a resume):
    head (e.g. [vlmtrain, "train"]) + recipes/ocr_tiny.toml + a --set per entry of sets,
    OMP_NUM_THREADS = a.threads, VLMTRAIN_DUMP_BATCHES = dump when given."""
    argv = head + [os.path.join(ROOT, "recipes", "ocr_tiny.toml")]
    for s in sets:
        argv += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    env.pop("VLMTRAIN_DUMP_BATCHES", None)
    if dump:
        env["VLMTRAIN_DUMP_BATCHES"] = dump
    subprocess.run(["rm", "-rf", out_dir], check=True)
    return argv, env


def vlmtrain_run(a, out_dir, ckpt, dump=None):
    sets = vlmtrain_sets(a, out_dir, ckpt) + ["sharding.default=ddp"]
    argv, env = vlmtrain_command(a, [a.vlmtrain, "train"], sets, out_dir, dump)
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - w0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"vlmtrain failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    with open(os.path.join(out_dir, "train.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    # The MFU line names at::get_num_threads(): the intra-op threads vlmtrain really uses.
    m = re.search(r"peak of (\d+) core\(s\)", p.stdout + p.stderr)
    vlmtrain_run.threads = int(m.group(1)) if m else None
    vlmtrain_run.cpu_util = ((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)) / wall
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    rows = [r for r in rows if "step_s" in r]
    if len(rows) != a.steps:
        sys.exit(f"vlmtrain: expected {a.steps} metrics rows in {out_dir}, got {len(rows)}")
    return rows


def hf_args(a):
    return types.SimpleNamespace(group=[f"{VIT_GROUP}={a.vit_lr}"], lr=a.lr, weight_decay=a.weight_decay,
                                 no_decay="*.bias|*norm*.weight|*ln_q.weight", warmup=a.warmup, decay="cosine",
                                 steps=a.steps, min_lr_ratio=a.min_lr_ratio)


def hf_run(a, batches, ckpt):
    """One HF run of len(batches) steps from the model directory; per-step loss and seconds."""
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    _, M = ref.model_class(cfg["model_type"])
    model = M.from_pretrained(a.model, dtype=torch.float32, attn_implementation=a.attn).train()
    if ckpt:
        model.gradient_checkpointing_enable()
    image_token_id = cfg.get("image_token_id", cfg.get("text_config", {}).get("image_token_id"))
    ra = hf_args(a)
    opt = torch.optim.AdamW(ref.param_groups(model, ra), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    params = list(model.parameters())
    out = []
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for step, mbs in enumerate(batches, start=1):
        total = max(1, sum(int((t["labels"][:, 1:] != -100).sum()) for _, _, t in mbs))
        t0 = time.perf_counter()
        loss_total = 0.0
        for _path, meta, t in mbs:
            if meta["filler"] == "1":
                continue
            loss_sum, _pos = ref.forward_loss(model, t, image_token_id)
            (loss_sum / total).backward()
            loss_total += loss_sum.item()
        gnorm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        f = ref.lr_factor(step - 1, ra)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * f
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        out.append({"step": step, "loss": loss_total / total, "grad_norm": float(gnorm), "step_s": dt,
                    "micro_batches": len(mbs)})
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    hf_run.cpu_util = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / (time.perf_counter() - w0)
    del model, opt
    return out


def rel(x, y):
    return abs(x - y) / max(abs(y), 1e-12)


def steady(times):  # leave out the warm-up step
    return statistics.median(times[1:] if len(times) > 1 else times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF directory both train from")
    ap.add_argument("--data", required=True, help="synth-ocr directory (train.jsonl, tokenizer.model)")
    ap.add_argument("--vlmtrain", default=os.path.join(ROOT, "build", "vlmtrain"))
    ap.add_argument("--work", default="/tmp/bench_hf_step")
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=8, help="K: steps per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=4, help="batch.samples_per_rank")
    ap.add_argument("--max-tokens", type=int, default=2048, help="batch.max_tokens (micro-batch token cap)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--vit-lr", type=float, default=2e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--attn", default="sdpa", help="HF attn_implementation (transformers' default: sdpa)")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative loss tolerance of the parity check")
    ap.add_argument("--check-steps", type=int, default=3, help="steps whose losses must agree")
    a = ap.parse_args()

    import transformers
    torch.set_num_threads(a.threads)
    os.makedirs(a.work, exist_ok=True)
    info = {"threads": a.threads, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "loadavg_start": loadavg(), "args": vars(a)}
    t_start = time.time()

    # 1. parity on dumped batches (and the batches the timed runs replay)
    batches, parity = {}, {}
    for ckpt in (False, True):
        tag = "ckpt" if ckpt else "nockpt"
        dump = os.path.join(a.work, f"batches-{tag}")
        subprocess.run(["rm", "-rf", dump], check=True)
        v = vlmtrain_run(a, os.path.join(a.work, f"parity-{tag}"), ckpt, dump=dump)
        batches[ckpt] = [ref.load_step(dump, s) for s in range(1, a.steps + 1)]
        h = hf_run(a, batches[ckpt], ckpt)
        diffs = [rel(vr["loss"], hr["loss"]) for vr, hr in zip(v, h)]
        gdiffs = [rel(vr["grad_norm"], hr["grad_norm"]) for vr, hr in zip(v, h)]
        parity[tag] = {"vlmtrain_loss": [r["loss"] for r in v], "hf_loss": [r["loss"] for r in h],
                       "loss_rel_diff": diffs, "grad_norm_rel_diff": gdiffs,
                       "micro_batches": [r["micro_batches"] for r in h],
                       "supervised_tokens": [r["supervised_tokens"] for r in v],
                       "vlmtrain_threads_logged": vlmtrain_run.threads,
                       "vlmtrain_cpu_util": vlmtrain_run.cpu_util, "hf_cpu_util": hf_run.cpu_util}
        bad = [i + 1 for i, d in enumerate(diffs[:a.check_steps]) if d > a.tol]
        print(f"parity {tag}: loss rel diff per step " + " ".join(f"{d:.1e}" for d in diffs), flush=True)
        if bad:
            json.dump({"info": info, "parity": parity}, open(a.out, "w"), indent=1)
            sys.exit(f"parity {tag}: steps {bad} differ by more than {a.tol} relative; not timing")

    # 2. interleaved timing
    runs = {k: {"vlmtrain": [], "hf": [], "vlmtrain_cpu_util": [], "hf_cpu_util": []} for k in ("nockpt", "ckpt")}
    for r in range(a.rounds):
        for ckpt in (False, True):
            tag = "ckpt" if ckpt else "nockpt"
            v = vlmtrain_run(a, os.path.join(a.work, f"time-{tag}-{r}"), ckpt)
            runs[tag]["vlmtrain"].append([x["step_s"] for x in v])
            h = hf_run(a, batches[ckpt], ckpt)
            runs[tag]["hf"].append([x["step_s"] for x in h])
            runs[tag]["vlmtrain_cpu_util"].append(vlmtrain_run.cpu_util)
            runs[tag]["hf_cpu_util"].append(hf_run.cpu_util)
            print(f"round {r + 1} {tag}: vlmtrain {steady(runs[tag]['vlmtrain'][-1]):.3f} s/step, "
                  f"hf {steady(runs[tag]['hf'][-1]):.3f} s/step", flush=True)

    summary = {}
    for tag, rr in runs.items():
        vm = statistics.median(steady(t) for t in rr["vlmtrain"])
        hm = statistics.median(steady(t) for t in rr["hf"])
        summary[tag] = {"vlmtrain_step_s": vm, "hf_step_s": hm, "ratio_vlmtrain_over_hf": vm / hm,
                        "vlmtrain_cpu_util": statistics.median(rr["vlmtrain_cpu_util"]),
                        "hf_cpu_util": statistics.median(rr["hf_cpu_util"])}
    info["loadavg_end"] = loadavg()
    info["wall_s"] = time.time() - t_start

    print()
    print(f"CPU train step, world 1, {a.threads} threads, small preset ({a.samples} samples/step, "
          f"K={a.steps} steps x {a.rounds} rounds, median of steps 2..K per run, median over rounds)")
    print(f"{'activation ckpt':<16} {'vlmtrain s/step':>16} {'HF s/step':>10} {'vlmtrain/HF':>12} "
          f"{'loss rel diff (first ' + str(a.check_steps) + ')':>26}")
    for tag, label in (("nockpt", "off"), ("ckpt", "on")):
        s = summary[tag]
        md = max(parity[tag]["loss_rel_diff"][:a.check_steps])
        print(f"{label:<16} {s['vlmtrain_step_s']:>16.3f} {s['hf_step_s']:>10.3f} "
              f"{s['ratio_vlmtrain_over_hf']:>12.2f} {md:>26.1e}")
    print("CPU use (cores busy, process lifetime for vlmtrain incl. startup; HF over its steps): " + ", ".join(
        f"{t} vlmtrain {summary[t]['vlmtrain_cpu_util']:.2f} / HF {summary[t]['hf_cpu_util']:.2f}"
        for t in ("nockpt", "ckpt")) + f"; vlmtrain logged {parity['nockpt']['vlmtrain_threads_logged']} intra-op threads")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, HF attn {a.attn}; "
          f"loadavg start {info['loadavg_start']} | end {info['loadavg_end']}")
    json.dump({"info": info, "parity": parity, "runs": runs, "summary": summary}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
