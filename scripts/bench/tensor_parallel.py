#!/usr/bin/env python3
"""Tensor parallelism (dist.tp) on the CPU: the step time of tp 2 against world 1 through the
vlmtrain binary, and the plan's memory and traffic per rank for 7B / 32B / 72B layouts against
FSDP alone.

Step time: `vlmtrain launch --nproc-per-node N train recipes/ocr_tiny.toml` on the built-in
synthetic OCR data (rendered into runs/synth_ocr on first use; --preset, default `small`), N = 1 (tp 1) and N = 2 (tp 2, one
data-parallel group: both ranks run the same micro-batches), one thread per rank, the median
step_s of metrics.jsonl after the first --skip steps. Reported: seconds per step and the
ratio; CPU seconds (N x step) against world 1's.

Plan: `vlmtrain plan recipes/ocr_qwen25.toml --preset P --world-size W --set dist.tp=T` at one
micro-batch of 8192 tokens (4096 image tokens), 8 GPUs per node.

Writes the section "## 17. Tensor parallelism" of bench/RESULTS.md (or prints it with --print).

  python3 scripts/bench/tensor_parallel.py [--build build] [--preset small] [--steps 12] [--print]
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
TITLE = "## 17. Tensor parallelism (dist.tp): CPU step time and planned memory / traffic per rank"


def train(build, tp, preset, steps, work):
    run_dir = os.path.join(work, f"tp{tp}")
    cmd = [os.path.join(build, "vlmtrain"), "launch", "--nproc-per-node", str(tp), "train",
           os.path.join(ROOT, "recipes", "ocr_tiny.toml"),
           "--set", f"model.preset={preset}", "--set", f"run.output_dir={run_dir}",
           "--set", f"schedule.steps={steps}", "--set", "schedule.warmup_steps=1",
           "--set", "checkpoint.every=0", "--set", "checkpoint.save_final=false",
           "--set", "eval.every=0", "--set", "eval.at_end=false", "--set", "data.eval=[]",
           "--set", "log.every=1", "--set", f"dist.tp={tp}", "--set", "batch.samples_per_rank=4"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"tensor_parallel.py: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "step_s" in j:
                rows.append(j)
    return rows


def plan(build, preset, world, tp):
    cmd = [os.path.join(build, "vlmtrain"), "plan", os.path.join(ROOT, "recipes", "ocr_qwen25.toml"), "--preset",
           preset, "--world-size", str(world), "--nproc-per-node", "8", "--tokens", "8192", "--image-tokens", "4096",
           "--set", f"dist.tp={tp}", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"tensor_parallel.py: {' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    ap.add_argument("--print", action="store_true")
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tp-bench-") as work:
        step = {}
        for tp in (1, 2):
            rows = train(a.build, tp, a.preset, a.steps, work)
            step[tp] = statistics.median(r["step_s"] for r in rows[a.skip:])
    g = 2**30
    layouts = [("qwen2.5-vl-7b", 8, 1), ("qwen2.5-vl-7b", 8, 4), ("qwen2.5-vl-32b", 16, 1), ("qwen2.5-vl-32b", 16, 8),
               ("qwen2.5-vl-72b", 32, 1), ("qwen2.5-vl-72b", 32, 8)]
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    lines = [TITLE, "",
             f"Step time: `vlmtrain launch --nproc-per-node N train recipes/ocr_tiny.toml` with `model.preset = "
             f"{a.preset}` on the synthetic OCR data, fp32, 4 samples a step, one thread per rank, median `step_s` of "
             f"steps {a.skip + 1}-{a.steps} (`python3 scripts/bench/tensor_parallel.py`; {started}, load {load}, "
             f"{time.time() - t0:.0f} s).", "",
             "| layout | s / step | vs world 1 | CPU seconds / step (ranks x s) | vs world 1 |", "|---|---|---|---|---|",
             f"| world 1 | {step[1]:.3f} | 1.00x | {step[1]:.3f} | 1.00x |",
             f"| tp 2 (world 2) | {step[2]:.3f} | {step[2] / step[1]:.2f}x | {2 * step[2]:.3f} | "
             f"{2 * step[2] / step[1]:.2f}x |", "",
             "On 2 CPU cores tp 2 splits each layer's matmuls between the ranks but adds the exchanges (all-gathers "
             "and reduce-scatters over Gloo), the replicated vision tower and the per-rank copies of the sequence; it buys memory per rank, "
             "not CPU speed.", "",
             "Plan: `vlmtrain plan recipes/ocr_qwen25.toml --preset P --world-size W --nproc-per-node 8 --tokens 8192 "
             "--image-tokens 4096 --set dist.tp=T` (LLM FSDP full_shard, vision frozen, layers checkpointed, bf16). "
             "GiB except parameters.", "",
             "| model | world | layout | params / rank | persistent / rank | gathered | step peak | "
             "inter-node bytes / step | NVLink bytes / micro-batch |", "|---|---|---|---|---|---|---|---|---|"]
    for preset, world, tp in layouts:
        j = plan(a.build, preset, world, tp)
        t = j.get("tensor_parallel", {})
        layout = f"tp {tp} x fsdp {world // tp}" if tp > 1 else f"fsdp {world}"
        nvlink = j["traffic"]["step_1mb"]["intra_node_bytes"] + t.get("bytes_per_micro_batch", 0)
        lines.append(f"| {preset} | {world} | {layout} | {t.get('params_per_rank', j['total_params']) / 1e9:.2f}B | "
                     f"{j['totals']['total_bytes'] / g:.2f} | {j['gathered_peak_bytes'] / g:.2f} | "
                     f"{j['step_peak']['total_bytes'] / g:.2f} | {j['traffic']['step_1mb']['inter_node_bytes'] / g:.2f} | "
                     f"{nvlink / g:.2f} |")
    text = "\n".join(lines) + "\n"
    if a.print:
        print(text)
        return
    write_section(TITLE, text, os.path.join(ROOT, "bench", "RESULTS.md"))
    print(text)


if __name__ == "__main__":
    main()
