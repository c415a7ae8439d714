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

Step time on the CPU (pp 2 against world 1) is a placeholder row until the trainer runs pp.

Writes the section "## 18. Pipeline parallelism" of bench/RESULTS.md (or prints it with --print).

  python3 scripts/bench/pipeline_parallel.py [--build build] [--print]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLE = "## 18. Pipeline parallelism (dist.pp): plan"
NODE = 8           # ranks per node
MICRO_BATCHES = 8  # per step, every layout
# (preset, world, tp, pp)
LAYOUTS = [("qwen2.5-vl-7b", 8, 1, 1), ("qwen2.5-vl-7b", 8, 4, 1), ("qwen2.5-vl-7b", 8, 1, 2),
           ("qwen2.5-vl-7b", 8, 4, 2),
           ("qwen2.5-vl-32b", 16, 1, 1), ("qwen2.5-vl-32b", 16, 8, 1), ("qwen2.5-vl-32b", 16, 1, 2),
           ("qwen2.5-vl-32b", 16, 8, 2),
           ("qwen2.5-vl-72b", 32, 1, 1), ("qwen2.5-vl-72b", 32, 8, 1), ("qwen2.5-vl-72b", 32, 1, 4),
           ("qwen2.5-vl-72b", 32, 8, 2)]


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
    ap.add_argument("--print", action="store_true")
    a = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    g = 2**30
    lines = [TITLE, "",
             "Step time on the CPU: pp 2 against world 1 through the binary, as section 17 does for tp 2.", "",
             "| layout | s / step | vs world 1 | CPU seconds / step (ranks x s) | vs world 1 |", "|---|---|---|---|---|",
             "| world 1 | _placeholder_ | 1.00x | _placeholder_ | 1.00x |",
             "| pp 2 (world 2) | _placeholder: filled once `vlmtrain train` runs dist.pp_ | | | |", "",
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
    path = os.path.join(ROOT, "bench", "RESULTS.md")
    body = open(path).read()
    if TITLE in body:
        start = body.index(TITLE)
        nxt = body.find("\n## ", start + len(TITLE))
        body = body[:start] + text + (body[nxt + 1:] if nxt >= 0 else "")
    elif "\n## Commands" in body:
        at = body.index("\n## Commands") + 1
        body = body[:at] + text + "\n" + body[at:]
    else:
        body = body.rstrip("\n") + "\n\n" + text
    with open(path, "w") as f:
        f.write(body)
    print(text)


if __name__ == "__main__":
    main()
