#!/usr/bin/env python3
"""Where the world-1 training step spends its CPU, vlmtrain vs HF transformers (issue #30
item 1 row (a), the gap of RESULTS.md section 6). Same setup as scripts/bench_hf_step.py
(the same HF directory, dumped micro-batches, 2 threads, checkpointing off), each side
profiled with `perf record -F FREQ -p PID` attached after start-up (vlmtrain: once its first
step is in metrics.jsonl; HF: after model load and one warm-up step), over the steps that
follow. Prints CPU seconds per step by category (from the sample counts: samples / FREQ /
steps) and the top symbols of each side.

    .venv/bin/python scripts/bench/profile_hf_step.py --model HF_DIR --data SYNTH_DIR [--steps 12]

Needs perf (linux-perf) and perf_event_paranoid <= 2 for the user's own processes.
"""
import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_hf_step as one  # noqa: E402

CATEGORIES = [  # first match wins, on "dso symbol"
    ("GEMM (BLAS / oneDNN kernels)", r"sgemm|gemm|mkl_blas|dnnl|brgemm|jit_avx|mkl_|blas|kernel_8x|jit_uni"),
    ("OpenMP runtime (spin / barrier)", r"libgomp|gomp_|__kmp|libiomp|omp_"),
    ("memcpy / memset", r"memcpy|memmove|memset|__memcpy|__memset"),
    ("malloc / free", r"malloc|_int_free|cfree|free$|_int_memalign|sysmalloc|tcache|arena"),
    ("Linux kernel", r"\[kernel|\[unknown\].*0xffff"),
    ("Python interpreter", r"libpython|python3\.11 |_PyEval|PyObject"),
    ("ATen / autograd (other ops, dispatch)", r"libtorch|libc10|at::|c10::|torch::"),
]


def categorize(dso, sym):
    s = f"{dso} {sym}"
    for name, rx in CATEGORIES:
        if re.search(rx, s):
            return name
    return "other (" + os.path.basename(dso) + ")"


def perf_attach(pid, out, freq):
    return subprocess.Popen(["perf", "record", "-F", str(freq), "-p", str(pid), "-o", out, "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def report(path):
    p = subprocess.run(["perf", "report", "-i", path, "--stdio", "--no-children", "-F", "sample,dso,sym",
                        "--sort", "dso,sym", "-q"], capture_output=True, text=True)
    rows = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[[.kug]\]\s+(.*)", line)
        if m:
            rows.append((int(m.group(1)), m.group(2), m.group(3).strip()))
    return sorted(rows, reverse=True)  # most samples first


def profile_vlmtrain(a, work):
    """vlmtrain train (bench_hf_step's recipe) with perf attached once step 1 is in metrics.jsonl:
    steps 2..N are profiled (and the process's exit)."""
    import threading
    out_dir = os.path.join(work, "vlmtrain")
    data = os.path.join(work, "vlmtrain.perf")

    def watch():
        metrics = os.path.join(out_dir, "metrics.jsonl")
        while not (os.path.exists(metrics) and open(metrics).read().count("step_s") >= 1):
            time.sleep(0.02)
        pid = subprocess.run(["pgrep", "-n", "-f", f"{a.vlmtrain} train"], capture_output=True,
                             text=True).stdout.split()[0]
        watch.perf = perf_attach(pid, data, a.freq)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    rows = one.vlmtrain_run(a, out_dir, ckpt=False)
    t.join()
    watch.perf.wait()
    return data, [r["step_s"] for r in rows[1:]]


def profile_hf(a, work, batches):
    """HF replay with perf attached to this process from the start but enabled (through its control
    fifo) at the first forward of step 2: steps 2..N are profiled."""
    import torch
    import hf_train_reference as ref
    data, ctl = os.path.join(work, "hf.perf"), os.path.join(work, "perf.ctl")
    if os.path.exists(ctl):
        os.unlink(ctl)
    os.mkfifo(ctl)
    torch.set_num_threads(a.threads)
    perf = subprocess.Popen(["perf", "record", "-F", str(a.freq), "-p", str(os.getpid()), "-o", data, "-q", "-D", "-1",
                             "--control", f"fifo:{ctl}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fifo = open(ctl, "w")
    first_step_mbs = len(batches[0])
    orig, calls = ref.forward_loss, [0]

    def forward_loss(*args, **kw):
        if calls[0] == first_step_mbs:
            fifo.write("enable\n")
            fifo.flush()
        calls[0] += 1
        return orig(*args, **kw)

    ref.forward_loss = forward_loss
    steps = one.hf_run(a, batches, False)
    ref.forward_loss = orig
    perf.send_signal(signal.SIGINT)
    perf.wait()
    fifo.close()
    return data, [s["step_s"] for s in steps[1:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--vlmtrain", default=os.path.join(one.ROOT, "build", "vlmtrain"))
    ap.add_argument("--work", default="/tmp/profile_hf_step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--freq", type=int, default=999)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="JSON of the categories and top symbols")
    a = ap.parse_args()
    for k, v in dict(samples=4, max_tokens=2048, lr=2e-3, vit_lr=2e-4, weight_decay=0.01, grad_clip=1.0, warmup=2,
                     min_lr_ratio=0.1, attn="sdpa").items():
        setattr(a, k, v)
    os.makedirs(a.work, exist_ok=True)
    import hf_train_reference as ref
    dump = os.path.join(a.work, "batches")
    subprocess.run(["rm", "-rf", dump], check=True)
    one.vlmtrain_run(a, os.path.join(a.work, "dump-run"), ckpt=False, dump=dump)
    batches = [ref.load_step(dump, s) for s in range(1, a.steps + 1)]
    load0 = one.loadavg()
    vdata, vsteps = profile_vlmtrain(a, a.work)
    hdata, hsteps = profile_hf(a, a.work, batches)
    result = {"loadavg": [load0, one.loadavg()], "threads": a.threads, "freq": a.freq}
    for side, data, steps, n in (("vlmtrain", vdata, vsteps, len(vsteps)), ("hf", hdata, hsteps, len(hsteps))):
        rows = report(data)
        total = sum(r[0] for r in rows)
        cats = collections.Counter()
        for cnt, dso, sym in rows:
            cats[categorize(dso, sym)] += cnt
        result[side] = {"steps_profiled": n, "median_step_s": sorted(steps)[len(steps) // 2],
                        "cpu_s_per_step": total / a.freq / n,
                        "categories_cpu_s_per_step": {k: v / a.freq / n for k, v in cats.most_common()},
                        "top": [(cnt / a.freq / n, dso, sym) for cnt, dso, sym in rows[:a.top]]}
    for side in ("vlmtrain", "hf"):
        r = result[side]
        print(f"\n{side}: {r['steps_profiled']} steps, median {r['median_step_s']:.3f} s/step, "
              f"{r['cpu_s_per_step']:.3f} CPU s/step sampled")
        for k, v in r["categories_cpu_s_per_step"].items():
            print(f"  {v:7.3f}  {k}")
        for s, dso, sym in r["top"]:
            print(f"    {s:7.4f}  {os.path.basename(dso):28s} {sym[:110]}")
    print(f"\nloadavg {result['loadavg']}")
    if a.out:
        json.dump(result, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
