#!/usr/bin/env python3
"""Tokenizer encode throughput, vlmtrain vs HF `tokenizers` (Rust), one thread each, the
same documents, interleaved rounds (issue #30 item 3).

    .venv/bin/python scripts/bench_tokenizer_hf.py --tokenizer "$(.venv/bin/python scripts/qwen_tokenizer_path.py --file)" \
        --bench build/bench/tokenizer_bench --mb 4 --rounds 5 --out /tmp/tok.json

Each round runs build/bench/tokenizer_bench (which writes its documents with --write-docs:
the conformance corpus generator's multilingual mixtures, ~4 KB documents, fixed seeds) and
then encodes the same documents with tokenizers.Tokenizer.from_file(...).encode(doc,
add_special_tokens=False), one document at a time, RAYON_NUM_THREADS=1. Before timing, the
token counts must be equal (ids are checked string by string by
tests/vlm/text/tokenizer_qwen_test.cpp). Reported: MB/s per side (warm pass: the second pass
over the documents; HF has no cache to warm, its second pass is reported the same way),
the median over rounds, and vlmtrain / HF.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def hf_pass(tok, docs):
    t0 = time.perf_counter()
    n = 0
    for d in docs:
        n += len(tok.encode(d, add_special_tokens=False).ids)
    return time.perf_counter() - t0, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--bench", default="build/bench/tokenizer_bench")
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    docs_file = args.out + ".docs.json"
    rows = []
    load_start = open("/proc/loadavg").read().strip()
    for r in range(args.rounds):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run([args.bench, args.tokenizer, str(args.mb), "--json", "--write-docs", docs_file],
                             capture_output=True, text=True, env=env, check=True).stdout
        ours = json.loads(out.strip().splitlines()[-1])
        with open(docs_file, encoding="utf-8") as f:
            docs = json.load(f)
        cold_s, n_hf = hf_pass(tok, docs)
        warm_s, _ = hf_pass(tok, docs)
        if n_hf != ours["tokens"]:
            sys.exit(f"token counts differ: vlmtrain {ours['tokens']}, tokenizers {n_hf}")
        mb = ours["bytes"] / 1e6
        rows.append(dict(round=r + 1, mb=mb, tokens=n_hf, vlmtrain_cold=mb / ours["cold_s"],
                         vlmtrain_warm=mb / ours["warm_s"], hf_cold=mb / cold_s, hf_warm=mb / warm_s))
        print(f"round {r + 1}: vlmtrain {rows[-1]['vlmtrain_warm']:.2f} MB/s (cold {rows[-1]['vlmtrain_cold']:.2f}), "
              f"tokenizers {rows[-1]['hf_warm']:.2f} MB/s (first pass {rows[-1]['hf_cold']:.2f})", file=sys.stderr)
    med = {k: statistics.median(r[k] for r in rows) for k in ("vlmtrain_cold", "vlmtrain_warm", "hf_cold", "hf_warm")}
    summary = dict(med, ratio_warm=med["vlmtrain_warm"] / med["hf_warm"], ratio_cold=med["vlmtrain_cold"] / med["hf_cold"],
                   tokenizers=tokenizers.__version__, python=platform.python_version(), tokens=rows[0]["tokens"],
                   mb=rows[0]["mb"], loadavg_start=load_start, loadavg_end=open("/proc/loadavg").read().strip())
    with open(args.out, "w") as f:
        json.dump(dict(rows=rows, summary=summary), f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
