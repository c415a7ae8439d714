#!/usr/bin/env python3
"""Context parallelism (dist.cp, Ulysses and ring) on the CPU: peak tensor bytes per rank against
the sequence length at cp 1 / 2 / 4, measured and planned, and the step's CPU time summed over the
ranks against one process (the mode's overhead: the exchanges, the vision tower and the loss
head that every rank of the group runs whole).

Runs bench/context_parallel_bench under `vlmtrain launch --nproc-per-node CP --exec ...`
(world = cp, one thread per rank so that CPU seconds compare work, not the oversubscribed
2-core machine's scheduling), one JSON line per (length, cp), and writes the section
"## 16. Context parallelism" of bench/RESULTS.md (or prints it with --print).

  python3 scripts/bench/context_parallel.py [--build build] [--lengths 1000,2000,4000] [--cps 1,2,4]
                                            [--modes ulysses,ring]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

from results_section import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLE = "## 16. Context parallelism (dist.cp, Ulysses and ring): memory per rank and CPU overhead"


def run(build, cp, text, reps, preset, mode):
    cmd = [os.path.join(build, "vlmtrain"), "launch", "--nproc-per-node", str(cp), "--exec",
           os.path.join(build, "bench", "context_parallel_bench"), "--cp", str(cp), "--text", str(text),
           "--reps", str(reps), "--preset", preset, "--mode", mode]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"context_parallel.py: {' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    for line in out.stdout.splitlines():
        m = re.match(r"\[rank 0\] (\{.*\})$", line)
        if m:
            return json.loads(m.group(1))
    sys.exit(f"context_parallel.py: no result line from {' '.join(cmd)}:\n{out.stdout}")


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def section(rows, preset, started, seconds):
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    lines = [TITLE, "",
             f"`bench/context_parallel_bench` ({preset} preset, fp32, DDP, one row of text around one 64-token image, "
             "right-padded; world = cp, one data-parallel group, one thread per rank), launched by "
             "`vlmtrain launch --exec`; 3 measured steps after a warm-up. Peak: rank 0's CPU tensor bytes over a step "
             "(vlm/runtime/tensor_memory.h) and the step plan's (app/plan/step_memory.h, shape.cp). CPU s: user + system "
             "seconds of one step summed over the ranks (median), against cp 1 at the same length: the work the split "
             "adds (the exchanges' copies and Gloo, the vision tower and the loss head run whole on every rank; ring: "
             "the blocks' fp32 math). All-to-all: rank 0's bytes per step (the formulas of "
             "sharding/parallel/context_parallel.h, ring's hops included; checked to the byte in "
             "sharding_context_parallel_dist_test and sharding_context_parallel_ring_dist_test). Command: `python3 scripts/bench/context_parallel.py` "
             "(not part of scripts/bench.sh).", "",
             "| tokens | cp | mode | measured peak | planned | planned / measured | CPU s per step (all ranks) | "
             "vs cp 1 | all-to-all per step |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {r["seq_len"]: r["cpu_s_all_ranks"] for r in rows if r["cp"] == 1}
    for r in rows:
        ratio = r["cpu_s_all_ranks"] / base[r["seq_len"]] if r["seq_len"] in base else float("nan")
        lines.append(f"| {r['seq_len']} | {r['cp']} | {r.get('mode', '-')} | {mib(r['measured_peak_bytes'])} | "
                     f"{mib(r['planned_peak_bytes'])} | {r['planned_peak_bytes'] / r['measured_peak_bytes']:.3f} | "
                     f"{r['cpu_s_all_ranks']:.2f} | {ratio:.2f}x | {mib(r['all_to_all_bytes'])} |")
    lines += ["", f"_(section run at {started} UTC in {seconds:.0f} s, load average then {load})_", ""]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--lengths", default="1000,2000,4000", help="text tokens per row (plus 66 image and vision tokens)")
    ap.add_argument("--cps", default="1,2,4")
    ap.add_argument("--modes", default="ulysses,ring", help="cp_mode of the cp > 1 runs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--print", action="store_true", help="print the section instead of writing bench/RESULTS.md")
    a = ap.parse_args()
    started = time.strftime("%H:%M", time.gmtime())
    t0 = time.time()
    rows = []
    for text in [int(x) for x in a.lengths.split(",")]:
        for cp in [int(x) for x in a.cps.split(",")]:
            for mode in (a.modes.split(",") if cp > 1 else ["ulysses"]):
                r = run(a.build, cp, text, a.reps, a.preset, mode)
                print(json.dumps(r), file=sys.stderr)
                rows.append(r)
    text = section(rows, a.preset, started, time.time() - t0)
    if a.print:
        print(text)
    else:
        write_section(TITLE, text, os.path.join(ROOT, "bench", "RESULTS.md"))
        print(text)


if __name__ == "__main__":
    main()
