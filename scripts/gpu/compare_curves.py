#!/usr/bin/env python3
"""Two runs of one recipe (metrics.jsonl of each: CUDA, CPU), side by side, as markdown.

    python3 scripts/gpu/compare_curves.py CUDA_METRICS CPU_METRICS [--names=CUDA,CPU]
                                          [--max-rel=TOL] [--expect-steps=N]

Losses at the steps both runs reached (every step up to 10, then a log-spaced pick, and the
last common step), with |cuda - cpu| / cpu; the largest relative difference over the first
10 steps and over all common steps; each run's median tokens/s, step time, MFU and memory
(tensor peak vs plan); and the evals of the first run (the CUDA run's CER curve).

--max-rel=TOL: a last line "verdict: ..." and exit 1 when the largest relative difference over
the common steps exceeds TOL; --expect-steps=N: exit 1 unless both runs logged steps 1..N
(scripts/gpu/nccl_check.sh uses both).
"""
import json
import statistics
import sys


def read(path):
    train, evals = {}, []
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                train[j["step"]] = j
            elif any(k.startswith("eval/") for k in j):
                evals.append(j)
    return train, evals


def med(rows, key):
    v = [r[key] for r in rows if key in r]
    return statistics.median(v) if v else float("nan")


def option(name, default=None):
    return next((x.split("=", 1)[1] for x in sys.argv[1:] if x.startswith(name + "=")), default)


def main():
    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    names = option("--names", "CUDA,CPU").split(",")
    max_rel, expect = option("--max-rel"), option("--expect-steps")
    (a, a_evals), (b, _) = read(args[0]), read(args[1])
    common = sorted(set(a) & set(b))
    print(f"# Loss curves: {names[0]} ({len(a)} steps logged) vs {names[1]} ({len(b)} steps logged)\n")
    if not common:
        print("no common steps")
        return 1
    rel = {s: abs(a[s]["loss"] - b[s]["loss"]) / max(1e-12, abs(b[s]["loss"])) for s in common}
    pick = [s for s in common if s <= 10 or s in (20, 50, 100, 200, 500, 1000, 2000)] + [common[-1]]
    print(f"| step | loss {names[0]} | loss {names[1]} | rel diff |\n|---|---|---|---|")
    for s in sorted(set(pick)):
        print(f"| {s} | {a[s]['loss']:.6f} | {b[s]['loss']:.6f} | {rel[s]:.2e} |")
    first = [rel[s] for s in common if s <= 10]
    print(f"\nmax rel diff, steps 1-10: {max(first):.2e}; over all {len(common)} common steps: "
          f"{max(rel.values()):.2e} (step {max(rel, key=rel.get)})\n")
    print("| run | tokens/s | step s | MFU % | tensor peak MiB | planned MiB |\n|---|---|---|---|---|---|")
    for name, rows in ((names[0], list(a.values())), (names[1], list(b.values()))):
        rows = rows[5:] or rows  # the first steps warm up
        print(f"| {name} | {med(rows, 'tokens_per_s'):.0f} | {med(rows, 'step_s'):.4f} | "
              f"{100 * med(rows, 'mfu'):.2f} | {med(rows, 'tensor_peak_bytes') / 2**20:.1f} | "
              f"{med(rows, 'tensor_peak_planned_bytes') / 2**20:.1f} |")
    if a_evals:
        keys = sorted({k for e in a_evals for k in e if k.startswith("eval/overall/") and k != "eval/overall/n"})
        print(f"\n{names[0]} run's evals:\n\n| step | full | " + " | ".join(k[13:] for k in keys) + " |")
        print("|---|---|" + "---|" * len(keys))
        for e in a_evals:
            print(f"| {e['step']} | {e.get('eval_full', False)} | " +
                  " | ".join(f"{e[k]:.4f}" if isinstance(e.get(k), (int, float)) else "-" for k in keys) + " |")
    ok = True
    if expect is not None:
        want = set(range(1, int(expect) + 1))
        for name, run in ((names[0], a), (names[1], b)):
            if not want <= set(run):
                print(f"\nverdict: FAILED: {name} logged {len(set(run) & want)} of steps 1-{expect}")
                ok = False
    if max_rel is not None:
        worst = max(rel.values())
        verdict = "ok" if worst <= float(max_rel) else "FAILED"
        print(f"\nverdict: {verdict}: max rel diff {worst:.2e} over {len(common)} common steps "
              f"{'<=' if worst <= float(max_rel) else '>'} {float(max_rel):.2e}")
        ok = ok and worst <= float(max_rel)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
