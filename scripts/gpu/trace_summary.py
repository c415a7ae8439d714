#!/usr/bin/env python3
"""Where a profiled step's time goes: a Kineto (torch profiler) Chrome trace written by
`step_bench --profile FILE`, summarised as markdown.

    python3 scripts/gpu/trace_summary.py TRACE_JSON [--top 15]

Steps are the trace's "vlmtrain_step" user annotations. Per step: wall time (annotation
span), GPU busy time (union of kernel, memcpy and memset intervals) and idle time (wall
minus busy: launch overhead, host work, synchronisation), and the GPU time by kind of kernel
(GEMM, attention, NCCL, elementwise, reduction / norm, optimizer, copies, other), then the
top kernels by total time. Kernel kinds are read off the kernel names (cuBLAS / CUTLASS /
nvjet GEMMs, flash / fmha / efficient attention, ...); the names are what CUDA reports.
On a CPU-only trace (no GPU events) it reports the CPU operators instead.
"""
import argparse
import collections
import json
import re
import sys

KINDS = [
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|cublas|sm\d+_.*(tn|nt|nn|tt)", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|efficient", re.I)),
    ("nccl", re.compile(r"nccl", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("reduction / norm", re.compile(r"reduce|norm|softmax|sum_|mean|cross_entropy|nll|logsumexp", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|copy|cat|index|fill|where|mul|add", re.I)),
]


def kind_of(name, cat):
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "copies / memset"
    for k, rx in KINDS:
        if rx.search(name):
            return k
    return "other"


def union_length(intervals):
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    ev = json.load(open(a.trace))
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    steps = [e for e in ev if e.get("ph") == "X" and e.get("name") == "vlmtrain_step"]
    gpu = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not steps:
        print("no vlmtrain_step annotation in the trace")
        return 1
    n = len(steps)
    wall = sum(s["dur"] for s in steps) / n
    print(f"# Profile of {n} step(s): {a.trace}\n")
    if not gpu:
        ops = collections.Counter()
        for e in ev:
            if e.get("ph") == "X" and e.get("cat") == "cpu_op":
                ops[e["name"]] += e["dur"]
        print(f"CPU-only trace: {wall / 1e3:.1f} ms per step. Top operators (inclusive time per step):\n")
        print("| operator | ms per step |\n|---|---|")
        for name, d in ops.most_common(a.top):
            print(f"| `{name[:90]}` | {d / n / 1e3:.2f} |")
        return 0
    lo, hi = min(s["ts"] for s in steps), max(s["ts"] + s["dur"] for s in steps)
    gpu = [e for e in gpu if e["ts"] < hi + 5e5]  # kernels launched in a step may end after it
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in gpu]) / n
    span = (max(e["ts"] + e["dur"] for e in gpu) - lo) / n
    by_kind, by_name, count = collections.Counter(), collections.Counter(), collections.Counter()
    for e in gpu:
        by_kind[kind_of(e["name"], e["cat"])] += e["dur"]
        by_name[e["name"]] += e["dur"]
        count[e["name"]] += 1
    total = sum(by_kind.values())
    print(f"per step: wall {wall / 1e3:.1f} ms (annotation), GPU timeline {span / 1e3:.1f} ms, GPU busy "
          f"{busy / 1e3:.1f} ms ({100 * busy / span:.1f}% of the timeline), idle {(span - busy) / 1e3:.1f} ms; "
          f"{len(gpu) / n:.0f} GPU activities\n")
    print("| kind | ms per step | share of GPU time |\n|---|---|---|")
    for k, d in by_kind.most_common():
        print(f"| {k} | {d / n / 1e3:.2f} | {100 * d / total:.1f}% |")
    print(f"\nTop {a.top} kernels:\n\n| kernel | calls per step | ms per step | share |\n|---|---|---|---|")
    for name, d in by_name.most_common(a.top):
        print(f"| `{name[:100]}` | {count[name] / n:.0f} | {d / n / 1e3:.2f} | {100 * d / total:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
