#!/usr/bin/env python3
"""Planned vs measured peak memory per rank, for each policy mix (issue #29's bench row).

Runs `vlmtrain` (train, a few steps) on the tiny recipe with one policy mix at a time and
reads metrics.jsonl: `tensor_peak_bytes` is the measured peak of tensor bytes on the rank's
device over the logging window (on CPU, vlm/runtime/tensor_memory.h counts every storage the CPU
allocator hands out), `tensor_peak_planned_bytes` the plan for the micro-batches the window
ran (app/plan/step_memory.h: app/plan/memory_plan.h + app/plan/activation_memory.h). Both are rank
0's. The ratio plan / measured per step, its worst step, and the target (within 10%).

  python3 scripts/bench/memory_plan.py [--vlmtrain build/vlmtrain] [--steps 4] [--out DIR] [--json F]

Each mix is a [sharding] (and [activation_checkpointing], [precision], [batch]) block
replacing the tiny recipe's; world 2 runs through `vlmtrain launch --nproc-per-node 2`.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FSDP_ALL = '[sharding]\ndefault = "fsdp"\ndefault_strategy = "full_shard"\n'
MIXES = [
    # name, world, the recipe blocks that replace the tiny recipe's [sharding] section
    ("tiny default: fsdp vision + ddp merger + fsdp LLM", 1, None),
    ("all ddp", 1, '[sharding]\ndefault = "ddp"\n'),
    ("all fsdp full_shard", 1, FSDP_ALL),
    ("all fsdp shard_grad_op", 1, '[sharding]\ndefault = "fsdp"\ndefault_strategy = "shard_grad_op"\n'),
    ("frozen vision + ddp merger + fsdp LLM", 1,
     '[sharding]\ndefault = "fsdp"\ndefault_strategy = "full_shard"\n'
     '[[sharding.module]]\nmatch = "visual.patch_embed|visual.blocks.*"\npolicy = "freeze"\n'
     '[[sharding.module]]\nmatch = "visual.merger"\npolicy = "ddp"\n'),
    ("full_shard + activation checkpointing (LLM layers)", 1,
     FSDP_ALL + '[activation_checkpointing]\nmatch = "model.layers.*"\n'),
    ("full_shard + activation checkpointing (all blocks and layers)", 1,
     FSDP_ALL + '[activation_checkpointing]\nmatch = "visual.blocks.*|model.layers.*"\n'),
    ("LoRA r 8 on attention + MLP (dropout 0.05), rest frozen", 1,
     '[sharding]\ndefault = "freeze"\n[[sharding.module]]\n'
     'match = "model.layers.*.self_attn.q_proj|model.layers.*.self_attn.v_proj|model.layers.*.mlp.*"\n'
     'policy = "lora"\nr = 8\nalpha = 16\ndropout = 0.05\n'),
    ("all fsdp full_shard + optimizer offload", 1, FSDP_ALL + 'optimizer_offload = true\n'),
    ("all fsdp full_shard, unsharded accumulation", 1, FSDP_ALL + 'fsdp_accumulate = "unsharded"\n'),
    ("all fsdp full_shard, packing", 1, FSDP_ALL, {"batch.packing": "true"}),
    ("all ddp", 2, '[sharding]\ndefault = "ddp"\n'),
    ("all fsdp full_shard", 2, FSDP_ALL),
    ("frozen vision + ddp merger + fsdp LLM", 2,
     '[sharding]\ndefault = "fsdp"\ndefault_strategy = "full_shard"\n'
     '[[sharding.module]]\nmatch = "visual.patch_embed|visual.blocks.*"\npolicy = "freeze"\n'
     '[[sharding.module]]\nmatch = "visual.merger"\npolicy = "ddp"\n'),
    ("full_shard + activation checkpointing (LLM layers)", 2,
     FSDP_ALL + '[activation_checkpointing]\nmatch = "model.layers.*"\n'),
]


def recipe_for(base, block):
    if block is None:
        return base
    start = base.index("[sharding]")
    end = base.index("[dist]")
    return base[:start] + block + "\n" + base[end:]


def run_mix(args, i, name, world, block, sets):
    out = os.path.join(args.out, f"mix{i:02d}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(ROOT, "recipes", "ocr_tiny.toml")) as f:
        base = f.read()
    recipe = os.path.join(out, "recipe.toml")
    with open(recipe, "w") as f:
        f.write(recipe_for(base, block))
    run_dir = os.path.join(out, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = {"schedule.steps": str(args.steps), "schedule.warmup_steps": "1", "log.every": "1",
                 "run.output_dir": run_dir, "checkpoint.every": "0", "checkpoint.save_final": "false",
                 "eval.every": "0", "eval.at_end": "false", "log.tensorboard": "false"}
    overrides.update(sets or {})
    cmd = [args.vlmtrain]
    if world > 1:
        cmd += ["launch", "--nproc-per-node", str(world)]
    cmd += [recipe]
    for k, v in overrides.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:])
        raise SystemExit(f"memory_plan: mix '{name}' (world {world}) failed with exit code {p.returncode}")
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "tensor_peak_planned_bytes" in j and j.get("tensor_peak_bytes", 0) > 0:
                rows.append((j["step"], j["tensor_peak_bytes"], j["tensor_peak_planned_bytes"]))
    if not rows:
        raise SystemExit(f"memory_plan: mix '{name}': no step in {run_dir}/metrics.jsonl has both peaks")
    ratios = [plan / meas for _, meas, plan in rows]
    worst = max(ratios, key=lambda r: abs(r - 1))
    return {"mix": name, "world": world, "steps": len(rows), "measured_max": max(r[1] for r in rows),
            "planned_max": max(r[2] for r in rows), "ratios": ratios, "worst": worst,
            "within_10pct": all(abs(r - 1) <= 0.10 for r in ratios), "seconds": time.time() - t0,
            "command": " ".join(cmd)}


def report_section(md, vlmtrain, out, record_cmd, steps=4):
    """Section 12 of bench/RESULTS.md (scripts/bench/bench.py): every mix, a table row each."""
    md.append("## 12. Planned vs measured peak memory per rank (scripts/bench/memory_plan.py)\n")
    md.append("`vlmtrain` on the tiny recipe, 4 steps per policy mix, each step's measured peak of tensor bytes "
              "(tensor_peak_bytes: on the CPU every storage the CPU allocator hands out, vlm/runtime/tensor_memory.h) "
              "next to the plan for the micro-batches that step ran (tensor_peak_planned_bytes: app/plan/step_memory.h "
              "= app/plan/memory_plan.h + app/plan/activation_memory.h). Rank 0's figures; target: within 10% at every "
              "step. Byte counts, so the machine's load does not move them.\n")
    md.append("| policy mix | world | measured peak | planned | planned / measured (per step) | within 10% |")
    md.append("|---|---|---|---|---|---|")
    args = argparse.Namespace(vlmtrain=vlmtrain, steps=steps, out=out)
    os.makedirs(out, exist_ok=True)
    results = []
    for i, mix in enumerate(MIXES):
        r = run_mix(args, i, mix[0], mix[1], mix[2], mix[3] if len(mix) > 3 else None)
        record_cmd(r["command"])
        results.append(r)
        md.append(f"| {r['mix']} | {r['world']} | {r['measured_max'] / 2**20:.1f} MiB | {r['planned_max'] / 2**20:.1f} MiB "
                  f"| {', '.join(f'{x:.3f}' for x in r['ratios'])} | {'yes' if r['within_10pct'] else '**no**'} |")
    md.append("")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vlmtrain", default=os.path.join(ROOT, "build", "vlmtrain"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-out", "memory_plan"))
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--only", default=None, help="regex on the mix name")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    for i, mix in enumerate(MIXES):
        name, world, block = mix[:3]
        sets = mix[3] if len(mix) > 3 else None
        if args.only and not re.search(args.only, name):
            continue
        r = run_mix(args, i, name, world, block, sets)
        results.append(r)
        print(f"{name:62s} world {world}: measured {r['measured_max'] / 2**20:7.1f} MiB, plan "
              f"{r['planned_max'] / 2**20:7.1f} MiB, plan/measured per step "
              f"{', '.join(f'{x:.3f}' for x in r['ratios'])} -> {'within 10%' if r['within_10pct'] else 'MISSED'}",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    missed = [r for r in results if not r["within_10pct"]]
    print(f"{len(results) - len(missed)} of {len(results)} mixes within 10% of the measured peak at every step")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
