#!/usr/bin/env python3
"""Runs the CPU benchmarks and writes one table (stdout + bench/RESULTS.md).

Called by scripts/bench.sh after the build; needs no torch itself (the PyTorch reference
runs under /usr/bin/python3). Sections:
  1. overhead ratios  interleaved rounds of the compared configurations, medians
  2. step matrix      bench/step_bench: {tiny, small} x policy mixes x world {1, 2, 4}
  3. comm bytes       measured per step and rank vs the ring formulas (from section 1)
  4. trainer          `vlmtrain train` end to end (synthetic OCR data, data pipeline in)
  5. data, tokenizer  image_bench (images/s per core), tokenizer_bench (MB/s)
  6-10. issue #30     vlmtrain next to what users would run instead (hf_sections.py): training
                      step vs HF transformers at world 1 (6) and world 2 with torch DDP / FSDP2
                      (9), image preprocessing (7) and tokenizer (8) vs HF, loader per thread (10)
  11. packing         packing_bench: tokens/s and padding, padded vs packed rows (docs/packing.md)

Speed is reported as ratios measured within one run; absolute numbers are for this
machine and moment only (see the header of RESULTS.md for its load).

Environment knobs: BENCH_QUICK=1 (scripts/bench.sh --quick: skips the step matrix, fewer
rounds elsewhere; ~30 min on the shared 2-core machine instead of ~50), BENCH_REPEATS (rounds
of section 1, default 5, quick 3), BENCH_STEPS (measured steps per run, default 3), BENCH_SKIP
(comma list of sections to skip: ratios, matrix, train, data, hf_step, image_hf, tokenizer_hf,
hf_dist, loader, packing), BENCH_OUT (folder for raw JSON, logs and section files, default
build/bench-out), BENCH_NOTE (a sentence added to the report's header).

No section is ever dropped: a section skipped (or not run yet) keeps its text from an earlier
run into the same BENCH_OUT, else from the bench/RESULTS.md being replaced, marked as such.
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
import traceback
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
OUT = os.environ.get("BENCH_OUT", os.path.join(BUILD, "bench-out"))
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
# BENCH_RENDER_ONLY=1: run nothing; render bench/RESULTS.md again from BENCH_OUT's section files
# and JSON of the last run (after a change to the report's text or to bench/notes/).
RENDER_ONLY = os.environ.get("BENCH_RENDER_ONLY", "") not in ("", "0")
REPEATS = int(os.environ.get("BENCH_REPEATS", "3" if QUICK else "5"))
STEPS = int(os.environ.get("BENCH_STEPS", "3"))
SKIP = set(filter(None, os.environ.get("BENCH_SKIP", "").split(","))) | ({"matrix"} if QUICK else set())
TORCH_PY = os.environ.get("TORCH_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_sections  # noqa: E402  (sections 6-10)

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


SYSTEM_MALLOC = {"VLMTRAIN_HOST_MALLOC": "system"}  # step_bench with glibc's default thresholds
SHM = {"VLMTRAIN_SHM_COMM": "1"}  # world 2 through the opt-in shared-memory channel instead of Gloo's TCP
# glibc malloc settings equal to what vlmtrain and step_bench set for themselves at start
# (vlm/runtime/host_malloc.h): given to the PyTorch reference so both sides allocate alike.
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
              "differs from that formula by design (sharding/parallel/fsdp.h): the unit of the last call (the tied "
              "embedding, called as lm_head) stays gathered from its forward into its backward, and the tied "
              "embedding is gathered for both its calls, so it measures 3(N-1)/N x M + (N-1)/N x M_embed. "
              "Measured: the Comm layer's counters (sharding/dist/comm.h) over the measured steps, divided by the "
              "steps: logical = what the op moves natively with a ring, wire = what the transport really moved "
              "(these runs: Gloo's TCP, the default, whose reduce-scatter is an all-to-all and all-gather one "
              "broadcast per rank, both the ring volume; the opt-in shared-memory channel, VLMTRAIN_SHM_COMM=1, "
              "reads the same volume). Both include the step's few scalar all-reduces (token count, grad norm).\n")
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
               ("ddp w2, shm", lambda: step_bench(preset, "ddp", False, 2, threads=1, env_extra=SHM)),
               ("full_shard w2, shm",
                lambda: step_bench(preset, "full_shard", False, 2, threads=1, env_extra=SHM)),
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
              "glibc malloc to keep freed memory (vlm/runtime/host_malloc.h); the PyTorch reference runs with the same "
              f"thresholds (GLIBC_TUNABLES={HOST_MALLOC_TUNABLES}), and the last row gives the FSDP ratio "
              "with glibc's defaults (VLMTRAIN_HOST_MALLOC=system). World 2 exchanges over Gloo's TCP "
              "(loopback; the default, and the transport PyTorch DDP uses too); the \"shm\" rows opt into the "
              "shared-memory channel (VLMTRAIN_SHM_COMM=1, sharding/dist/shm_channel.h) to show what it saves. Exposed comm s: seconds per step rank 0 blocked waiting for collectives "
              "(Comm's wait_s).\n")
    md.append("| ratio | wall-time ratio | CPU-time ratio | target | runs |")
    md.append("|---|---|---|---|---|")
    rows = [("DDP: world 2 / world 1", "ddp w2", "ddp w1", "<= 1.25x"),
            ("FSDP (full_shard): world 2 / world 1", "full_shard w2", "full_shard w1", "<= 1.25x"),
            ("activation checkpointing on model.layers.* / plain (full_shard, world 1)", "full_shard+ckpt w1",
             "full_shard w1", "~1.33x when applied"),
            ("C++ DDP / PyTorch DDP (world 2, both on Gloo TCP)", "ddp w2", "pytorch ddp w2", "<= 1.0x"),
            ("C++ DDP on shared memory / PyTorch DDP on Gloo TCP (world 2)", "ddp w2, shm", "pytorch ddp w2",
             "(opt-in transport)"),
            ("DDP: world 2 on shared memory / world 1", "ddp w2, shm", "ddp w1", "(opt-in transport)"),
            ("FSDP (full_shard): world 2 on shared memory / world 1", "full_shard w2, shm", "full_shard w1",
             "(opt-in transport)"),
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
    json.dump({name: {"step_s": med(name, "step_s"), "cpu_s_per_rank": med(name, "cpu_s_per_rank"),
                      "comm_wait_s_per_step": med(name, "comm_wait_s_per_step") if name != "pytorch ddp w2" else None,
                      "runs": len(res[name])} for name, _ in configs},
              open(os.path.join(OUT, "ratios.json"), "w"), indent=1)
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
    md.append("## 11. Padding-free packing (bench/packing_bench, docs/packing.md)\n")
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


def memory_plan_section(md):
    """Issue #29: the trainer's planned peak per rank vs the measured one, per policy mix."""
    import memory_plan
    results = memory_plan.report_section(md, os.path.join(BUILD, "vlmtrain"), os.path.join(OUT, "memory_plan"),
                                         commands.append)
    json.dump(results, open(os.path.join(OUT, "memory_plan.json"), "w"), indent=1)


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


# Report order: (file name, function, the "## N." headings its file holds).
SECTIONS = [("ratios", None, ["1"]), ("matrix", None, ["2", "3"]), ("train", None, ["4"]), ("data", None, ["5"]),
            ("hf_step", hf_sections.hf_step, ["6"]), ("image_hf", hf_sections.image_hf, ["7"]),
            ("tokenizer_hf", hf_sections.tokenizer_hf, ["8"]), ("hf_dist", hf_sections.hf_dist, ["9"]),
            ("loader", hf_sections.loader, ["10"]), ("packing", None, ["11"]), ("memory_plan", None, ["12"])]


def previous_sections(path):
    """'## N.' heading number -> that section's text in the report being replaced (up to the next
    '## ' heading; the old report's own '## Commands' and 'Load average at the end' lines dropped)."""
    if not os.path.exists(path):
        return {}
    out, cur = {}, None
    for line in open(path).read().splitlines():
        m = re.match(r"## (\d+)\. ", line)
        if line.startswith("## "):
            cur = m.group(1) if m else None
            if cur:
                out[cur] = []
        if cur and not line.startswith("Load average at the end"):
            out[cur].append(line)
    return {k: "\n".join(v).rstrip() + "\n" for k, v in out.items()}


def summary(md):
    """The issue #30 rows, from the JSON of the sections present in BENCH_OUT."""
    def load(name):
        path = os.path.join(OUT, name + ".json")
        return json.load(open(path)) if os.path.exists(path) else None
    rows = []
    j = load("hf_step")
    if j:
        for tag, label in (("nockpt", "off"), ("ckpt", "on")):
            r = j["summary"][tag]["ratio_vlmtrain_over_hf"]
            rows.append(f"| 1(a) step, world 1, 2 threads, act. ckpt {label} | vlmtrain / HF transformers + AdamW | "
                        f"**{r:.2f}x** step time | <= 0.8x | {hf_sections.met_world1(r, j['info'])} | 6 |")
    j = load("hf_dist")
    if j:
        for tag, s in j["summary"].items():
            mode, ck = tag.split("-")
            r = s["ratio_vlmtrain_over_hf"]
            what = "all-DDP / torch DDP" if mode == "ddp" else "FSDP full_shard / torch FSDP2 fully_shard"
            rows.append(f"| 1({'b' if mode == 'ddp' else 'c'}) step, world 2 (Gloo), act. ckpt "
                        f"{'on' if ck == 'ckpt' else 'off'} | vlmtrain {what} | **{r:.2f}x** step time | <= 0.8x | "
                        f"{hf_sections.met(r)} | 9 |")
    j = load("image_hf")
    if j:
        v = [r["vs_tv"] for r in j["rows"]]
        rows.append(f"| 2 image preprocessing, per core | vlmtrain / HF Qwen2VLImageProcessor (default) | "
                    f"**{min(v):.2f}x-{max(v):.2f}x** images/s | >= 3x | met in {sum(x >= 3 for x in v)} of {len(v)} "
                    "files x caps | 7 |")
    j = load("tokenizer_hf")
    if j:
        r = j["summary"]["ratio_warm"]
        rows.append(f"| 3 tokenizer encode, one thread | vlmtrain / HF tokenizers | **{r:.2f}x** MB/s | >= 1x | "
                    f"{'met' if r >= 1 else 'missed'} | 8 |")
    j = load("loader")
    if j:
        for r in j:
            if r["workers"] == 1:
                need = hf_sections.h100_samples_per_s(r["tokens_per_sample"], r["image_tokens_per_image"])
                rows.append(f"| 4 loader, {r['set']} | samples/s per worker thread vs one H100's demand (stated "
                            f"basis) | **{r['samples_per_worker_cpu_s']:.0f}** vs {need:.0f} | | "
                            f"{need / r['samples_per_worker_cpu_s']:.2f} threads per H100 | 10 |")
    j = load("ratios")
    if j and j.get("ddp w2", {}).get("step_s"):
        for mode, name in (("ddp", "DDP"), ("full_shard", "FSDP full_shard")):
            a, b = j[f"{mode} w2, shm"], j[f"{mode} w2"]
            if a["step_s"] and b["step_s"]:
                rows.append(f"| 5 vlmtrain {name} world 2: its shared-memory channel / 2.11's Gloo TCP | step time "
                            f"(CPU s/rank); exposed comm s/step | **{a['step_s'] / b['step_s']:.2f}x** "
                            f"({a['cpu_s_per_rank'] / b['cpu_s_per_rank']:.2f}x); {a['comm_wait_s_per_step']:.3f} vs "
                            f"{b['comm_wait_s_per_step']:.3f} | | | 1 |")
    j = load("memory_plan")
    if j:
        worst = [r["worst"] for r in j]
        rows.append(f"| #29 planned / measured peak memory per rank, {len(j)} policy mixes, world 1-2 | vlmtrain plan / "
                    f"vlmtrain measured | **{min(worst):.2f}x-{max(worst):.2f}x** (worst step per mix) | within 10% | "
                    f"{'met' if all(r['within_10pct'] for r in j) else 'missed'} in {sum(r['within_10pct'] for r in j)} "
                    f"of {len(j)} | 12 |")
    if rows:
        md.append("## Summary: issue #30, vlmtrain next to what users would run instead\n")
        md.append("| row | ratio | measured | target | | section |")
        md.append("|---|---|---|---|---|---|")
        md += rows
        md.append("\nFrom the results in BENCH_OUT (sections not re-run keep their text below but are not in this "
                  "table); the load each ran under is at the end of its section. Speed ratios are wall time, "
                  "measured interleaved; a ratio taken while the load exceeded the cores is marked where that "
                  "invalidates it.\n")
        why = os.path.join(ROOT, "bench", "notes", "why_misses.md")
        if os.path.exists(why):  # hand-written, from profiles (bench/notes/profile_step.md)
            md.append("### Why the misses\n")
            md.append(open(why).read().rstrip() + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    global raw
    raw = open(os.path.join(OUT, "results.jsonl"), "a")
    h = header()
    log(f"start: {h} (quick: {QUICK}, skip: {sorted(SKIP)})")
    dest = os.environ.get("BENCH_RESULTS", os.path.join(ROOT, "bench", "RESULTS.md"))
    previous = previous_sections(dest)
    md = ["# vlmtrain benchmark results (CPU)\n",
          f"Report assembled {h['date']} at commit {h['rev']} by `scripts/bench.sh{' --quick' if QUICK else ''}`; "
          "each section gives the time it ran; a section not run this time says so and where its text comes from.\n",
          f"**Machine: a shared {h['nproc']}-core machine** ({h['cpu']}, Linux {h['kernel']}), load "
          f"average {h['load']} when this report was assembled; each section gives the load while it ran "
          "(other engineers may build and test on the same cores). Absolute times are therefore noisy; "
          "read the ratios, measured interleaved in one run, and the byte counts of section "
          "3, which do not depend on load.\n",
          "GPU part (qwen2-vl-2b on CUDA vs HF transformers): scripts/gpu/run_bench.sh on a CUDA machine, not "
          "this script. " + os.environ.get("BENCH_NOTE", "") + "\n"]
    ctx = types.SimpleNamespace(root=ROOT, build=BUILD, out=OUT, py=TORCH_PY, quick=QUICK, log=log,
                                cmd=commands.append, render_only=RENDER_ONLY)
    if RENDER_ONLY:  # the header of the run that produced the results, and a line saying so
        run_info = json.load(open(os.path.join(OUT, "run_info.json")))
        md[1:3] = run_info["header"]
        ctx.quick = run_info["quick"]
        md.insert(3, f"Rendered again at {h['date']} from that run's results (`BENCH_RENDER_ONLY=1`: report text and "
                     "bench/notes/ changed, no measurement re-run).\n")
    else:
        json.dump({"header": md[1:3], "quick": QUICK}, open(os.path.join(OUT, "run_info.json"), "w"))

    # Each section writes BENCH_OUT/<name>.md and <name>.cmds; the report joins them in order.
    def section(name, fn):
        del commands[:]
        body = []
        t0 = time.time()
        path = os.path.join(OUT, name + ".md")
        if RENDER_ONLY and fn.__code__.co_argcount == 1:  # sections 1-5: their section file as it is
            return
        footer = [l for l in open(path).read().splitlines() if l.startswith("_(section run at")][-1:] \
            if RENDER_ONLY else []
        try:
            fn(body) if fn.__code__.co_argcount == 1 else fn(ctx, body)
        except Exception:  # a broken section must not cost the others' results
            log(f"{name}: {traceback.format_exc()}")
            body.append(f"\n**Section {name} stopped with an error:**\n\n```\n{traceback.format_exc()[-2000:]}```\n")
        body.append(footer[0] + "\n" if footer else
                    f"_(section run at {time.strftime('%H:%M UTC', time.gmtime())} in {time.time() - t0:.0f} s, "
                    f"load average then {' '.join(f'{x:.2f}' for x in os.getloadavg())})_\n")
        open(os.path.join(OUT, name + ".md"), "w").write("\n".join(body) + "\n")
        open(os.path.join(OUT, name + ".cmds"), "w").write("\n".join(commands) + "\n")

    def matrix_and_comm(body):
        rows = matrix(body)
        comm_section(body, rows)

    fns = {"ratios": ratios, "matrix": matrix_and_comm, "train": train_section, "data": data_section,
           "packing": packing_section, "memory_plan": memory_plan_section}
    ran = []
    for name, fn, _ in SECTIONS:
        if name not in SKIP and not (RENDER_ONLY and not os.path.exists(os.path.join(OUT, name + ".md"))):
            section(name, fn or fns[name])
            ran.append(name)
    sections, all_cmds = [], []
    for name, _, heads in SECTIONS:
        path = os.path.join(OUT, name + ".md")
        if name in ran:
            sections.append(open(path).read())
            all_cmds += open(os.path.join(OUT, name + ".cmds")).read().splitlines()
        elif os.path.exists(path):
            sections.append(f"_(Not re-run this time: section file {os.path.relpath(path, ROOT)} of an earlier run, "
                            "as it was.)_\n\n" + open(path).read())
            all_cmds += open(os.path.join(OUT, name + ".cmds")).read().splitlines()
        elif any(k in previous for k in heads):
            note = "\n\n_(Not re-run this time: this section's text is kept from the bench/RESULTS.md this run replaced.)_\n"
            sections.append("\n".join(previous[k] if "_(Not re-run this time" in previous[k]
                                      else previous[k].replace("\n", note, 1) for k in heads if k in previous))
        else:
            sections.append(f"## {heads[0]}. ({name}): not run yet\n")
    summary(md)
    md += sections
    h2 = header()
    end = f"Load average at the end: {h2['load']} ({h2['date']}).\n"
    if RENDER_ONLY:  # the run's own line
        end = next((l + "\n" for l in open(dest).read().splitlines() if l.startswith("Load average at the end")), end)
    md.append(end)
    md.append("## Commands\n")
    md.append("```")
    md.append("scripts/bench.sh [--quick]   # builds, then runs everything below (each once per repeat)")
    seen = set()
    for c in all_cmds:
        c = c.replace(ROOT + "/", "")
        if c and c not in seen:
            seen.add(c)
            md.append(c)
    md.append("```")
    text = "\n".join(md) + "\n"
    with open(dest, "w") as f:
        f.write(text)
    print(text)
    log(f"wrote {dest}")


if __name__ == "__main__":
    main()
