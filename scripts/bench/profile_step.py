#!/usr/bin/env python3
"""Where a training step's CPU time goes, vlmtrain vs HF transformers, by phase and by kind of
work (issue #30 item 1, rows (a) and (b): the misses of bench/RESULTS.md; bench/notes/profile_step.md).

Same setup as scripts/bench_hf_step.py (world 1) and scripts/bench_hf_dist.py (world 2, DDP):
the same HF directory, the micro-batches vlmtrain dumps (HF replays them), the same threads.
Each side runs under `perf record -k CLOCK_MONOTONIC --call-graph dwarf` (all its processes
and threads); only samples inside a window of whole steps count: steps 2..N-1, from the end
of step 1 to the end of step N-1 (vlmtrain: the times its metrics.jsonl rows appear, rank 0;
HF: the end of each step's zero_grad, per rank).

Phase of a sample (forward, backward, recompute, clip, optimizer, other), from time stamps,
per process: HF from the intervals of forward_loss, Tensor.backward, clip_grad_norm_, AdamW.step
+ zero_grad, and of the function each checkpointed layer hands torch.utils.checkpoint (run
again inside backward: recompute), all wrapped here, the scripts' own loops unchanged;
vlmtrain from uprobes (`perf probe`, removed again after the run) at the entries of
Qwen2VLImpl::forward, torch::autograd::backward, the checkpoint node's apply (recompute),
torch::autograd::grad (back to backward), ShardedAdamW::clip_grad_norm / step / zero_grad.
Kind of work: from the leaf symbol and the stack (GEMM, SDPA attention, ATen elementwise
kernels, dispatch/autograd bookkeeping, malloc/free, page faults, Python, communication;
KINDS below). Both sides run with OMP_WAIT_POLICY=PASSIVE (--omp-wait): perf's own CPU use
would otherwise make spinning OpenMP threads wait for a descheduled sibling (HF's step then
collapses, bench/notes/hf_step.md). Reported in CPU ms per step and rank (samples / freq /
steps / ranks), and wall ms per phase; --summarize makes the tables of several runs.

  .venv/bin/python scripts/bench/profile_step.py --model HF_DIR --data SYNTH_DIR --world 1 --ckpt 0
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_hf_step as one  # noqa: E402
import bench_hf_dist as hfd  # noqa: E402

PHASES = ["forward", "backward", "recompute", "clip", "optimizer", "other"]
KINDS = [  # (name, where, regex); where = leaf | stack | dso | kstack (kernel leaf, stack matches); first wins
    ("comm", "stack", r"gloo::|c10d::|ShmChannel|shm_channel|vlm::sharding::Comm|DdpReducer|reduce_bytes"
     r"|tcp_sendmsg|tcp_recvmsg|sock_sendmsg|sock_recvmsg|__libc_recv|__libc_send"),
    ("attention (SDPA, its GEMMs included)", "stack", r"flash_attention|scaled_dot_product|_efficient_attention|math_sdp"),
    ("GEMM (MKL / oneDNN)", "leaf", r"sgemm|gemm|mkl_blas|dnnl|brgemm|jit_avx|jit_uni"),
    ("thread pools (OpenMP, OpenBLAS)", "dso", r"libgomp|libiomp|libopenblas|libscipy_openblas"),
    ("ATen kernels (elementwise, reductions, copies)", "leaf",
     r"at::native|at::vec|Vectorized|cpu_kernel|vectorized_loop|function_ref<.*callback_fn|mkl_vml|serial_for_each|Sleef_"),
    ("memcpy / memset", "leaf", r"memcpy|memmove|memset"),
    ("allocator (malloc/free, page release)", "leaf",
     r"^(malloc|free|cfree|_int_|__libc_(malloc|free|calloc|realloc|memalign)|sysmalloc|tcache|unlink_chunk"
     r"|malloc_consolidate|c10::alloc_cpu|c10::free_cpu|.*TensorMemoryMeter|.*DefaultCPUAllocator)"),
    ("allocator (malloc/free, page release)", "kstack",
     r"^(malloc|free|cfree|_int_|__libc_(malloc|free|calloc|realloc|memalign)|__GI___libc_free|__GI_munmap|__munmap"
     r"|sysmalloc|c10::alloc_cpu|c10::free_cpu)"),
    ("Linux kernel: page faults", "kstack", r"exc_page_fault|handle_mm_fault|do_anonymous_page|clear_page"),
    ("Linux kernel: scheduler, futex, other", "dso", r"kernel\.kallsyms|\[unknown\]"),
    ("Python interpreter (GC included)", "dso", r"libpython|/bin/python"),
    ("dispatch / autograd / tensor bookkeeping", "dso", r"libtorch|libc10"),
    ("vlmtrain's own code", "dso", r"vlmtrain$"),
]


# ---------------------------------------------------------------- HF side, instrumented
def instrument(log):
    """Wraps the calls the scripts' HF loops make, appending (t0, t1, phase) to log."""
    import torch
    import hf_train_reference as ref

    def wrap(obj, name, phase):
        orig = getattr(obj, name)

        def w(*args, **kw):
            t0 = time.monotonic()
            try:
                return orig(*args, **kw)
            finally:
                log.append((t0, time.monotonic(), phase))
        setattr(obj, name, w)
    wrap(ref, "forward_loss", "forward")
    wrap(torch.Tensor, "backward", "backward")
    wrap(torch.nn.utils, "clip_grad_norm_", "clip")
    wrap(torch.optim.AdamW, "step", "optimizer")
    wrap(torch.optim.Optimizer, "zero_grad", "zero_grad")
    # The function each checkpointed layer hands torch.utils.checkpoint, timed: called again
    # inside backward, it is the recompute. (Wrapping the layer classes' forward instead
    # would turn HF's checkpointing off: GradientCheckpointingLayer checks its own wrapper.)
    import transformers.modeling_utils as mu
    checkpoint = mu.checkpoint

    def timed_checkpoint(fn, *args, **kw):
        def timed(*a, **k):
            t0 = time.monotonic()
            try:
                return fn(*a, **k)
            finally:
                log.append((t0, time.monotonic(), "layer"))
        return checkpoint(timed, *args, **kw)
    mu.checkpoint = timed_checkpoint


def hf_worker(a):
    """One HF process: world 1 runs bench_hf_step.hf_run, world 2 one rank of bench_hf_dist."""
    log = []
    instrument(log)
    if a.world == 1:
        import torch
        import hf_train_reference as ref
        torch.set_num_threads(a.threads)
        batches = [ref.load_step(a.dump, s) for s in range(1, a.steps + 1)]
        steps = one.hf_run(a, batches, a.ckpt)
    else:
        a.result = os.path.join(a.work, "hf_dist_result.json")
        a.mode = "ddp"
        hfd.hf_worker(a)
        steps = json.load(open(a.result))["steps"] if os.environ["RANK"] == "0" else []
    rank = os.environ.get("RANK", "0")
    with open(os.path.join(a.work, f"hf_log.rank-{rank}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "log": log, "steps": steps}, f)


def hf_side(a):
    """The HF command perf records: world 1 one process, world 2 one per rank (Gloo)."""
    me = [sys.executable, os.path.abspath(__file__)] + a.argv + ["--hf-worker"]
    if a.world == 1:
        return subprocess.run(me, check=True)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(me, env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), LOCAL_RANK=str(r),
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                           OMP_NUM_THREADS=str(a.threads))) for r in range(a.world)]
    if any(p.wait() for p in procs):
        sys.exit("HF worker failed")


# ---------------------------------------------------------------- recording
# vlmtrain's phases come from uprobes at these functions' entries (perf probe, by address):
# each starts a phase that lasts until the next one starts, per process.
VLM_PROBES = [  # (event, library: vlmtrain | torch, mangled-name regex, phase)
    ("vfwd", "vlmtrain", r"^_ZN3vlm11Qwen2VLImpl7forwardERKNS_5BatchEb$", "forward"),
    ("tbwd", "torch", r"^_ZN5torch8autograd8backwardERKSt6vector", "backward"),
    ("vrec", "vlmtrain", r"^_ZN5torch8autograd7CppNodeIN3vlm8sharding12_GLOBAL__N_118CheckpointFunctionEE5applyE", "recompute"),
    ("tgrad", "torch", r"^_ZN5torch8autograd4gradERKSt6vector", "backward"),
    ("vclip", "vlmtrain", r"^_ZN3vlm8sharding12ShardedAdamW14clip_grad_normE", "clip"),
    ("vstep", "vlmtrain", r"^_ZN3vlm8sharding12ShardedAdamW4stepE", "optimizer"),
    ("vzero", "vlmtrain", r"^_ZN3vlm8sharding12ShardedAdamW9zero_gradEv$", "optimizer"),
]


def add_probes(a):
    """Creates VLM_PROBES (perf probe -x LIB -a NAME=0xADDR); returns perf record's -e list."""
    import torch
    libs = {"vlmtrain": os.path.realpath(a.vlmtrain),
            "torch": os.path.realpath(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))}
    del_probes()
    events = []
    for ev, lib, rx, _ in VLM_PROBES:
        nm = subprocess.run(["nm", "-D" if lib == "torch" else "-a", libs[lib]], capture_output=True, text=True).stdout
        addrs = [l.split()[0] for l in nm.splitlines() if len(l.split()) == 3 and l.split()[1] in "Tt"
                 and re.search(rx, l.split()[2]) and ".cold" not in l]
        if len(addrs) != 1:
            sys.exit(f"probe {ev}: {len(addrs)} symbols match {rx} in {libs[lib]}")
        subprocess.run(["perf", "probe", "-q", "-x", libs[lib], "-a", f"{ev}=0x{addrs[0]}"], check=True)
        group = "probe_" + re.sub(r"[^A-Za-z0-9_]", "_", os.path.basename(libs[lib]).split(".")[0])
        events += ["-e", f"{group}:{ev}"]
    return events


def del_probes():
    for ev, *_ in VLM_PROBES:
        subprocess.run(["perf", "probe", "-q", "-d", f"*:{ev}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_cmd(a, data, events=()):
    if a.switch_stacks:  # where main threads block: a stack at every context switch
        events = [*events, "-e", "sched:sched_switch"]
    return ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "--switch-events", "--call-graph", f"dwarf,{a.stack}",
            "-e", f"cpu-clock/freq={a.freq}/", *events, "-o", data, "--"]


def record_vlmtrain(a):
    out_dir = os.path.join(a.work, "vlmtrain")
    head = [a.vlmtrain, "train"] if a.world == 1 else [a.vlmtrain, "launch", "--nproc-per-node", str(a.world), "train"]
    sets = one.vlmtrain_sets(a, out_dir, a.ckpt) + ["sharding.default=ddp"]
    argv, env = one.vlmtrain_command(a, head, sets, out_dir)
    data = os.path.join(a.work, "vlmtrain.perf")
    metrics = os.path.join(out_dir, "metrics.jsonl")
    events = add_probes(a)
    p = subprocess.Popen(perf_cmd(a, data, events) + argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen, times = 0, []
    while p.poll() is None:
        if os.path.exists(metrics):
            n = open(metrics).read().count('"step_s"')
            if n > seen:
                times += [time.monotonic()] * (n - seen)
                seen = n
        time.sleep(0.005)
    del_probes()
    if p.returncode != 0 or seen != a.steps:
        sys.exit(f"vlmtrain under perf failed (rc {p.returncode}, {seen} steps)")
    rows = [json.loads(l) for l in open(metrics) if '"step_s"' in l]
    # Step k's row appears when step k ends (log.every = 1): window = steps 2 .. N-1.
    return data, {"all": (times[0], times[a.steps - 2])}, [r["step_s"] for r in rows[1:]], a.steps - 2


def record_hf(a):
    data = os.path.join(a.work, "hf.perf")
    argv = [sys.executable, os.path.abspath(__file__)] + a.argv + ["--hf-side"]
    subprocess.run(perf_cmd(a, data) + argv, check=True, stdout=subprocess.DEVNULL)
    windows, intervals, step_s = {}, {}, []
    for r in range(a.world):
        j = json.load(open(os.path.join(a.work, f"hf_log.rank-{r}.json")))
        ends = sorted(t1 for t0, t1, ph in j["log"] if ph == "zero_grad")
        windows[j["pid"]] = (ends[0], ends[a.steps - 2])
        intervals[j["pid"]] = sorted((t0, t1, "optimizer" if ph == "zero_grad" else ph) for t0, t1, ph in j["log"])
        step_s += [s["step_s"] for s in j["steps"][1:]]
    return data, windows, step_s, a.steps - 2, intervals


# ---------------------------------------------------------------- analysis
def samples(data, switches=None):
    """perf script -> [(pid, tid, t, event, [(sym, dso), ...] leaf first)]; context switches
    (--switch-events) appended to `switches` as (pid, tid, t, "IN" | "OUT" | "OUT preempt")."""
    p = subprocess.run(["perf", "script", "--no-inline", "--show-switch-events", "-i", data, "-F",
                        "event,pid,tid,time,ip,sym,dso"], capture_output=True, text=True)
    out, cur = [], None
    for line in p.stdout.splitlines():
        if not line.strip():
            continue
        m = re.match(r"\s*(\d+)/(\d+)\s+([\d.]+):\s+PERF_RECORD_SWITCH\s+(IN|OUT)(\s+preempt)?", line)
        if m:
            if switches is not None:
                switches.append((int(m.group(1)), int(m.group(2)), float(m.group(3)), m.group(4) + (m.group(5) or "")))
            cur = None
            continue
        if line[0] == "\t":
            m = re.match(r"\s*[0-9a-f]+\s+(.*)\s+\(([^()]*)\)\s*$", line)
            if m and cur is not None:
                cur[4].append((re.sub(r"\+0x[0-9a-f]+$", "", m.group(1)), m.group(2)))
            continue
        m = re.match(r"\s*(\d+)/(\d+)\s+([\d.]+):\s+(\S+?):?\s", line + " ")
        if m:
            cur = (int(m.group(1)), int(m.group(2)), float(m.group(3)), m.group(4).split("/")[0].split(":")[-1], [])
            out.append(cur)
    return out


def kind_of(frames):
    if not frames:
        return "other"
    leaf_sym, leaf_dso = frames[0]
    for name, where, rx in KINDS:
        if where == "leaf" and re.search(rx, leaf_sym):
            return name
        if where == "dso" and re.search(rx, leaf_dso):
            return name
        if where == "stack" and any(re.search(rx, s) for s, _ in frames):
            return name
        if where == "kstack" and "kernel" in leaf_dso and any(re.search(rx, s) for s, _ in frames):
            return name
    return "other"


def phase_at(marks, t):
    """marks: sorted [(t0, phase)]; the phase started last before t."""
    import bisect
    i = bisect.bisect_right([m[0] for m in marks], t) - 1
    return marks[i][1] if i >= 0 else "other"


def hf_phase(iv, t):
    inside = [p for t0, t1, p in iv if t0 <= t < t1]
    if "backward" in inside:
        return "recompute" if "layer" in inside else "backward"
    for p in ("forward", "clip", "optimizer"):
        if p in inside:
            return p
    return "other"


def analyse(side, data, windows, steps, ranks, intervals=None):
    switches = []
    rows = samples(data, switches)
    marks = collections.defaultdict(list)  # vlmtrain: pid -> [(t, phase)] from the probes
    phase_of_event = {ev: ph for ev, _, _, ph in VLM_PROBES}
    for pid, tid, t, ev, fr in rows:
        if ev in phase_of_event:
            marks[pid].append((t, phase_of_event[ev]))
    table = collections.defaultdict(collections.Counter)
    top = collections.defaultdict(collections.Counter)  # kind -> leaf symbol -> samples
    main_thread = collections.Counter()  # phase -> samples on the processes' main threads
    n = 0
    for pid, tid, t, ev, fr in rows:
        w = windows.get(pid, windows.get("all"))
        if ev != "cpu-clock" or not w or not w[0] <= t < w[1]:
            continue
        n += 1
        ph = hf_phase(intervals.get(pid, []), t) if side == "hf" else phase_at(sorted(marks[pid]), t)
        k = kind_of(fr)
        table[ph][k] += 1
        top[k][(fr[0][0][:100] if fr else "?")] += 1
        if tid == pid:
            main_thread[ph] += 1
    # Wall time per phase (ms per step and rank): the window cut at every phase change.
    wall = collections.Counter()
    for pid, w in ((p, windows.get(p, windows.get("all"))) for p in (intervals or marks) if (intervals or marks)[p]):
        if side == "hf":
            cuts = sorted({w[0], w[1], *[x for t0, t1, _ in intervals[pid] for x in (t0, t1) if w[0] < x < w[1]]})
            segs = [(t0, t1, hf_phase(intervals[pid], (t0 + t1) / 2)) for t0, t1 in zip(cuts, cuts[1:])]
        else:
            m = sorted(marks[pid])
            cuts = sorted({w[0], w[1], *[t for t, _ in m if w[0] < t < w[1]]})
            segs = [(t0, t1, phase_at(m, t0)) for t0, t1 in zip(cuts, cuts[1:])]
        for t0, t1, ph in segs:
            wall[ph] += (t1 - t0) * 1000.0 / steps / ranks
    # Main threads off the CPU, per phase of the moment they left it: blocked (waiting: a
    # peer, a lock, the OpenMP pool) or preempted (runnable, another task had the core).
    off = collections.defaultdict(collections.Counter)
    sites = collections.defaultdict(collections.Counter)  # phase -> where a main thread blocked -> ms
    sw_stacks = collections.defaultdict(list)  # tid -> [(t, frames)] of sched:sched_switch (--switch-stacks)
    for pid, tid, t, ev, fr in rows:
        if ev == "sched_switch":
            sw_stacks[tid].append((t, fr))

    def site(tid, t0):
        import bisect
        lst = sw_stacks.get(tid, [])
        i = bisect.bisect_left(lst, (t0 - 1e-4,))
        if i < len(lst) and abs(lst[i][0] - t0) < 1e-4:
            user = [f"{sym} ({os.path.basename(dso)})" for sym, dso in lst[i][1] if "kernel" not in dso]
            skip = r"^(__|futex|syscall|pthread_|std::|do_futex|gomp_mutex|\[unknown\])"
            named = [u for u in user if not re.match(skip, u)]
            return " < ".join((named or user or ["?"])[:3])[:160]
        return None
    last_out = {}
    for pid, tid, t, what in sorted(switches, key=lambda x: x[2]):
        w = windows.get(pid, windows.get("all"))
        if tid != pid or not w or not (intervals or marks).get(pid):  # ranks only (not vlmtrain's launcher)
            continue
        if what.startswith("OUT"):
            last_out[tid] = (t, "preempted" if what.endswith("preempt") else "blocked")
        elif tid in last_out:
            t0, how = last_out.pop(tid)
            if w[0] <= t0 < w[1]:
                ph = hf_phase(intervals.get(pid, []), t0) if side == "hf" else phase_at(sorted(marks[pid]), t0)
                off[ph][how] += (min(t, w[1]) - t0) * 1000.0 / steps / ranks
                where = site(tid, t0) if how == "blocked" else None
                if where:
                    sites[ph][where] += (min(t, w[1]) - t0) * 1000.0 / steps / ranks
    return {"samples": n, "steps": steps, "ranks": ranks, "probes": sum(len(v) for v in marks.values()),
            "offcpu_ms": {ph: dict(c) for ph, c in off.items()},
            "blocked_sites_ms": {ph: c.most_common(6) for ph, c in sites.items()},
            "wall_ms": dict(wall),
            "table": {ph: dict(c) for ph, c in table.items()},
            "main_thread": dict(main_thread), "top": {k: c.most_common(12) for k, c in top.items()}}


def render(res, freq):
    lines = []
    for side in ("vlmtrain", "hf"):
        r = res[side]
        norm = 1000.0 / freq / r["steps"] / r["ranks"]  # CPU ms per step and rank
        total = sum(sum(c.values()) for c in r["table"].values())
        lines.append(f"\n{side}: {r['steps']} steps x {r['ranks']} rank(s), median step {r['median_step_s']:.3f} s, "
                     f"{total * norm:.0f} CPU ms/step/rank sampled")
        kinds = collections.Counter()
        for ph in PHASES:
            c = r["table"].get(ph, {})
            if not c:
                continue
            s = sum(c.values())
            lines.append(f"  {ph:10s} {s * norm:7.1f} ms {100 * s / total:5.1f}% "
                         f"(main thread {r['main_thread'].get(ph, 0) * norm:5.1f})  " +
                         ", ".join(f"{k.split(' (')[0]} {v * norm:.0f}" for k, v in sorted(c.items(), key=lambda x: -x[1])))
            kinds.update(c)
        lines.append("  by kind: " + ", ".join(f"{k} {v * norm:.0f} ms ({100 * v / total:.0f}%)"
                                               for k, v in kinds.most_common()))
    return "\n".join(lines)


def summarize(paths):
    """Markdown tables from several --out files of one configuration: the mean over the runs of
    CPU ms per step and rank, by phase and by kind, both sides; the range of the totals."""
    runs = [json.load(open(p)) for p in paths]
    r0 = runs[0]
    out = [f"world {r0['world']}, {r0['threads']} thread(s)/rank, act. ckpt {'on' if r0['ckpt'] else 'off'}, "
           f"{len(runs)} runs, {r0['vlmtrain']['steps']} steps each, {r0['freq']} Hz\n"]

    def ms(r, side):  # {(phase, kind): CPU ms per step and rank}
        x = r[side]
        norm = 1000.0 / r["freq"] / x["steps"] / x["ranks"]
        return {(ph, k): n * norm for ph, c in x["table"].items() for k, n in c.items()}
    per = {side: [ms(r, side) for r in runs] for side in ("vlmtrain", "hf")}

    def mean(side, pred):
        return sum(sum(v for key, v in m.items() if pred(*key)) for m in per[side]) / len(runs)
    tot = {side: mean(side, lambda ph, k: True) for side in per}
    rng = {side: [sum(m.values()) for m in per[side]] for side in per}
    for title, keys, pred in (("phase", PHASES, lambda key, ph, k: ph == key),
                              ("kind", [k for k, *_ in KINDS] + sorted({k for m in per["vlmtrain"] + per["hf"] for _, k in m})
                               + ["other"], lambda key, ph, k: k == key)):
        walls = title == "phase" and all("wall_ms" in r[x] for r in runs for x in per)
        wh = " wall ms (vlmtrain / HF) |" if walls else ""
        out.append(f"| {title} | vlmtrain CPU ms | % | HF CPU ms | % | vlmtrain - HF ms |{wh}")
        out.append("|---|---|---|---|---|---|" + ("---|" if walls else ""))
        wall = {x: {ph: sum(r[x]["wall_ms"].get(ph, 0) for r in runs) / len(runs) for ph in PHASES} for x in per}
        for key in dict.fromkeys(keys):
            v, h = mean("vlmtrain", lambda ph, k: pred(key, ph, k)), mean("hf", lambda ph, k: pred(key, ph, k))
            if v + h < 0.5:
                continue
            wc = f" {wall['vlmtrain'][key]:.0f} / {wall['hf'][key]:.0f} |" if walls else ""
            out.append(f"| {key} | {v:.0f} | {100 * v / tot['vlmtrain']:.0f}% | {h:.0f} | {100 * h / tot['hf']:.0f}% "
                       f"| {v - h:+.0f} |{wc}")
        wc = (f" {sum(wall['vlmtrain'].values()):.0f} / {sum(wall['hf'].values()):.0f} |") if walls else ""
        out.append(f"| **total** | **{tot['vlmtrain']:.0f}** | | **{tot['hf']:.0f}** | | **{tot['vlmtrain'] - tot['hf']:+.0f}"
                   f"** (ratio {tot['vlmtrain'] / tot['hf']:.2f}x) |{wc}\n")
    if all("offcpu_ms" in r[x] for r in runs for x in per):
        out.append("Main thread off the CPU, ms per step and rank (blocked = waiting; preempted = runnable, core "
                   "taken), by the phase it left in:\n")
        out.append("| phase | vlmtrain blocked | vlmtrain preempted | HF blocked | HF preempted |")
        out.append("|---|---|---|---|---|")

        def offm(x, ph, how):
            return sum(r[x]["offcpu_ms"].get(ph, {}).get(how, 0) for r in runs) / len(runs)
        for ph in PHASES + ["total"]:
            vals = [sum(offm(x, p, how) for p in (PHASES if ph == "total" else [ph]))
                    for x in ("vlmtrain", "hf") for how in ("blocked", "preempted")]
            if sum(vals) >= 0.5:
                out.append(f"| {ph} | " + " | ".join(f"{v:.0f}" for v in vals) + " |")
        out.append("")
    gemm = {side: {ph: mean(side, lambda p, k, ph=ph: p == ph and k.startswith("GEMM")) for ph in PHASES} for side in per}
    out.append("GEMM by phase (ms): " + "; ".join(
        f"{ph} {gemm['vlmtrain'][ph]:.0f} vs {gemm['hf'][ph]:.0f}" for ph in PHASES if gemm['hf'][ph] + gemm['vlmtrain'][ph] > 0.5))
    out.append("Totals per run (ms): vlmtrain " + ", ".join(f"{x:.0f}" for x in rng["vlmtrain"]) + "; HF " +
               ", ".join(f"{x:.0f}" for x in rng["hf"]) + ". Median step s under perf: vlmtrain " +
               ", ".join(f"{r['vlmtrain']['median_step_s']:.3f}" for r in runs) + "; HF " +
               ", ".join(f"{r['hf']['median_step_s']:.3f}" for r in runs) + ". Main-thread share of CPU: vlmtrain " +
               f"{mean_main(runs, 'vlmtrain'):.0%}, HF {mean_main(runs, 'hf'):.0%}.")
    return "\n".join(out)


def mean_main(runs, side):
    return sum(sum(r[side]["main_thread"].values()) / r[side]["samples"] for r in runs) / len(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--data")
    ap.add_argument("--vlmtrain", default=os.path.join(one.ROOT, "build", "vlmtrain"))
    ap.add_argument("--work", default="/tmp/profile_step")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="per rank (default: 2 at world 1, 1 at world 2)")
    ap.add_argument("--ckpt", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--freq", type=int, default=299)
    ap.add_argument("--omp-wait", default="PASSIVE", help="OMP_WAIT_POLICY of both sides ('' = libgomp's default); "
                    "perf's own CPU use makes spinning OpenMP threads wait for a descheduled sibling")
    ap.add_argument("--stack", type=int, default=16384, help="bytes of stack perf copies per sample")
    ap.add_argument("--sides", default="vlmtrain,hf")
    ap.add_argument("--out", default=None)
    ap.add_argument("--switch-stacks", action="store_true", help="also record sched:sched_switch with stacks "
                    "(the blocked_sites_ms of the JSON: where main threads waited)")
    ap.add_argument("--reuse", action="store_true", help="analyse the recordings already in --work")
    ap.add_argument("--summarize", nargs="+", metavar="JSON", help="print the tables of these --out files and exit")
    ap.add_argument("--hf-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.summarize:
        return print(summarize(a.summarize))
    a.argv = [x for x in sys.argv[1:] if x not in ("--hf-side", "--hf-worker")]
    if a.threads is None:
        a.threads = 2 if a.world == 1 else 1
    for k, v in dict(samples=4, max_tokens=2048, lr=2e-3, vit_lr=2e-4, weight_decay=0.01, grad_clip=1.0, warmup=2,
                     min_lr_ratio=0.1, attn="sdpa").items():
        setattr(a, k, v)
    a.dump = os.path.join(a.work, "batches")
    if a.omp_wait:
        os.environ["OMP_WAIT_POLICY"] = a.omp_wait
    if a.hf_worker:
        return hf_worker(a)
    if a.hf_side:
        return hf_side(a)
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(a.dump, "done")):
        subprocess.run(["rm", "-rf", a.dump], check=True)
        if a.world == 1:
            one.vlmtrain_run(a, os.path.join(a.work, "dump-run"), ckpt=False, dump=a.dump)
        else:
            hfd.vlmtrain_run(a, os.path.join(a.work, "dump-run"), "ddp", False, dump=a.dump)
        open(os.path.join(a.dump, "done"), "w").close()
    res = {"world": a.world, "threads": a.threads, "ckpt": a.ckpt, "freq": a.freq, "loadavg": [one.loadavg()]}
    for side in a.sides.split(","):
        rec = os.path.join(a.work, f"{side}.record.json")
        if not (a.reuse and os.path.exists(rec)):
            r = record_vlmtrain(a) if side == "vlmtrain" else record_hf(a)
            json.dump(r, open(rec, "w"))
        data, win, step_s, n, *iv = json.load(open(rec))
        win = {(k if k == "all" else int(k)): v for k, v in win.items()}
        iv = {int(k): v for k, v in iv[0].items()} if iv else None
        res[side] = analyse(side, data, win, n, a.world, iv)
        res[side]["median_step_s"] = sorted(step_s)[len(step_s) // 2]
        res["loadavg"].append(one.loadavg())
    print(f"world {a.world}, {a.threads} thread(s)/rank, ckpt {'on' if a.ckpt else 'off'}, load {res['loadavg']}")
    if "vlmtrain" in res and "hf" in res:
        print(render(res, a.freq))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
