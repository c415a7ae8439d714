#!/usr/bin/env python3
"""One sparse MoE block, forward + backward, vlmtrain (bench/moe_bench) vs transformers' block
(Qwen3VLMoeTextSparseMoeBlock, or Qwen3_5MoeSparseMoeBlock with --shared > 0) with the experts
implementations in --impls (`grouped_mm`: transformers' default, torch._grouped_mm; `eager`: its
per-expert loop, which indexes the fused weight per expert, so each expert's backward fills a
whole [E, 2I, d] gradient: minutes per step at E = 128, hence not in the default), fp32 on the CPU, same shapes and threads, interleaved: each of --rounds
rounds runs vlmtrain's --reps repetitions, then HF's. The first repetition of each run is
warm-up and left out; per run the median, then the median over rounds. Prints one JSON
object: the medians and vlmtrain / HF.

  python scripts/bench_hf_moe.py --bench build/bench/moe_bench --threads 2 [--hidden 2048 ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch


def hf_times(a, impl):
    if a.shared > 0:
        from transformers import Qwen3_5MoeTextConfig as C
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock as B
        cfg = C(hidden_size=a.hidden, num_experts=a.experts, num_experts_per_tok=a.top_k,
                moe_intermediate_size=a.inter, shared_expert_intermediate_size=a.shared)
    else:
        from transformers import Qwen3VLMoeTextConfig as C
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock as B
        cfg = C(hidden_size=a.hidden, num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.inter)
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    m = B(cfg).float()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
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
    ap.add_argument("--bench", required=True, help="build/bench/moe_bench")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=2048)   # Qwen3-VL-30B-A3B's sparse layers
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--shared", type=int, default=0)
    ap.add_argument("--len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--impls", default="grouped_mm", help="transformers experts implementations, comma-separated")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cmd = [a.bench, "--hidden", str(a.hidden), "--experts", str(a.experts), "--top-k", str(a.top_k), "--inter",
           str(a.inter), "--shared", str(a.shared), "--len", str(a.len), "--batch", str(a.batch), "--reps", str(a.reps)]
    impls = a.impls.split(",")
    ours, hf = [], {i: [] for i in impls}
    for _ in range(a.rounds):
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        ours.append(statistics.median(json.loads(out.strip().splitlines()[-1])["times_s"]))
        for i in impls:
            hf[i].append(statistics.median(hf_times(a, i)))
    o = statistics.median(ours)
    res = {"shape": {k: getattr(a, k) for k in ("hidden", "experts", "top_k", "inter", "shared", "len", "batch")},
           "threads": a.threads, "rounds": a.rounds, "vlmtrain_s": o, "per_round": {"vlmtrain": ours}}
    for i in impls:
        h = statistics.median(hf[i])
        res.update({f"hf_{i}_s": h, f"vlmtrain_over_hf_{i}": o / h})
        res["per_round"][f"hf_{i}"] = hf[i]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
