#!/usr/bin/env python3
"""CPU training step at world 2, vlmtrain vs HF transformers + torch.distributed on Gloo
(issue #30 item 1, rows (b) and (c)).

Same setup as scripts/bench_hf_step.py (row (a)): one HF directory both sides load (--model,
e.g. a `vlmtrain export --dtype fp32` of a small-preset checkpoint), the same micro-batches
(vlmtrain dumps them with VLMTRAIN_DUMP_BATCHES, every rank its own; HF rank R replays rank
R's), the same AdamW groups, lr schedule, grad clip and summed-token loss, one intra-op
thread per rank (two ranks on two cores). Pairs of sharding, each with and without
activation checkpointing (vlmtrain `activation_checkpointing.match =
"model.layers.*|visual.blocks.*"`, HF `gradient_checkpointing_enable(use_reentrant=False)`):

  ddp   vlmtrain `sharding.default = "ddp"` (every unit all-DDP) vs
        torch.nn.parallel.DistributedDataParallel (bucket_cap_mb 25) on Gloo
  fsdp  vlmtrain `sharding.default = "fsdp"`, `default_strategy = "full_shard"` (every unit
        ZeRO-3) vs torch FSDP2 `fully_shard` (reshard_after_forward) on each vision block,
        the merger, each decoder layer, then the root, on a Gloo CPU mesh

vlmtrain runs as `vlmtrain launch --nproc-per-node 2` (Gloo's TCP between the ranks, the
default; VLMTRAIN_SHM_COMM=1 would opt into its shared-memory channel); torch runs two
processes on Gloo TCP (torch has no other CPU backend). Loss: each rank's summed token
cross-entropy x world / global supervised tokens (DDP and FSDP2 average gradients over
ranks), so the update is vlmtrain's. Before timing, the first --check-steps logged losses
(global mean over supervised tokens) must agree within --tol.

Timing: --rounds rounds, each alternating one vlmtrain and one HF run of --steps steps per
(sharding, ckpt); vlmtrain's step time is rank 0's metrics.jsonl `step_s`, HF's is rank 0's
wall time of forward + backward over its micro-batches + clip_grad_norm_ + AdamW + zero_grad.
Step 1 of every run is left out; per run the median of the rest; then the median over rounds.

  python scripts/bench_hf_dist.py --model HF_DIR --data SYNTH_DIR --out bench.json
"""
import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_hf_step as one  # noqa: E402  (hf_args, loadavg, rel, steady, CKPT_MATCH, vlmtrain_command)

ROOT = one.ROOT
MODES = ("ddp", "fsdp")


def vlmtrain_run(a, out_dir, mode, ckpt, dump=None):
    sets = one.vlmtrain_sets(a, out_dir, ckpt)
    sets += ["sharding.default=ddp"] if mode == "ddp" else ["sharding.default=fsdp",
                                                            "sharding.default_strategy=full_shard"]
    argv, env = one.vlmtrain_command(a, [a.vlmtrain, "launch", "--nproc-per-node", str(a.world), "train"], sets,
                                     out_dir, dump)
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "launch.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"vlmtrain failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [r for r in (json.loads(l) for l in f if l.strip()) if "step_s" in r]
    if len(rows) != a.steps:
        sys.exit(f"vlmtrain: expected {a.steps} metrics rows in {out_dir}, got {len(rows)}")
    return rows


# ---------------------------------------------------------------- HF side (one process per rank)
def hf_worker(a):
    import torch
    import torch.distributed as dist
    import hf_train_reference as ref

    torch.set_num_threads(a.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    _, M = ref.model_class(cfg["model_type"])
    model = M.from_pretrained(a.model, dtype=torch.float32, attn_implementation=a.attn).train()
    if a.ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    image_token_id = cfg.get("image_token_id", cfg.get("text_config", {}).get("image_token_id"))
    ra = one.hf_args(a)
    if a.mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        fwd_model = wrapped.module
        fwd = wrapped
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        inner = model.model
        for b in inner.visual.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(inner.visual.merger, mesh=mesh)
        for layer in inner.language_model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        fwd_model = fwd = model
    # param_groups names parameters by model.named_parameters(): the same under DDP (the
    # module) and FSDP2 (DTensor parameters, same names).
    opt = torch.optim.AdamW(ref.param_groups(fwd_model, ra), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    params = list(fwd_model.parameters())

    class Fwd:  # forward_loss calls model(...) and model.model.language_model.rotary_emb
        def __init__(self):
            self.model = fwd_model.model

        def __call__(self, **kw):
            return fwd(**kw)

    shim = Fwd()
    batches = [ref.load_step(a.dump, s) for s in range(1, a.steps + 1)]
    out = []
    dist.barrier()
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for step, mbs in enumerate(batches, start=1):
        total = max(1, sum(int((t["labels"][:, 1:] != -100).sum()) for _, _, t in mbs))  # all ranks' files
        mine = [m for m in mbs if f".rank-{rank}." in os.path.basename(m[0])]
        t0 = time.perf_counter()
        loss_total = torch.zeros(1, dtype=torch.float64)
        for _path, meta, t in mine:
            if meta["filler"] == "1":
                raise SystemExit("a filler micro-batch: DDP / FSDP2 would hang on it; use another data seed")
            loss_sum, _pos = ref.forward_loss(shim, t, image_token_id)
            (loss_sum * (world / total)).backward()
            loss_total += loss_sum.item()
        gnorm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
        if hasattr(gnorm, "full_tensor"):
            gnorm = gnorm.full_tensor()
        f = ref.lr_factor(step - 1, ra)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * f
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        dist.all_reduce(loss_total)
        out.append({"step": step, "loss": float(loss_total) / total, "grad_norm": float(gnorm), "step_s": dt,
                    "micro_batches": len(mine)})
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_util = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / (time.perf_counter() - w0)
    if rank == 0:
        with open(a.result, "w") as fh:
            json.dump({"steps": out, "cpu_util_rank0": cpu_util}, fh)
    dist.barrier()
    dist.destroy_process_group()


def hf_run(a, mode, ckpt, dump, result):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode, "--dump", dump,
            "--result", result] + (["--ckpt"] if ckpt else []) + a.passthrough
    procs = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS=str(a.threads))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"HF {mode} world {a.world} failed:\n" + "\n".join(o[-3000:] for o in outs))
    with open(result) as f:
        res = json.load(f)
    hf_run.cpu_util = res["cpu_util_rank0"]
    return res["steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--vlmtrain", default=os.path.join(ROOT, "build", "vlmtrain"))
    ap.add_argument("--work", default="/tmp/bench_hf_dist")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="ddp,fsdp")
    ap.add_argument("--samples", type=int, default=4, help="batch.samples_per_rank")
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--vit-lr", type=float, default=2e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--check-steps", type=int, default=3)
    # worker-only
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="ddp", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return hf_worker(a)
    if not a.out:
        ap.error("--out is required")
    # The worker's options: everything given here but the driver's own.
    a.passthrough = []
    for k in ("model", "data", "world", "threads", "steps", "samples", "lr", "vit_lr", "weight_decay", "grad_clip",
              "warmup", "min_lr_ratio", "attn"):
        a.passthrough += ["--" + k.replace("_", "-"), str(getattr(a, k))]
    import torch
    import transformers
    os.makedirs(a.work, exist_ok=True)
    modes = [m for m in a.modes.split(",") if m]
    info = {"world": a.world, "threads_per_rank": a.threads, "torch": torch.__version__,
            "transformers": transformers.__version__, "loadavg_start": one.loadavg(), "args": {
                k: v for k, v in vars(a).items() if k != "passthrough"}}
    t_start = time.time()
    configs = [(m, c) for m in modes for c in (False, True)]
    tagof = lambda m, c: f"{m}-{'ckpt' if c else 'nockpt'}"  # noqa: E731
    parity, dumps = {}, {}
    for mode, ckpt in configs:
        tag = tagof(mode, ckpt)
        dump = dumps[tag] = os.path.join(a.work, f"batches-{tag}")
        subprocess.run(["rm", "-rf", dump], check=True)
        v = vlmtrain_run(a, os.path.join(a.work, f"parity-{tag}"), mode, ckpt, dump=dump)
        h = hf_run(a, mode, ckpt, dump, os.path.join(a.work, f"hf-parity-{tag}.json"))
        diffs = [one.rel(vr["loss"], hr["loss"]) for vr, hr in zip(v, h)]
        gdiffs = [one.rel(vr["grad_norm"], hr["grad_norm"]) for vr, hr in zip(v, h)]
        parity[tag] = {"vlmtrain_loss": [r["loss"] for r in v], "hf_loss": [r["loss"] for r in h],
                       "loss_rel_diff": diffs, "grad_norm_rel_diff": gdiffs,
                       "micro_batches_rank0": [r["micro_batches"] for r in h]}
        print(f"parity {tag}: loss rel diff per step " + " ".join(f"{d:.1e}" for d in diffs), flush=True)
        bad = [i + 1 for i, d in enumerate(diffs[:a.check_steps]) if d > a.tol]
        if bad:
            json.dump({"info": info, "parity": parity}, open(a.out, "w"), indent=1)
            sys.exit(f"parity {tag}: steps {bad} differ by more than {a.tol} relative; not timing")

    runs = {tagof(m, c): {"vlmtrain": [], "hf": [], "hf_cpu_util": []} for m, c in configs}
    for r in range(a.rounds):
        for mode, ckpt in (configs if r % 2 == 0 else list(reversed(configs))):
            tag = tagof(mode, ckpt)
            v = vlmtrain_run(a, os.path.join(a.work, f"time-{tag}"), mode, ckpt)
            h = hf_run(a, mode, ckpt, dumps[tag], os.path.join(a.work, f"hf-time-{tag}.json"))
            runs[tag]["vlmtrain"].append([x["step_s"] for x in v])
            runs[tag]["hf"].append([x["step_s"] for x in h])
            runs[tag]["hf_cpu_util"].append(hf_run.cpu_util)
            print(f"round {r + 1} {tag}: vlmtrain {one.steady(runs[tag]['vlmtrain'][-1]):.3f} s/step, "
                  f"hf {one.steady(runs[tag]['hf'][-1]):.3f} s/step (load {one.loadavg()})", flush=True)
    summary = {}
    for tag, rr in runs.items():
        vm = statistics.median(one.steady(t) for t in rr["vlmtrain"])
        hm = statistics.median(one.steady(t) for t in rr["hf"])
        summary[tag] = {"vlmtrain_step_s": vm, "hf_step_s": hm, "ratio_vlmtrain_over_hf": vm / hm,
                        "vlmtrain_rounds": [one.steady(t) for t in rr["vlmtrain"]],
                        "hf_rounds": [one.steady(t) for t in rr["hf"]]}
        print(f"{tag}: vlmtrain {vm:.3f} s/step, HF {hm:.3f} s/step, ratio {vm / hm:.2f}", flush=True)
    info["loadavg_end"] = one.loadavg()
    info["wall_s"] = time.time() - t_start
    json.dump({"info": info, "parity": parity, "runs": runs, "summary": summary}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
