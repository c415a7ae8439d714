#!/usr/bin/env python3
"""The GPU bench's JSON lines (scripts/gpu/device_run.sh bench) as a markdown table.

    python3 scripts/gpu/bench_table.py BENCH_JSONL [ENV_TXT]

One row per (bench row, implementation): median over rounds of step time, tokens/s, MFU
(both sides' PaLM convention, stated in their JSON), peak CUDA memory (allocator peak of
tensors), vlmtrain's planned peak next to its measured one; then vlmtrain / HF ratios of
tokens/s and peak memory per bench row. Targets (issue #23): tokens/s >= 1.2x HF, MFU >= 45%
for the full fine-tune, measured peak within 10% of the plan.
"""
import collections
import json
import statistics
import sys


def main():
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
    if len(sys.argv) > 2:
        print("```\n" + open(sys.argv[2]).read().strip() + "\n```\n")
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["row"], r.get("impl", "vlmtrain"))].append(r)
    med = lambda rs, k: statistics.median([r[k] for r in rs if k in r]) if any(k in r for r in rs) else float("nan")
    print("| row | impl | rounds | step s | tokens/s | MFU % | peak GiB | planned GiB | planned / peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (row, impl), rs in by.items():
        peak, plan = med(rs, "peak_device_bytes"), med(rs, "planned_peak_bytes")
        mfu = med(rs, "mfu")
        print(f"| {row} | {impl} | {len(rs)} | {med(rs, 'step_s'):.3f} | {med(rs, 'tokens_per_s'):.0f} | "
              f"{100 * mfu:.1f} | {peak / 2**30:.2f} | "
              + (f"{plan / 2**30:.2f} | {plan / peak:.3f} |" if plan == plan and peak > 0 else "- | - |"))
    print("\n| row | vlmtrain / HF tokens/s (target >= 1.2x) | vlmtrain MFU (full: target >= 45%) | "
          "planned / measured peak (target within 10%) | vlmtrain / HF peak memory |\n|---|---|---|---|---|")
    verdict = lambda ok: "met" if ok else "missed"
    for row in dict.fromkeys(r["row"] for r in rows):
        v, h = by.get((row, "vlmtrain")), by.get((row, "hf-transformers"))
        if not v or not h:
            continue
        speed = med(v, "tokens_per_s") / med(h, "tokens_per_s")
        mfu = med(v, "mfu")
        pv, ph, plan = med(v, "peak_device_bytes"), med(h, "peak_device_bytes"), med(v, "planned_peak_bytes")
        print(f"| {row} | {speed:.2f}x {verdict(speed >= 1.2)} | "
              + (f"{100 * mfu:.1f}% {verdict(mfu >= 0.45)} | " if row.startswith("full") else "- | ")
              + (f"{plan / pv:.3f} {verdict(abs(plan / pv - 1) <= 0.10)} | " if pv > 0 and plan == plan else "- | ")
              + (f"{pv / ph:.2f}x |" if ph > 0 else "- |"))
    conv = {r.get("impl", "vlmtrain"): r.get("mfu_convention", "PaLM, as step_bench") for r in rows}
    peak = next((r["peak_tflops"] for r in rows if "peak_tflops" in r), 989)
    print(f"\nMFU convention: {conv.get('vlmtrain', '-')}; peak {peak} "
          "TFLOP/s dense bf16; LoRA rows carry no MFU (0).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
