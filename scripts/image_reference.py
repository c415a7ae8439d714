#!/usr/bin/env python3
"""HF image-processor references for tests/data/image_hf_parity_test.cpp, made at test time.

Writes a set of image files with Pillow (one per behaviour to check), then runs the pinned
transformers' Qwen2-VL image processors on each file *path*, the way the processor (and
apply_chat_template, which hands paths to it) loads images:

  tv   Qwen2VLImageProcessor (torchvision backend): the class AutoImageProcessor /
       AutoProcessor picks by default. Loads a path with image_utils.load_image_as_tensor
       (torchvision.io.decode_image, mode RGB, EXIF orientation applied).
  pil  Qwen2VLImageProcessorPil (Pillow backend, backend="pil"). Loads a path with
       image_utils.load_image (PIL.Image.open, ImageOps.exif_transpose, convert("RGB")).

--processor qwen2_vl (default): both are built from Qwen2-VL's preprocessor_config.json
values (no hub access): min_pixels 3136, max_pixels 12845056 (overridden per case), patch
14, merge 2, temporal 2, CLIP mean/std, bicubic, on every case below.
--processor qwen3_vl: Qwen3-VL's hub values (Qwen3-VL uses the same Qwen2-VL image
processor classes): size {shortest_edge 65536, longest_edge 16777216}, patch 16, merge 2,
temporal 2, mean/std 0.5, bicubic, on a smaller set (the decoders are shared with Qwen2;
what differs is the geometry and the normalisation): up- and downscaling, EXIF, alpha, a
pixel cap, a token cap (max_pixels = N x 32 x 32), aspect ~200 and min_pixels.
Where both loaders are wrong by our judgement (docs/image_parity.md), the case names
another reference, also computed with HF's Pillow processor:

  pil_image  the Pillow processor given the opened, EXIF-transposed PIL image (not a path):
             its convert_to_rgb composites alpha over white (PIL.Image.alpha_composite).
  high_byte  the Pillow processor given the uint8 array v >> 8 of a 16-bit image (what
             Pillow itself decodes a 16-bit RGB PNG to).

Written under --out:
  <case>.<ext>                 the image file
  <case>.ref.safetensors       <proc>.pixel_values [patches, 1176] f32,
                               <proc>.image_grid_thw [1, 3] i64 for every proc that ran
  manifest.json                {"transformers", "torch", "torchvision", "pillow",
                                "processor": {"name", "patch_size", "merge_size",
                                "temporal_patch_size", "image_mean", "image_std"},
                                "cases": [{"name", "file", "min_pixels", "max_pixels",
                                "max_image_tokens", "reference", "errors": {proc: msg}}]}

Usage: python scripts/image_reference.py --out DIR [--processor qwen2_vl|qwen3_vl]
(needs transformers, torch, torchvision, Pillow, numpy, safetensors)
"""
import argparse
import io
import json
import os
import struct
import sys
import warnings
import zlib

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image, ImageOps
from safetensors.torch import save_file
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

# The processors' settings: each family's hub preprocessor_config.json.
PROCESSORS = {
    "qwen2_vl": dict(min_pixels=3136, max_pixels=12845056, patch_size=14, merge_size=2,
                     temporal_patch_size=2, image_mean=[0.48145466, 0.4578275, 0.40821073],
                     image_std=[0.26862954, 0.26130258, 0.27577711]),
    "qwen3_vl": dict(min_pixels=65536, max_pixels=16777216, patch_size=16, merge_size=2,
                     temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
}
PROC = PROCESSORS["qwen2_vl"]  # set by main() from --processor


def content(h, w, seed):
    """[h, w, 3] uint8: gradients, stripes and noise (edges for the resize, texture for JPEG)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127.5 + 127.5 * np.sin(x / max(w, 1) * 6.0 + y / max(h, 1) * 2.0)
    g = 255.0 * ((x // 7 + y // 5) % 2)
    b = 255.0 * y / max(h - 1, 1)
    img = np.stack([r, g, b], -1) + rng.normal(0, 20, (h, w, 3))
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def exif_bytes(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def png_16bit(path, arr):
    """Writes a 16-bit PNG (gray [h, w], RGB [h, w, 3] or RGBA [h, w, 4] uint16); Pillow
    cannot write these."""
    h, w = arr.shape[:2]
    color_type = 0 if arr.ndim == 2 else {3: 2, 4: 6}[arr.shape[2]]
    rows = arr.astype(">u2").reshape(h, -1).tobytes()
    stride = len(rows) // h
    raw = b"".join(b"\x00" + rows[i * stride:(i + 1) * stride] for i in range(h))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) +
                chunk(b"IEND", b""))


def case_adder(out, cases):
    """add(name, ext, writer, ...): writes one image file and records its case."""
    token_pixels = (PROC["patch_size"] * PROC["merge_size"]) ** 2  # one merged token

    def add(name, ext, writer, reference="pil", min_pixels=None, max_pixels=None,
            max_image_tokens=0):
        min_pixels = PROC["min_pixels"] if min_pixels is None else min_pixels
        max_pixels = PROC["max_pixels"] if max_pixels is None else max_pixels
        path = os.path.join(out, f"{name}.{ext}")
        writer(path)
        cases.append(dict(name=name, file=os.path.basename(path), reference=reference,
                          min_pixels=min_pixels,
                          max_pixels=max_image_tokens * token_pixels if max_image_tokens else max_pixels,
                          max_image_tokens=max_image_tokens))
    return add


def write_cases_qwen3(out):
    """The Qwen3-VL set: 16-px patches, mean/std 0.5, 65536 .. 16777216 pixels."""
    cases = []
    add = case_adder(out, cases)
    base = content(77, 123, 1)  # 9471 px: below min_pixels, scaled up
    add("baseline_jpeg", "jpg", lambda p: Image.fromarray(base).save(p, quality=90))
    add("exif_6", "jpg", lambda p: Image.fromarray(base).save(p, quality=92, exif=exif_bytes(6)))
    alpha = content(77, 123, 2)[..., 1]
    alpha[:20, :30] = 0
    add("rgba_png", "png", lambda p: Image.fromarray(np.dstack([base, alpha]), "RGBA").save(p),
        reference="pil_image")
    add("gray_png", "png", lambda p: Image.fromarray(base[..., 0]).save(p))
    mid = content(333, 517, 12)  # 172161 px: inside the limits, sides not multiples of 32
    add("mid_png", "png", lambda p: Image.fromarray(mid).save(p))
    add("mid_webp", "webp", lambda p: Image.fromarray(mid).save(p, lossless=True))
    big = content(1500, 2000, 11)
    add("over_max_pixels", "jpg", lambda p: Image.fromarray(big).save(p, quality=90),
        max_pixels=262144)
    add("over_token_cap", "jpg", lambda p: Image.fromarray(big).save(p, quality=90),
        max_image_tokens=100)
    add("token_cap_mid", "png", lambda p: Image.fromarray(mid).save(p), max_image_tokens=77)
    add("tiny_10x10", "png", lambda p: Image.fromarray(content(10, 10, 6)).save(p))
    add("aspect_200_wide", "png", lambda p: Image.fromarray(content(32, 6400, 9)).save(p))
    add("aspect_207_wide", "png", lambda p: Image.fromarray(content(27, 5600, 10)).save(p))
    add("min_pixels_up", "png", lambda p: Image.fromarray(base).save(p), min_pixels=300000)
    return cases


def write_cases(out):
    """Writes the image files; returns the case list (without results)."""
    cases = []
    add = case_adder(out, cases)

    base = content(77, 123, 1)  # h 77, w 123: not multiples of 28, so every case resizes
    for o in range(1, 9):
        add(f"exif_{o}", "jpg", lambda p, o=o: Image.fromarray(base).save(p, quality=92, exif=exif_bytes(o)))
    add("exif_6_png", "png", lambda p: Image.fromarray(base).save(p, exif=exif_bytes(6)))
    add("exif_8_webp", "webp", lambda p: Image.fromarray(base).save(p, lossless=True, exif=exif_bytes(8)))
    add("baseline_jpeg", "jpg", lambda p: Image.fromarray(base).save(p, quality=90))
    add("progressive_jpeg", "jpg", lambda p: Image.fromarray(base).save(p, quality=90, progressive=True))
    add("jpeg_444", "jpg", lambda p: Image.fromarray(base).save(p, quality=95, subsampling=0))
    add("cmyk_jpeg", "jpg", lambda p: Image.fromarray(base).convert("CMYK").save(p, quality=92))
    add("gray_jpeg", "jpg", lambda p: Image.fromarray(base[..., 1]).save(p, quality=90))
    add("rgb_png", "png", lambda p: Image.fromarray(base).save(p))
    add("gray_png", "png", lambda p: Image.fromarray(base[..., 0]).save(p))
    alpha = content(77, 123, 2)[..., 1]
    alpha[:20, :30] = 0    # fully transparent corner (hidden colour must not show)
    alpha[-20:, -30:] = 255
    add("rgba_png", "png", lambda p: Image.fromarray(np.dstack([base, alpha]), "RGBA").save(p),
        reference="pil_image")
    add("la_png", "png", lambda p: Image.fromarray(np.dstack([base[..., 0], alpha]), "LA").save(p),
        reference="pil_image")

    def palette(p):
        im = Image.fromarray(base).quantize(32, dither=Image.Dither.NONE)
        im.save(p, transparency=5)  # one fully transparent palette index
    add("palette_trns_png", "png", palette)
    add("palette_png", "png", lambda p: Image.fromarray(base).quantize(64).save(p))

    def palette_alpha(p):  # tRNS with partial alpha per index: Pillow's P->RGB drops it
        im = Image.fromarray(base).quantize(32, dither=Image.Dither.NONE)
        im.save(p, transparency=bytes((37 * i) % 256 for i in range(32)))
    add("palette_alpha_png", "png", palette_alpha, reference="pil_image")
    g16 = (content(77, 123, 3)[..., 0].astype(np.uint16) * 257 +
           np.random.default_rng(4).integers(0, 257, (77, 123))).astype(np.uint16)
    add("gray16_png", "png", lambda p: png_16bit(p, g16), reference="high_byte")
    rgb16 = (base.astype(np.uint16) * 256 + np.random.default_rng(5).integers(0, 256, base.shape)).astype(np.uint16)
    add("rgb16_png", "png", lambda p: png_16bit(p, rgb16))
    a16 = (alpha.astype(np.uint16) * 257).astype(np.uint16)
    add("rgba16_png", "png", lambda p: png_16bit(p, np.dstack([rgb16, a16])), reference="pil_image")
    add("lossless_webp", "webp", lambda p: Image.fromarray(base).save(p, lossless=True))
    add("lossy_webp", "webp", lambda p: Image.fromarray(base).save(p, quality=80))
    add("tiny_10x10", "png", lambda p: Image.fromarray(content(10, 10, 6)).save(p))
    add("tiny_5x21", "png", lambda p: Image.fromarray(content(5, 21, 7)).save(p))
    add("aspect_200_tall", "png", lambda p: Image.fromarray(content(5600, 28, 8)).save(p))
    add("aspect_200_wide", "png", lambda p: Image.fromarray(content(28, 5600, 9)).save(p))
    add("aspect_200_capped", "png", lambda p: Image.fromarray(content(28, 5600, 9)).save(p),
        max_pixels=40000)
    add("aspect_207_wide", "png", lambda p: Image.fromarray(content(27, 5600, 10)).save(p))
    big = content(1500, 2000, 11)
    add("over_max_pixels", "jpg", lambda p: Image.fromarray(big).save(p, quality=90),
        max_pixels=200704)
    add("over_token_cap", "jpg", lambda p: Image.fromarray(big).save(p, quality=90),
        max_image_tokens=100)
    add("min_pixels_up", "png", lambda p: Image.fromarray(base).save(p), min_pixels=200000)
    return cases


def processors(min_pixels, max_pixels):
    kw = dict(PROC, min_pixels=min_pixels, max_pixels=max_pixels, resample=3, do_convert_rgb=True)
    return {"tv": Qwen2VLImageProcessor(**kw), "pil": Qwen2VLImageProcessorPil(**kw)}


def run_case(out, case):
    """Runs both processors on the path (and the case's own reference); saves the tensors."""
    path = os.path.join(out, case["file"])
    procs = processors(case["min_pixels"], case["max_pixels"])
    inputs = {"tv": ("tv", path), "pil": ("pil", path)}
    if case["reference"] == "pil_image":
        inputs["pil_image"] = ("pil", ImageOps.exif_transpose(Image.open(path)))
    elif case["reference"] == "high_byte":
        inputs["high_byte"] = ("pil", high_byte_rgb(path))
    tensors, errors = {}, {}
    for name, (proc, image) in inputs.items():
        try:
            o = procs[proc](images=[image], return_tensors="pt")
        except Exception as e:  # recorded: the C++ test decides whether an error is expected
            errors[name] = f"{type(e).__name__}: {e}"
            continue
        tensors[f"{name}.pixel_values"] = o["pixel_values"].to(torch.float32).contiguous()
        tensors[f"{name}.image_grid_thw"] = o["image_grid_thw"].to(torch.int64).contiguous()
    if tensors:
        save_file(tensors, os.path.join(out, f"{case['name']}.ref.safetensors"))
    case["errors"] = errors


def high_byte_rgb(path):
    """[h, w, 3] uint8: the 16-bit PNG's samples >> 8, grey replicated (libpng, no Pillow)."""
    with open(path, "rb") as f:
        data = f.read()
    pos, idat, w, h, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 16, f"{path}: expected a 16-bit PNG, got depth {depth}"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    ch = {0: 1, 2: 3}[ctype]
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + w * ch * 2)
    assert (raw[:, 0] == 0).all(), f"{path}: only filter type 0 is read here"
    v = raw[:, 1:].reshape(h, w, ch, 2)[..., 0]  # big-endian: the first byte is the high byte
    return np.repeat(v, 3, axis=-1) if ch == 1 else np.ascontiguousarray(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--processor", choices=sorted(PROCESSORS), default="qwen2_vl")
    args = ap.parse_args()
    global PROC
    PROC = PROCESSORS[args.processor]
    os.makedirs(args.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    cases = (write_cases_qwen3 if args.processor == "qwen3_vl" else write_cases)(args.out)
    for case in cases:
        run_case(args.out, case)
    processor = {k: v for k, v in PROC.items() if k not in ("min_pixels", "max_pixels")}
    manifest = dict(transformers=transformers.__version__, torch=torch.__version__,
                    torchvision=torchvision.__version__, pillow=PIL.__version__,
                    numpy=np.__version__, processor=dict(processor, name=args.processor),
                    cases=cases)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"image_reference ({args.processor}): {len(cases)} cases, transformers {transformers.__version__}, "
          f"Pillow {PIL.__version__}, torchvision {torchvision.__version__} -> {args.out}")


if __name__ == "__main__":
    sys.exit(main())
