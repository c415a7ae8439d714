#!/usr/bin/env python3
"""Runs the CPU benchmarks and writes one table (stdout + bench/RESULTS.md).

Called by scripts/bench.sh after the build; needs no torch itself (the PyTorch reference
runs under /usr/bin/python3). Sections:
  1. overhead ratios  interleaved rounds of the compared configurations, medians
  2. step matrix      bench/step_bench: {tiny, small} x policy mixes x world {1, 2, 4}
  3. comm bytes       measured per step and rank vs the ring formulas (from section 1)
  4. trainer          `vlmtrain train` end to end (synthetic OCR data, data pipeline in)
  5. data, tokenizer  image_bench (images/s per core), tokenizer_bench (MB/s)

Speed is reported as ratios measured within one run; absolute numbers are for this
machine and moment only (see the header of RESULTS.md for its load).

Environment knobs: BENCH_REPEATS (rounds of section 2, default 3), BENCH_STEPS (measured
steps per run, default 3), BENCH_SKIP (comma list of sections to skip: matrix, ratios,
train, data, packing; a skipped section keeps its result from an earlier run into the same
BENCH_OUT), BENCH_OUT (folder for raw JSON lines, logs and section files, default
build/bench-out), BENCH_NOTE (a sentence added to the report's header).
"""
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
OUT = os.environ.get("BENCH_OUT", os.path.join(BUILD, "bench-out"))
REPEATS = int(os.environ.get("BENCH_REPEATS", "3"))
STEPS = int(os.environ.get("BENCH_STEPS", "3"))
SKIP = set(filter(None, os.environ.get("BENCH_SKIP", "").split(",")))
TORCH_PY = os.environ.get("TORCH_PYTHON", "/usr/bin/python3")

# Per-rank batch of every step_bench / PyTorch run (same shapes on both sides).
SHAPES = {"tiny": ["--samples", "2", "--text", "64", "--image-tokens", "32"],
          "small": ["--samples", "2", "--text", "64", "--image-tokens", "32"]}
MATRIX_STEPS = int(os.environ.get("BENCH_MATRIX_STEPS", "2"))
MIXES = [("ddp", False), ("frozen", False), ("full_shard", False), ("full_shard", True)]
MIX_NAMES = {"ddp": "all ddp", "frozen": "frozen vision + ddp merger + fsdp LLM",
             "full_shard": "full_shard everything"}

raw = None  # results.jsonl: every run's JSON line
commands = []


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


SYSTEM_MALLOC = {"VLM_HOST_MALLOC": "system"}  # step_bench with glibc's default thresholds
GLOO_TCP = {"VLM_SHM_COMM": "0"}  # world 2 over Gloo's TCP (loopback) instead of shared memory
# glibc malloc settings equal to what vlmtrain and step_bench set for themselves at start
# (vlm/host_malloc.h): given to the PyTorch reference so both sides allocate alike.
HOST_MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def run_json(cmd, tag, threads=None, timeout=1800, env_extra=None):
    """Runs cmd, returns the last JSON line of its stdout (None on failure). threads: also
    OMP/MKL_NUM_THREADS, because at::set_num_threads() binds only the calling thread's
    OpenMP pool: without the variables a "--threads 1" world-1 run still kept both cores
    busy (CPU s/step 1.30 at 0.65 s wall; 0.83 at 0.83 with OMP_NUM_THREADS=1)."""
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    env.update(env_extra or {})
    commands.append("".join(f"{k}={v} " for k, v in (env_extra or {}).items()) +
                    (f"OMP_NUM_THREADS={threads} " if threads else "") + " ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        log(f"FAILED ({p.returncode}) {tag}: {p.stderr[-2000:]}")
        return None
    j = json.loads(lines[-1])
    j["tag"], j["wall_s"] = tag, time.time() - t0
    if raw:
        raw.write(json.dumps(j) + "\n")
        raw.flush()
    log(f"{tag}: step {j['step_s']:.3f} s, cpu/rank {j.get('cpu_s_per_rank', 0):.3f} s ({j['wall_s']:.0f} s wall)")
    return j


def step_bench(preset, mix, ckpt, world, threads=None, steps=STEPS, warmup=1, env_extra=None):
    cmd = [os.path.join(BUILD, "bench", "step_bench"), "--json", "--preset", preset, "--mix", mix,
           "--world", str(world), "--steps", str(steps), "--warmup", str(warmup)] + SHAPES[preset]
    if ckpt:
        cmd.append("--ckpt")
    if threads:
        cmd += ["--threads", str(threads)]
    tag = f"cpp {preset} {mix}{'+ckpt' if ckpt else ''} w{world} t{threads or 'auto'}"
    return run_json(cmd, tag + (" " + " ".join(env_extra.values()) if env_extra else ""), threads,
                    env_extra=env_extra)


def pytorch_ddp(preset, world, threads=1, steps=STEPS, warmup=1):
    cmd = [TORCH_PY, os.path.join("scripts", "bench", "pytorch_ddp_reference.py"), "--preset", preset,
           "--world", str(world), "--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup)]
    cmd += SHAPES[preset]
    return run_json(cmd, f"pytorch {preset} ddp w{world} t{threads}", threads,
                    env_extra={"GLIBC_TUNABLES": HOST_MALLOC_TUNABLES})


def group_notes(notes):
    """'unit A: msg' notes -> 'msg: A, B, ...' (one line per distinct message)."""
    by_msg = {}
    for n in notes:
        m = re.match(r"unit (\S+): (.*)", n)
        unit, msg = (m.group(1), m.group(2)) if m else ("", n)
        by_msg.setdefault(msg, set()).add(unit)
    return [f"{msg}: {', '.join(sorted(u for u in units if u))}" for msg, units in sorted(by_msg.items())]


def mb(x):
    return f"{x / 1e6:.1f}"


def fmt_ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"


# ---------------------------------------------------------------- sections
def matrix(md):
    md.append("## 2. Training step matrix (bench/step_bench, fixed synthetic batch, no data pipeline)\n")
    md.append("Per-rank batch (both presets): 2 samples x 98 tokens (32 image tokens = 128 patches each). fp32, "
              "one intra-op thread per rank (`--threads 1` and OMP_NUM_THREADS=1: the option alone left a second "
              "OpenMP pool busy, so world-1 runs used both cores). "
              f"Median of {MATRIX_STEPS} steps after 1 warm-up step; one run per row (not interleaved: read it "
              "for shape, not for small differences). World 4 puts 4 ranks on 2 cores. tokens/s and images/s "
              "are global (all ranks). Peak RSS: the largest rank.\n")
    md.append("| preset | policy mix | act. ckpt | world | step s | CPU s/rank | tokens/s | images/s | peak RSS MB |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for preset in ("tiny", "small"):
        for world in (1, 2, 4):
            for mix, ckpt in MIXES:
                if preset == "small" and world == 4 and (mix, ckpt) != ("ddp", False):
                    continue  # 4 ranks of the small model on 2 shared cores: one mix only (time)
                j = step_bench(preset, mix, ckpt, world, threads=1, steps=MATRIX_STEPS)
                if not j:
                    md.append(f"| {preset} | {MIX_NAMES[mix]} | {'on' if ckpt else 'off'} | {world} | failed | | | | |")
                    continue
                rows.append(j)
                md.append(f"| {preset} | {MIX_NAMES[mix]} | {'on' if ckpt else 'off'} | {world} | {j['step_s']:.3f} | "
                          f"{j['cpu_s_per_rank']:.3f} | {j['tokens_per_s']:.0f} | {j['images_per_s']:.1f} | "
                          f"{mb(j['peak_rss_bytes'])} |")
    md.append("\nSkipped: small at world 4 for every mix but all-ddp (4 ranks of a 41M-parameter model on 2 shared "
              "cores would take most of the run's time budget).\n")
    notes = group_notes(n for j in rows for n in j.get("notes", []))
    if notes:
        md.append("Notes the sharding engine printed (what ran differently from the plan), units of both presets:\n")
        md += [f"- {n}" for n in notes]
        md.append("")
    return rows


def comm_section(md, rows):
    md.append("## 3. Communication bytes per step and rank vs the ring formulas\n")
    md.append("M = trainable parameters x 4 bytes (fp32 reduce dtype). DDP formula 2(N-1)/N x M (all-reduce); "
              "full_shard formula 3(N-1)/N x M (2 all-gathers + reduce-scatter per unit). vlmtrain's full_shard "
              "differs from that formula by design (sharding/fsdp.h): the unit of the last call (the tied "
              "embedding, called as lm_head) stays gathered from its forward into its backward, and the tied "
              "embedding is gathered for both its calls, so it measures 3(N-1)/N x M + (N-1)/N x M_embed. "
              "Measured: the Comm layer's counters (sharding/comm.h) over the measured steps, divided by the "
              "steps: logical = what the op moves natively with a ring, wire = what the transport really moved "
              "(these runs: the shared-memory channel, which reads the ring volume; Gloo's TCP fallbacks issue "
              "the same volume since the reduce-scatter became an all-to-all and the all-gather one broadcast "
              "per rank). Both include the step's few scalar all-reduces (token count, grad norm).\n")
    md.append("| preset | policy mix | world | M MB | measured logical MB | wire MB | ring DDP MB | ring full_shard MB | "
              "logical / ring DDP |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    for j in rows:
        if j["world"] == 1 or j["ckpt"]:
            continue
        md.append(f"| {j['preset']} | {MIX_NAMES[j['mix']]} | {j['world']} | {mb(j['trainable_bytes_fp32'])} | "
                  f"{mb(j['comm_logical_bytes_per_step'])} | {mb(j['comm_wire_bytes_per_step'])} | "
                  f"{mb(j['ring_ddp_bytes'])} | {mb(j['ring_full_shard_bytes'])} | "
                  f"{j['comm_logical_bytes_per_step'] / j['ring_ddp_bytes']:.4f} |")
    md.append("")


def ratios(md):
    preset = "small"
    configs = [("ddp w1", lambda: step_bench(preset, "ddp", False, 1, threads=1)),
               ("ddp w2", lambda: step_bench(preset, "ddp", False, 2, threads=1)),
               ("full_shard w1", lambda: step_bench(preset, "full_shard", False, 1, threads=1)),
               ("full_shard w2", lambda: step_bench(preset, "full_shard", False, 2, threads=1)),
               ("ddp w2, Gloo TCP", lambda: step_bench(preset, "ddp", False, 2, threads=1, env_extra=GLOO_TCP)),
               ("full_shard w2, Gloo TCP",
                lambda: step_bench(preset, "full_shard", False, 2, threads=1, env_extra=GLOO_TCP)),
               ("full_shard+ckpt w1", lambda: step_bench(preset, "full_shard", True, 1, threads=1)),
               ("pytorch ddp w2", lambda: pytorch_ddp(preset, 2, threads=1)),
               ("full_shard w1, glibc malloc defaults",
                lambda: step_bench(preset, "full_shard", False, 1, threads=1, env_extra=SYSTEM_MALLOC)),
               ("full_shard w2, glibc malloc defaults",
                lambda: step_bench(preset, "full_shard", False, 2, threads=1, env_extra=SYSTEM_MALLOC))]
    res = {name: [] for name, _ in configs}
    for r in range(REPEATS):
        order = configs if r % 2 == 0 else list(reversed(configs))  # interleaved, alternating order
        for name, fn in order:
            j = fn()
            if j:
                res[name].append(j)

    def med(name, key):
        v = [j[key] for j in res[name]]
        return statistics.median(v) if v else 0

    md.append("## 1. Overhead ratios (small preset, measured in one run)\n")
    md.append(f"Each configuration ran {REPEATS} times, interleaved (round-robin, alternating order); each run "
              f"reports the median of {STEPS} steps after 1 warm-up; the table gives the median over the runs. "
              "One intra-op thread per rank in every configuration (world 1 too), so world 2 uses one core per "
              "rank; per-rank batch identical at world 1 and 2 (2 samples x 98 tokens, 128 patches each). "
              "Step CPU s/rank (user + system CPU of the process per step, mean over ranks) moves less with the "
              "other users' load than wall time does, so both ratios are given. vlmtrain and step_bench set "
              "glibc malloc to keep freed memory (vlm/host_malloc.h); the PyTorch reference runs with the same "
              f"thresholds (GLIBC_TUNABLES={HOST_MALLOC_TUNABLES}), and the last row gives the FSDP ratio "
              "with glibc's defaults (VLM_HOST_MALLOC=system). World 2 exchanges through shared memory "
              "(sharding/shm_channel.h, the default when the ranks share a host); the \"Gloo TCP\" rows turn it "
              "off (VLM_SHM_COMM=0) to show what Gloo's TCP over loopback costs, and compare with PyTorch DDP on "
              "the same transport. Exposed comm s: seconds per step rank 0 blocked waiting for collectives "
              "(Comm's wait_s).\n")
    md.append("| ratio | wall-time ratio | CPU-time ratio | target | runs |")
    md.append("|---|---|---|---|---|")
    rows = [("DDP: world 2 / world 1", "ddp w2", "ddp w1", "<= 1.25x"),
            ("FSDP (full_shard): world 2 / world 1", "full_shard w2", "full_shard w1", "<= 1.25x"),
            ("activation checkpointing on model.layers.* / plain (full_shard, world 1)", "full_shard+ckpt w1",
             "full_shard w1", "~1.33x when applied"),
            ("C++ DDP / PyTorch DDP (world 2; C++ on shared memory, PyTorch on Gloo TCP)", "ddp w2",
             "pytorch ddp w2", "<= 1.0x"),
            ("C++ DDP / PyTorch DDP (world 2, both on Gloo TCP)", "ddp w2, Gloo TCP", "pytorch ddp w2",
             "(same transport)"),
            ("DDP: world 2 on Gloo TCP / world 1", "ddp w2, Gloo TCP", "ddp w1", "(for comparison)"),
            ("FSDP (full_shard): world 2 on Gloo TCP / world 1", "full_shard w2, Gloo TCP", "full_shard w1",
             "(for comparison)"),
            ("FSDP (full_shard): world 2 / world 1, glibc malloc defaults", "full_shard w2, glibc malloc defaults",
             "full_shard w1, glibc malloc defaults", "(for comparison)")]
    for label, a, b, target in rows:
        md.append(f"| {label} | {fmt_ratio(med(a, 'step_s'), med(b, 'step_s'))} | "
                  f"{fmt_ratio(med(a, 'cpu_s_per_rank'), med(b, 'cpu_s_per_rank'))} | {target} | "
                  f"{len(res[a])} + {len(res[b])} |")
    md.append("\nMedians behind the ratios (this machine, this moment):\n")
    md.append("| configuration | step s | CPU s/rank | exposed comm s | all step s |")
    md.append("|---|---|---|---|---|")
    for name, _ in configs:
        runs = ", ".join("%.2f" % j["step_s"] for j in res[name])
        has_wait = res[name] and all("comm_wait_s_per_step" in j for j in res[name])  # not the PyTorch runs
        wait = f"{med(name, 'comm_wait_s_per_step'):.3f}" if has_wait else "-"
        md.append(f"| {name} | {med(name, 'step_s'):.3f} | {med(name, 'cpu_s_per_rank'):.3f} | {wait} | {runs} |")
    pt = res["pytorch ddp w2"][:1]
    cp = res["ddp w2"][:1]
    if pt and cp:
        md.append(f"\nParameter count check: C++ {cp[0]['params']:,} vs PyTorch reference {pt[0]['params']:,}.")
    md.append("")


def launch_train(world, args, timeout=1800):
    """`vlmtrain train` as `world` processes with torchrun's environment."""
    exe = os.path.join(BUILD, "vlmtrain")
    cmd = [exe, "train"] + args
    commands.append(f"(world {world}) " + " ".join(cmd))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1")  # one intra-op thread per rank, as section 2
        if world > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                       GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        logf = open(os.path.join(OUT, f"train_w{world}_rank{r}.log"), "w")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT))
    return all(p.wait(timeout=timeout) == 0 for p in procs)


def train_section(md):
    md.append("## 4. Trainer end to end (`vlmtrain train`, synthetic OCR data, data pipeline included)\n")
    md.append("recipes/ocr_tiny.toml (its policy mix: vision full_shard, merger ddp, LLM full_shard, rest ddp) "
              "with the overrides in the commands below: 6 steps, log every step, the first 2 steps discarded, "
              "medians of the rest from RUN/metrics.jsonl (rank 0's view; tokens/s and images/s are global). "
              "OMP_NUM_THREADS=1 per rank; the loader's worker threads come on top.\n")
    md.append("| preset | samples/rank | world | step s | tokens/s | images/s | data wait % | peak RSS MB (rank 0) |")
    md.append("|---|---|---|---|---|---|---|---|")
    for preset, samples in (("tiny", 4), ("small", 2)):
        for world in (1, 2):
            run = os.path.join(OUT, f"train_{preset}_w{world}")
            subprocess.run(["rm", "-rf", run])
            args = ["recipes/ocr_tiny.toml", "--set", f"model.preset={preset}", "--set", f"run.output_dir={run}",
                    "--set", "schedule.steps=6", "--set", "schedule.warmup_steps=1", "--set", "log.every=1",
                    "--set", f"batch.samples_per_rank={samples}", "--set", "checkpoint.every=0",
                    "--set", "checkpoint.save_final=false", "--set", "eval.every=0",
                    "--set", "data.synth.generate_if_missing=false",
                    "--set", f"data.train=[\"{os.path.join(OUT, 'synth', 'train.jsonl')}\"]",
                    "--set", f"data.eval=[\"{os.path.join(OUT, 'synth', 'val.jsonl')}\"]",
                    "--set", f"model.tokenizer={os.path.join(OUT, 'synth', 'tokenizer.model')}"]
            log(f"train {preset} w{world}")
            ok = launch_train(world, args)
            path = os.path.join(run, "metrics.jsonl")
            if not ok or not os.path.exists(path):
                md.append(f"| {preset} | {samples} | {world} | failed (see {OUT}/train_w{world}_rank0.log) | | | | |")
                continue
            m = [x for x in map(json.loads, open(path)) if "step_s" in x][2:]  # training lines only (no eval)
            med = lambda k: statistics.median(x[k] for x in m)
            md.append(f"| {preset} | {samples} | {world} | {med('step_s'):.3f} | {med('tokens_per_s'):.0f} | "
                      f"{med('images_per_s'):.1f} | {med('data_wait_pct'):.0f} | {mb(max(x['peak_rss_bytes'] for x in m))} |")
            log(f"train {preset} w{world}: step {med('step_s'):.3f} s")
    md.append("")


def data_section(md):
    md.append("## 5. Data pipeline and tokenizer (one thread each)\n")
    exe = os.path.join(BUILD, "bench", "image_bench")
    commands.append(f"{exe} 5")
    p = subprocess.run([exe, "5"], capture_output=True, text=True)
    md.append("bench/image_bench (decode + smart_resize + patchify of synthetic JPEGs):\n")
    md.append("```")
    md += p.stdout.strip().splitlines() or [f"failed: {p.stderr[-500:]}"]
    md.append("```\n")
    tok = os.path.join(OUT, "synth", "tokenizer.model")
    exe = os.path.join(BUILD, "bench", "tokenizer_bench")
    commands.append(f"{exe} {tok} 1")
    p = subprocess.run([exe, tok, "1"], capture_output=True, text=True)
    md.append("bench/tokenizer_bench on the synthetic set's sentencepiece tokenizer (multilingual corpus text; "
              "the Qwen byte-level BPE tokenizer.json needs a download, see the bench's header):\n")
    md.append("```")
    md += p.stdout.strip().splitlines() or [f"failed: {p.stderr[-500:]}"]
    md.append("```\n")


def packing_section(md):
    md.append("## 9. Padding-free packing (bench/packing_bench, docs/packing.md)\n")
    md.append("tiny preset, fp32, 2 threads, 16 samples per step with lengths log-uniform over 20..2000 "
              "tokens, batch.max_tokens 4096, padded and packed rows on the same samples, interleaved "
              "step by step; tokens/s counts real tokens only.\n")
    md.append("| image share | padded tokens/s | padding | packed tokens/s | padding | packed / padded |")
    md.append("|---|---|---|---|---|---|")
    exe = os.path.join(BUILD, "bench", "packing_bench")
    for share in ("0", "0.15", "0.4"):
        cmd = [exe, "--json", "--steps", str(max(STEPS, 4)), "--warmup", "1", "--image-share", share]
        commands.append(" ".join(cmd))
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            md.append(f"| {share} | failed ({p.returncode}): {p.stderr[-200:]} | | | | |")
            continue
        j = json.loads(lines[-1])
        a, b = j["padded"], j["packed"]
        md.append(f"| {share} | {a['tokens_per_s']:.0f} | {100 * a['padding_fraction']:.1f}% | "
                  f"{b['tokens_per_s']:.0f} | {100 * b['padding_fraction']:.1f}% | {j['speedup']:.2f}x |")
    md.append("")


def header():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nproc": os.cpu_count(), "cpu": cpu,
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()), "kernel": platform.release(), "rev": rev}


def main():
    os.makedirs(OUT, exist_ok=True)
    global raw
    raw = open(os.path.join(OUT, "results.jsonl"), "a")
    h = header()
    log(f"start: {h}")
    md = ["# vlmtrain benchmark results (CPU)\n",
          f"Report assembled {h['date']} at commit {h['rev']} by `scripts/bench.sh`; each section gives the "
          "time it ran (sections skipped with BENCH_SKIP keep their result from an earlier run).\n",
          f"**Machine: a shared {h['nproc']}-core machine** ({h['cpu']}, Linux {h['kernel']}), load "
          f"average {h['load']} when this report was assembled; each section gives the load while it ran "
          "(other engineers may build and test on the same cores). Absolute times are therefore noisy; "
          "read the ratios of section 1, measured interleaved in one run, and the byte counts of section "
          "3, which do not depend on load.\n",
          "GPU part (qwen2-vl-2b on CUDA vs HF transformers): scripts/gpu/run_bench.sh on a CUDA machine, not "
          "this script. " + os.environ.get("BENCH_NOTE", "") + "\n"]
    # Each section writes BENCH_OUT/<name>.md and <name>.cmds; the report joins the files
    # present, so a section skipped now keeps its result from an earlier run into the
    # same BENCH_OUT (the report says which sections ran when).
    def section(name, fn):
        if name in SKIP:
            return
        del commands[:]
        body = []
        fn(body)
        body.append(f"_(section run at {time.strftime('%H:%M UTC', time.gmtime())}, "
                    f"load average then {' '.join(f'{x:.2f}' for x in os.getloadavg())})_\n")
        open(os.path.join(OUT, name + ".md"), "w").write("\n".join(body) + "\n")
        open(os.path.join(OUT, name + ".cmds"), "w").write("\n".join(commands) + "\n")

    def matrix_and_comm(body):
        rows = matrix(body)
        comm_section(body, rows)

    section("ratios", ratios)
    section("matrix", matrix_and_comm)
    section("train", train_section)
    section("data", data_section)
    section("packing", packing_section)
    all_cmds = []
    for name in ("ratios", "matrix", "train", "data", "packing"):
        path = os.path.join(OUT, name + ".md")
        if os.path.exists(path):
            md.append(open(path).read())
            all_cmds += open(os.path.join(OUT, name + ".cmds")).read().splitlines()
    h2 = header()
    md.append(f"Load average at the end: {h2['load']} ({h2['date']}).\n")
    md.append("## Commands\n")
    md.append("```")
    md.append("scripts/bench.sh      # builds, then runs everything below (each once per repeat)")
    seen = set()
    for c in all_cmds:
        c = c.replace(ROOT + "/", "")
        if c and c not in seen:
            seen.add(c)
            md.append(c)
    md.append("```")
    text = "\n".join(md) + "\n"
    dest = os.environ.get("BENCH_RESULTS", os.path.join(ROOT, "bench", "RESULTS.md"))
    with open(dest, "w") as f:
        f.write(text)
    print(text)
    log(f"wrote {dest}")


if __name__ == "__main__":
    main()
