#!/usr/bin/env python3
"""Pipeline parallelism (dist.pp) in the plan: memory and traffic per rank for 7B / 32B / 72B
layouts with pp against FSDP alone and tensor parallelism alone, through the built vlmtrain.

Plan: `vlmtrain plan recipes/ocr_qwen25.toml --preset P --world-size W --nproc-per-node 8
--tokens 8192 --image-tokens 4096 --micro-batches 8 --set dist.tp=T --set dist.pp=S` for every
layout (the same 8 micro-batches a step everywhere: pp's bubble and in-flight activations need
them, and FSDP gathers per micro-batch). Per rank, the largest stage's: parameters, persistent
bytes and step peak; traffic per step, the largest stage's: DDP / FSDP (the plan's ops for 8
micro-batches), the tp group's bytes x 8, the pipeline sends x 8 (forward activations on the
link to the next stage, gradients on the link to the previous) and a tied head's gradient sum,
each in its link class (ranks fill nodes of 8 in order).

Step time on the CPU: `vlmtrain launch --nproc-per-node N train recipes/ocr_tiny.toml` on the
built-in synthetic OCR data (--preset, default `small`), N = 1 (world 1) and N = 2 (pp 2, one
data-parallel rank per stage), 8 samples a step in micro-batches of 2 (batch.max_tokens), one
thread per rank, the median step_s of metrics.jsonl after the first --skip steps. Reported:
seconds per step and the ratio; CPU seconds (N x step) against world 1's; the bubble.

Writes the section "## 18. Pipeline parallelism" of bench/RESULTS.md (or prints it with --print).

  python3 scripts/bench/pipeline_parallel.py [--build build] [--preset small] [--steps 12] [--print]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from results_section import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLE = "## 18. Pipeline parallelism (dist.pp): CPU step time and planned memory / traffic per rank"
NODE = 8           # ranks per node
MICRO_BATCHES = 8  # per step, every layout
# (preset, world, tp, pp)
LAYOUTS = [("qwen2.5-vl-7b", 8, 1, 1), ("qwen2.5-vl-7b", 8, 4, 1), ("qwen2.5-vl-7b", 8, 1, 2),
           ("qwen2.5-vl-7b", 8, 4, 2),
           ("qwen2.5-vl-32b", 16, 1, 1), ("qwen2.5-vl-32b", 16, 8, 1), ("qwen2.5-vl-32b", 16, 1, 2),
           ("qwen2.5-vl-32b", 16, 8, 2),
           ("qwen2.5-vl-72b", 32, 1, 1), ("qwen2.5-vl-72b", 32, 8, 1), ("qwen2.5-vl-72b", 32, 1, 4),
           ("qwen2.5-vl-72b", 32, 8, 2)]


def train(build, pp, preset, steps, max_tokens, work):
    run_dir = os.path.join(work, f"pp{pp}")
    cmd = [os.path.join(build, "vlmtrain"), "launch", "--nproc-per-node", str(pp), "train",
           os.path.join(ROOT, "recipes", "ocr_tiny.toml"),
           "--set", f"model.preset={preset}", "--set", f"run.output_dir={run_dir}",
           "--set", f"schedule.steps={steps}", "--set", "schedule.warmup_steps=1",
           "--set", "checkpoint.every=0", "--set", "checkpoint.save_final=false",
           "--set", "eval.every=0", "--set", "eval.at_end=false", "--set", "data.eval=[]",
           "--set", "log.every=1", "--set", f"dist.pp={pp}", "--set", "batch.samples_per_rank=8",
           "--set", f"batch.max_tokens={max_tokens}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"pipeline_parallel.py: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [j for j in map(json.loads, f) if "step_s" in j]


def plan(build, preset, world, tp, pp):
    cmd = [os.path.join(build, "vlmtrain"), "plan", os.path.join(ROOT, "recipes", "ocr_qwen25.toml"), "--preset",
           preset, "--world-size", str(world), "--nproc-per-node", str(NODE), "--tokens", "8192", "--image-tokens",
           "4096", "--micro-batches", str(MICRO_BATCHES), "--set", f"dist.tp={tp}", "--set", f"dist.pp={pp}", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"pipeline_parallel.py: {' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout)


def spans_nodes(a, b, ranks):
    """Whether rank j of the run starting at a and rank j of the run starting at b sit on
    different nodes for some j < ranks."""
    return any((a + j) // NODE != (b + j) // NODE for j in range(ranks))


def pipeline_row(j, world):
    """Per rank: the largest stage's parameters, persistent bytes, step peak, and traffic per
    step (intra-node, inter-node)."""
    pp = j["pipeline_parallel"]
    m, n, stage_ranks = pp["micro_batches"], pp["pp"], world // pp["pp"]
    one_way = pp["link_bytes_per_micro_batch"] / 2 * m
    tie_inter = spans_nodes(0, (n - 1) * stage_ranks, stage_ranks)
    params = persistent = peak = intra = inter = 0
    for s in pp["stages"]:
        i, e = s["dp_intra_node_bytes_per_step"] + s["tp_bytes_per_micro_batch"] * m, s["dp_inter_node_bytes_per_step"]
        links = []  # (bytes, inter-node) of the sends on this rank's links
        if s["stage"] > 0:
            links.append((one_way, pp["stages"][s["stage"] - 1]["next_link_inter_node"]))
        if s["stage"] < n - 1:
            links.append((one_way, s["next_link_inter_node"]))
        links.append((s["tied_gradient_bytes_per_step"], tie_inter))
        for b, across in links:
            e, i = (e + b, i) if across else (e, i + b)
        params, persistent = max(params, s["params_per_rank"]), max(persistent, s["persistent_bytes"])
        peak, intra, inter = max(peak, s["step_peak_bytes"]), max(intra, i), max(inter, e)
    return params, persistent, peak, intra, inter, pp["bubble"]


def flat_row(j):
    m = MICRO_BATCHES
    t, tr = j.get("tensor_parallel", {}), j["traffic"]
    intra = tr["step_1mb"]["intra_node_bytes"] + (m - 1) * tr["per_extra_micro_batch"]["intra_node_bytes"]
    inter = tr["step_1mb"]["inter_node_bytes"] + (m - 1) * tr["per_extra_micro_batch"]["inter_node_bytes"]
    intra += t.get("bytes_per_micro_batch", 0) * m
    return (t.get("params_per_rank", j["total_params"]), j["step_peak"]["persistent_bytes"],
            j["step_peak"]["total_bytes"], intra, inter, 0.0)


def layout_name(world, tp, pp):
    parts = ([f"tp {tp}"] if tp > 1 else []) + ([f"pp {pp}"] if pp > 1 else []) + [f"fsdp {world // (tp * pp)}"]
    return " x ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    ap.add_argument("--max-tokens", type=int, default=128, help="batch.max_tokens: micro-batches of ~2 samples")
    ap.add_argument("--print", action="store_true")
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="pp-bench-") as work:
        step, micro, bubble = {}, {}, {}
        for pp in (1, 2):
            rows = train(a.build, pp, a.preset, a.steps, a.max_tokens, work)[a.skip:]
            step[pp] = statistics.median(r["step_s"] for r in rows)
            micro[pp] = statistics.median(r["micro_batches"] for r in rows)
            bubble[pp] = statistics.median(r.get("pipeline_bubble", 0.0) for r in rows)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    g = 2**30
    lines = [TITLE, "",
             f"Step time: `vlmtrain launch --nproc-per-node N train recipes/ocr_tiny.toml` with `model.preset = "
             f"{a.preset}` on the synthetic OCR data, fp32, 8 samples a step in micro-batches of `batch.max_tokens = "
             f"{a.max_tokens}` ({micro[1]:.0f} a step, median), one thread per rank, median `step_s` of steps "
             f"{a.skip + 1}-{a.steps} (`python3 scripts/bench/pipeline_parallel.py`; {started}, load {load}, "
             f"{time.time() - t0:.0f} s).", "",
             "| layout | s / step | vs world 1 | CPU seconds / step (ranks x s) | vs world 1 | bubble |",
             "|---|---|---|---|---|---|",
             f"| world 1 | {step[1]:.3f} | 1.00x | {step[1]:.3f} | 1.00x | - |",
             f"| pp 2 (world 2) | {step[2]:.3f} | {step[2] / step[1]:.2f}x | {2 * step[2]:.3f} | "
             f"{2 * step[2] / step[1]:.2f}x | {100 * bubble[2]:.0f}% |", "",
             "The two stages run on a core each at once: a pp 2 step takes the larger stage's share of the work (stage "
             "0 also runs the vision tower), the bubble, in which a stage waits on the other, and the exchanges over "
             "Gloo. World 1 runs everything on one core (one thread per rank).", "",
             f"Plan: `vlmtrain plan recipes/ocr_qwen25.toml --preset P --world-size W --nproc-per-node {NODE} "
             f"--tokens 8192 --image-tokens 4096 --micro-batches {MICRO_BATCHES} --set dist.tp=T --set dist.pp=S` "
             f"(LLM FSDP full_shard, vision frozen, layers checkpointed, bf16; `python3 scripts/bench/pipeline_parallel.py`, "
             f"{started}). Every layout plans a step of {MICRO_BATCHES} micro-batches, so the step peaks hold "
             "8 micro-batches' inputs and differ from section 17's one-micro-batch ones. With pp: the largest "
             "stage's parameters, persistent bytes and step peak (stage s keeps min(pp - s, 8) micro-batches' "
             "activations), the largest stage's traffic. Traffic per rank and step: DDP / FSDP (gathered again "
             "for every micro-batch), tp group bytes, pipeline sends (B x L x d x 2 B per micro-batch and link "
             "direction) and a tied head's gradient sum, each counted within a node or across nodes "
             f"({NODE} ranks per node). GiB except parameters.", "",
             "| model | world | layout | params / rank | persistent / rank | step peak / rank | bubble | "
             "inter-node bytes / step | intra-node bytes / step |", "|---|---|---|---|---|---|---|---|---|"]
    for preset, world, tp, pp in LAYOUTS:
        j = plan(a.build, preset, world, tp, pp)
        params, persistent, peak, intra, inter, bubble = pipeline_row(j, world) if pp > 1 else flat_row(j)
        lines.append(f"| {preset} | {world} | {layout_name(world, tp, pp)} | {params / 1e9:.2f}B | {persistent / g:.2f} | "
                     f"{peak / g:.2f} | {100 * bubble:.1f}% | {inter / g:.2f} | {intra / g:.2f} |")
    text = "\n".join(lines) + "\n"
    if a.print:
        print(text)
        return
    write_section(TITLE, text, os.path.join(ROOT, "bench", "RESULTS.md"))
    print(text)


if __name__ == "__main__":
    main()
