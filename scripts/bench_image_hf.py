#!/usr/bin/env python3
"""Image preprocessing per core: vlmtrain vs HF's Qwen2-VL image processors (issue #30, row 2).

One run, the same files, one thread each, interleaved rounds:
  vlmtrain  build/bench/image_file_bench: the loader's path (read, decode, smart_resize,
            Pillow-exact bicubic resize, normalise + patchify), timed in-process
  hf_pil    transformers Qwen2VLImageProcessorPil given the path (PIL.Image.open,
            exif_transpose, convert("RGB"), Image.resize BICUBIC, numpy normalise)
  hf_tv     transformers Qwen2VLImageProcessor (the default backend) given the path
            (torchvision.io.decode_image, tvF.resize bicubic antialias, torch normalise)
Files (generated into --work, never into git): photo-like JPEGs 1024x1024, 2000x3000 and
640x480 (W x H; quality 90), a 1700x2200 document scan as RGB PNG. Each at cap 1024 image
tokens (max_pixels 1024 x 28^2) and uncapped (Qwen2-VL's max_pixels 12845056).

Before timing, vlmtrain's pixel_values must equal hf_pil's bit for bit (the run stops
otherwise); hf_tv's distance from them is printed for information.

  .venv/bin/python scripts/bench_image_hf.py [--bench build/bench/image_file_bench]
      [--work /tmp/vlm-img-bench] [--rounds 3] [--iters 6] [--out results.json]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"
import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import transformers  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN2 = dict(min_pixels=3136, patch_size=14, merge_size=2, temporal_patch_size=2,
             image_mean=[0.48145466, 0.4578275, 0.40821073],
             image_std=[0.26862954, 0.26130258, 0.27577711], resample=3, do_convert_rgb=True)
CAPS = {1024: 1024 * 28 * 28, 0: 12845056}  # image-token cap -> max_pixels
FILES = [("photo_1024x1024.jpg", 1024, 1024), ("photo_2000x3000.jpg", 2000, 3000),
         ("scan_1700x2200.png", 1700, 2200), ("photo_640x480.jpg", 640, 480)]


def photo(w, h, seed):
    """[h, w, 3] uint8: smooth gradients and blobs, sensor-like noise, a few text strokes."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / w * 3.1 + y / h * 1.7),
                    128 + 90 * np.cos(y / h * 4.3 - x / w),
                    60 + 150 * (y / h)], -1)
    for _ in range(6):  # soft blobs (objects out of focus)
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.05, 0.3) * min(w, h)
        img += (rng.uniform(-80, 80, 3) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None])
    img += rng.normal(0, 6, img.shape)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for i in range(8):  # a sign / caption
        draw.text((w * 0.1, h * 0.1 + i * h * 0.02), "Street 42 OPEN 9-18 caf\u00e9", fill=(20, 20, 20))
    return im


def scan(w, h, seed):
    """Document scan: off-white paper with a slight gradient and noise, dark text lines."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    paper = 236 + 10 * (x / w) - 6 * (y / h)
    img = np.repeat(paper[..., None], 3, -1) + rng.normal(0, 3, (h, w, 3))
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    words = "Invoice total amount due payable within thirty days of receipt 2026".split()
    for line, ty in enumerate(range(120, h - 120, 34)):
        tx = 140
        for j in range(12):
            word = words[(line * 7 + j) % len(words)]
            draw.text((tx, ty), word, fill=(25, 25, 30))
            tx += 14 + 9 * len(word) + int(rng.integers(0, 30))
            if tx > w - 200:
                break
        if line % 9 == 0:
            draw.line((140, ty + 22, w - 140, ty + 22), fill=(60, 60, 60), width=2)
    return im


def write_files(work):
    os.makedirs(work, exist_ok=True)
    paths = []
    for i, (name, w, h) in enumerate(FILES):
        path = os.path.join(work, name)
        if not os.path.exists(path):
            if name.endswith(".png"):
                scan(w, h, i).save(path, optimize=False)
            else:
                photo(w, h, i).save(path, quality=90)
        paths.append(path)
    return paths


def processors(max_pixels):
    return {"hf_pil": Qwen2VLImageProcessorPil(**QWEN2, max_pixels=max_pixels),
            "hf_tv": Qwen2VLImageProcessor(**QWEN2, max_pixels=max_pixels)}


def run_vlmtrain(bench, files, cap, iters, dump=None, extra=()):
    cmd = [bench, "--cap", str(cap), "--iters", str(iters)] + (["--dump", dump] if dump else []) + list(extra) + files
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    return {r["file"]: r for r in map(json.loads, out.splitlines())}


def time_hf(proc, path, iters, warmup=6):
    for _ in range(warmup):  # as many untimed calls per file as image_file_bench makes
        proc(images=[path], return_tensors="np")
    s = []
    for _ in range(iters):
        t0 = time.perf_counter()
        proc(images=[path], return_tensors="np")
        s.append(time.perf_counter() - t0)
    return s


def check_parity(bench, files, work):
    """vlmtrain == hf_pil bit for bit (stops otherwise); hf_tv's distance, for information."""
    report = {}
    for cap, max_pixels in CAPS.items():
        ours = run_vlmtrain(bench, files, cap, 0, dump=work)
        procs = processors(max_pixels)
        for f in files:
            mine = np.fromfile(os.path.join(work, f"{os.path.basename(f)}.cap{cap}.f32"), np.float32)
            pil = procs["hf_pil"](images=[f], return_tensors="np")
            tv = procs["hf_tv"](images=[f], return_tensors="pt")["pixel_values"].float().numpy()
            ref = np.asarray(pil["pixel_values"], np.float32)
            grid = [int(v) for v in np.asarray(pil["image_grid_thw"])[0]]
            equal = mine.shape == ref.reshape(-1).shape and np.array_equal(mine, ref.reshape(-1))
            key = f"{os.path.basename(f)} cap {cap}"
            report[key] = {"grid": grid, "equal_pil": bool(equal),
                           "tv_max_abs_diff": float(np.abs(tv - ref).max())}
            print(f"parity {key}: grid {grid} (vlmtrain {ours[f]['grid']}), vlmtrain == hf_pil: {equal}, "
                  f"hf_tv max |diff| {report[key]['tv_max_abs_diff']:.4f}", flush=True)
            if not equal or grid != ours[f]["grid"]:
                sys.exit(f"parity failed for {key}: not timing")
    return report


def reduced_decode_diff(bench, files, work):
    """PixelConfig::jpeg_reduced_decode (opt-in): same grid as HF, how far the values move."""
    report = {}
    for cap, max_pixels in CAPS.items():
        run_vlmtrain(bench, files, cap, 0, dump=work, extra=["--jpeg-reduced-decode"])
        for f in files:
            base = os.path.join(work, f"{os.path.basename(f)}.cap{cap}")
            full, red = np.fromfile(base + ".f32", np.float32), np.fromfile(base + ".reduced.f32", np.float32)
            d = np.abs(full - red) if full.shape == red.shape else None
            key = f"{os.path.basename(f)} cap {cap}"
            report[key] = {"same_shape": d is not None, "equal": bool(d is not None and not d.any()),
                           "max_abs": float(d.max()) if d is not None else None,
                           "mean_abs": float(d.mean()) if d is not None else None}
            print(f"reduced decode {key}: {report[key]}", flush=True)
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "image_file_bench"))
    ap.add_argument("--work", default="/tmp/vlm-img-bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--out", default=None)
    ap.add_argument("--bench-before", default=None,
                    help="an older image_file_bench (flags --cap --iters only), timed as vlmtrain_before")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    files = write_files(a.work)
    load0 = open("/proc/loadavg").read().strip()
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load0,
            "versions": {"python": platform.python_version(), "transformers": transformers.__version__,
                         "Pillow": PIL.__version__, "torch": torch.__version__,
                         "torchvision": torchvision.__version__, "numpy": np.__version__}}
    print(json.dumps(info), flush=True)
    info["parity"] = check_parity(a.bench, files, a.work)
    info["reduced_decode"] = reduced_decode_diff(a.bench, files, a.work)
    impls = ["vlmtrain", "vlmtrain_reduced", "hf_pil", "hf_tv"] + (["vlmtrain_before"] if a.bench_before else [])
    times = {}  # (file, cap, impl) -> [seconds]
    stages, faults = {}, {}
    for r in range(a.rounds):
        for cap, max_pixels in CAPS.items():
            procs = processors(max_pixels)
            for impl in (impls if r % 2 == 0 else impls[::-1]):
                if impl.startswith("vlmtrain"):
                    bench = a.bench_before if impl == "vlmtrain_before" else a.bench
                    extra = ["--jpeg-reduced-decode"] if impl == "vlmtrain_reduced" else []
                    for f, row in run_vlmtrain(bench, files, cap, a.iters, extra=extra).items():
                        times.setdefault((f, cap, impl), []).extend(row["s"])
                        stages.setdefault((f, cap, impl), []).append(row["stages_ms"])
                        faults.setdefault((f, cap, impl), []).append(row.get("faults", -1))
                else:
                    for f in files:
                        times.setdefault((f, cap, impl), []).extend(time_hf(procs[impl], f, a.iters))
        print(f"round {r + 1}/{a.rounds} done, load {open('/proc/loadavg').read().strip()}", flush=True)
    info["load_end"] = open("/proc/loadavg").read().strip()
    rows = []
    for f in files:
        for cap in CAPS:
            ips = {impl: 1.0 / statistics.median(times[(f, cap, impl)]) for impl in impls}
            st = {impl: {k: statistics.median(s[k] for s in stages[(f, cap, impl)]) for k in stages[(f, cap, impl)][0]}
                  for impl in impls if impl.startswith("vlmtrain")}
            rows.append({"file": os.path.basename(f), "cap": cap, "images_per_s": ips, "stages_ms": st,
                         "faults_per_image": statistics.median(faults[(f, cap, "vlmtrain")]),
                         "vs_tv": ips["vlmtrain"] / ips["hf_tv"], "vs_pil": ips["vlmtrain"] / ips["hf_pil"],
                         "samples": len(times[(f, cap, "vlmtrain")]),
                         "grid": info["parity"][f"{os.path.basename(f)} cap {cap}"]["grid"]})
    info["rows"] = rows
    print("\n| file | cap | grid | vlmtrain img/s | HF default (tv) | HF Pil | vlmtrain / HF default | vlmtrain / HF Pil"
          + (" | before img/s | before / HF default" if a.bench_before else "")
          + " | reduced decode img/s (/ HF default) | stages ms: read / decode / resize / patchify |")
    print("|---" * (9 + (2 if a.bench_before else 0)) + "|")
    for r in rows:
        i, s = r["images_per_s"], r["stages_ms"]["vlmtrain"]
        before = (f" {i['vlmtrain_before']:.1f} | {i['vlmtrain_before'] / i['hf_tv']:.2f}x |" if a.bench_before else "")
        print(f"| {r['file']} | {r['cap'] or 'none'} | {r['grid'][1]}x{r['grid'][2]} | {i['vlmtrain']:.1f} | "
              f"{i['hf_tv']:.1f} | {i['hf_pil']:.1f} | **{r['vs_tv']:.2f}x** | {r['vs_pil']:.2f}x |{before} "
              f"{i['vlmtrain_reduced']:.1f} ({i['vlmtrain_reduced'] / i['hf_tv']:.2f}x) | "
              f"{s['read']:.1f} / {s['decode']:.1f} / {s['resize']:.1f} / {s['patchify']:.1f} |")
    print(f"\nload: start {load0}, end {info['load_end']}; samples per cell: {rows[0]['samples']}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(info, fh, indent=1)


if __name__ == "__main__":
    main()
