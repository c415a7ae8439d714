#!/usr/bin/env python3
"""Writes a photo-like image set for the loader bench (bench/loader_bench, issue #30 item 4):
N JPEGs (quality 90, 4:2:0) of mixed camera sizes, smooth gradients + soft blobs + sensor
noise (the kind of content scripts/bench_image_hf.py uses), and OUT/train.jsonl in the plain
OCR format {"image": ..., "text": ...}, the texts taken from a synth-ocr set's train.jsonl
(--texts) so that the synth set's tokenizer covers them.

    .venv/bin/python scripts/bench/make_photo_set.py --out DIR --texts SYNTH/train.jsonl [--n 48]

Sizes cycle through 640x480, 1024x768, 1600x1200, 3000x2000 (W x H). Deterministic (--seed).
"""
import argparse
import json
import os

import numpy as np
from PIL import Image

SIZES = [(640, 480), (1024, 768), (1600, 1200), (3000, 2000)]


def photo(w, h, rng):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    ph = rng.uniform(0, 6.28, 3)
    img = np.stack([128 + 100 * np.sin(x / w * 3.1 + y / h * 1.7 + ph[0]),
                    128 + 90 * np.cos(y / h * 4.3 - x / w + ph[1]),
                    60 + 150 * (y / h) + 20 * np.sin(ph[2])], -1)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.05, 0.3) * min(w, h)
        img += rng.uniform(-80, 80, 3) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None]
    img += rng.normal(0, 6, img.shape)
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--texts", required=True, help="a synth-ocr train.jsonl (its texts become the answers)")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    texts = [json.loads(l)["text"] for l in open(a.texts) if l.strip()]
    os.makedirs(os.path.join(a.out, "images"), exist_ok=True)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.out, "train.jsonl"), "w") as f:
        for i in range(a.n):
            w, h = SIZES[i % len(SIZES)]
            name = f"images/{i:04d}_{w}x{h}.jpg"
            path = os.path.join(a.out, name)
            if not os.path.exists(path):
                photo(w, h, rng).save(path, quality=90, subsampling=2)
            f.write(json.dumps({"image": name, "text": texts[i % len(texts)]}) + "\n")
    print(json.dumps({"out": a.out, "images": a.n, "sizes": SIZES}))


if __name__ == "__main__":
    main()
