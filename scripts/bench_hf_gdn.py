#!/usr/bin/env python3
"""One Gated DeltaNet layer, forward + backward, vlmtrain (bench/gdn_bench) vs transformers'
Qwen3_5GatedDeltaNet (its torch path: torch_chunk_gated_delta_rule, the fallback when no
fused kernel is installed), fp32 on the CPU, same shapes and threads, interleaved: each of
--rounds rounds runs vlmtrain's --reps repetitions, then HF's. The first repetition of each
run is warm-up and left out; per run the median, then the median over rounds. Prints one
JSON object: the medians and vlmtrain / HF.

  python scripts/bench_hf_gdn.py --bench build/bench/gdn_bench --threads 2 [--hidden 1024 ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch


def hf_times(a):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    cfg = Qwen3_5TextConfig(hidden_size=a.hidden, linear_num_key_heads=a.k_heads, linear_num_value_heads=a.v_heads,
                            linear_key_head_dim=a.head_dim, linear_value_head_dim=a.head_dim,
                            linear_conv_kernel_dim=4, num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(0)
    m = Qwen3_5GatedDeltaNet(cfg, 0).float()
    x = torch.randn(a.batch, a.len, a.hidden, requires_grad=True)
    w = torch.randn(a.batch, a.len, a.hidden)
    times = []
    for r in range(a.reps + 1):
        t0 = time.perf_counter()
        (m(x) * w).sum().backward()
        s = time.perf_counter() - t0
        if r > 0:
            times.append(s)
        m.zero_grad(set_to_none=True)
        x.grad = None
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="build/bench/gdn_bench")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024)   # Qwen3.5-0.8B's linear layers
    ap.add_argument("--k-heads", type=int, default=16)
    ap.add_argument("--v-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cmd = [a.bench, "--hidden", str(a.hidden), "--k-heads", str(a.k_heads), "--v-heads", str(a.v_heads),
           "--head-dim", str(a.head_dim), "--len", str(a.len), "--batch", str(a.batch), "--reps", str(a.reps)]
    ours, theirs = [], []
    for _ in range(a.rounds):
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        ours.append(statistics.median(json.loads(out.strip().splitlines()[-1])["times_s"]))
        theirs.append(statistics.median(hf_times(a)))
    o, h = statistics.median(ours), statistics.median(theirs)
    print(json.dumps({"shape": {k: getattr(a, k) for k in ("hidden", "k_heads", "v_heads", "head_dim", "len", "batch")},
                      "threads": a.threads, "rounds": a.rounds, "vlmtrain_s": o, "hf_s": h,
                      "vlmtrain_over_hf": o / h, "per_round": {"vlmtrain": ours, "hf": theirs}}))


if __name__ == "__main__":
    main()
