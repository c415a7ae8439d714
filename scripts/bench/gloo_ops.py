#!/usr/bin/env python3
"""Times Gloo's CPU collectives the ways sharding/dist/comm.cpp could issue them, on the
environment's torch (the PyTorch 2.11 wheel in .venv, the same Gloo as the LibTorch the C++
links). The Comm layer's Gloo fallbacks date from LibTorch 1.13, whose Gloo had no flat
collectives and no 2-byte float reductions: an all-gather as one broadcast per rank into
views of the output, a reduce-scatter as an all-to-all + local sum, bf16/fp16 reduced by
all-reducing a fp32 copy (and moved as raw uint8 bytes). One run compares each fallback with
the native op torch 2.x may have, on the same flat buffer:

  all-gather fp32       Gloo all_gather (list of views) | one broadcast per rank (fallback)
                        | native all_gather_into_tensor (flat)
  reduce-scatter fp32   all-reduce in place | all-to-all + local sum (fallback)
                        | native reduce_scatter_tensor
  all-reduce bf16       all-reduce of a fp32 copy, cast back (fallback) | native bf16 all_reduce
  reduce-scatter bf16   all-to-all of raw bytes + local fp32 sum (fallback)
                        | native reduce_scatter_tensor on bf16
  all-gather bf16       broadcasts of uint8 views (fallback) | native all_gather_into_tensor

    .venv/bin/python scripts/bench/gloo_ops.py [--world 2] [--mb 11,82] [--reps 5] [--dtype-check]

MB is the size of the full fp32 flat buffer (the all-reduced tensor, the all-gather's
output, the reduce-scatter's input); 82 MB is half the small preset's fp32 parameters, 11 MB
an FSDP unit. The bf16 rows use the same number of elements (MB / 2 bytes). --mb takes a
comma-separated list and runs each size in turn.

Before timing, each native op is checked against its fallback on small random data (exact
for all-gathers, allclose for sums; the fallbacks are themselves checked against a locally
computed reference). A native op that raises, or returns a wrong result, gets that text in
its row instead of a time. --dtype-check runs only these checks and prints their outcome.

Prints, per way, milliseconds per op and the CPU (user + system) it cost rank 0.
"""
import argparse
import os
import resource
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BF16 = torch.bfloat16
NAME_W = 60


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---------------------------------------------------------------- the ways, as comm.cpp issues them
# Each takes (out, inp) like the Comm op it stands for and leaves its result in `out`
# (all-reduces: in `inp`, in place). world/rank come from the process group.

def ag_list(out, inp):  # Gloo's own all-gather into views of `out`
    dist.all_gather(list(out.view(-1).chunk(dist.get_world_size())), inp)


def ag_broadcasts(out, inp):
    """The Comm fallback: own slice copied in, then one broadcast per rank of its slice, straight
    into the views of `out`; 2-byte floats as their raw bytes (uint8 views)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    o, i = out.view(-1), inp.view(-1)
    if o.dtype in (torch.bfloat16, torch.float16):
        o, i = o.view(torch.uint8), i.view(torch.uint8)
    s = i.numel()
    o[rank * s:(rank + 1) * s].copy_(i)
    works = [dist.broadcast(o[r * s:(r + 1) * s], r, async_op=True) for r in range(world)]
    for w in works:
        w.wait()


def ag_native(out, inp):  # flat all-gather (ProcessGroup::_allgather_base)
    dist.all_gather_into_tensor(out, inp)


def ar_inplace(out, inp):  # reduce-scatter as an in-place all-reduce of the whole input
    dist.all_reduce(inp)


def rs_alltoall(out, inp):
    """The Comm fallback: an all-to-all sends chunk k of `inp` to rank k (2-byte floats as raw
    bytes), then this rank sums the N chunks it received (2-byte floats in fp32)."""
    world = dist.get_world_size()
    half = inp.dtype in (torch.bfloat16, torch.float16)
    send = inp.view(-1).view(torch.uint8) if half else inp.view(-1)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    if half:
        out.view(-1).copy_(recv.view(inp.dtype).float().view(world, -1).sum(0))
    else:
        torch.sum(recv.view(world, -1), 0, out=out.view(-1))


def rs_native(out, inp):  # flat reduce-scatter (ProcessGroup::_reduce_scatter_base)
    dist.reduce_scatter_tensor(out, inp)


def ar_fp32_copy(out, inp):  # the Comm fallback for 2-byte floats: all-reduce a fp32 copy
    buf = inp.float()
    dist.all_reduce(buf)
    inp.copy_(buf)


def ar_native(out, inp):  # native all-reduce in the tensor's own dtype
    dist.all_reduce(inp)


# (group, label, fn, kind, dtype, native): kind picks the buffers (ag: out [N*S] <- in [S];
# rs: out [S] <- in [N*S]; ar: in [N*S] in place); a native way is checked against the
# fallback (the first fallback row of its group) before it is timed.
WAYS = [
    ("all-gather fp32", "Gloo all_gather (list of views)", ag_list, "ag", torch.float32, False),
    ("all-gather fp32", "one broadcast per rank (fallback)", ag_broadcasts, "ag", torch.float32, False),
    ("all-gather fp32", "native all_gather_into_tensor", ag_native, "ag", torch.float32, True),
    ("reduce-scatter fp32", "all-reduce in place", ar_inplace, "ar", torch.float32, False),
    ("reduce-scatter fp32", "all-to-all + local sum (fallback)", rs_alltoall, "rs", torch.float32, False),
    ("reduce-scatter fp32", "native reduce_scatter_tensor", rs_native, "rs", torch.float32, True),
    ("all-reduce bf16", "fp32 copy + cast back (fallback)", ar_fp32_copy, "ar", BF16, False),
    ("all-reduce bf16", "native bf16 all_reduce", ar_native, "ar", BF16, True),
    ("reduce-scatter bf16", "all-to-all bytes + fp32 sum (fallback)", rs_alltoall, "rs", BF16, False),
    ("reduce-scatter bf16", "native reduce_scatter_tensor", rs_native, "rs", BF16, True),
    ("all-gather bf16", "broadcasts of uint8 views (fallback)", ag_broadcasts, "ag", BF16, False),
    ("all-gather bf16", "native all_gather_into_tensor", ag_native, "ag", BF16, True),
]
FALLBACK = {"all-gather fp32": ag_broadcasts, "reduce-scatter fp32": rs_alltoall,
            "all-reduce bf16": ar_fp32_copy, "reduce-scatter bf16": rs_alltoall,
            "all-gather bf16": ag_broadcasts}


def buffers(kind, dtype, world, s, fill=None, rank=0):
    """(out, inp) for one way; `fill` = None: ones (timing), else a seed: rank-specific randn."""
    n_in = s if kind == "ag" else world * s
    if fill is None:
        inp = torch.ones(n_in, dtype=dtype)
    else:
        g = torch.Generator().manual_seed(fill + rank)
        inp = torch.randn(n_in, generator=g).to(dtype)
    n_out = {"ag": world * s, "rs": s, "ar": 0}[kind]
    out = torch.zeros(n_out, dtype=dtype)  # preallocated and touched: no page faults when timed
    return out, inp


def reference(kind, dtype, world, rank, s, seed):
    """What every way should return, computed locally from all ranks' seeded inputs."""
    ins = [buffers(kind, dtype, world, s, seed, r)[1] for r in range(world)]
    if kind == "ag":
        return torch.cat(ins)
    total = torch.stack([t.float() for t in ins]).sum(0).to(dtype)
    return total if kind == "ar" else total[rank * s:(rank + 1) * s]


def close(kind, dtype, a, b, world):
    if kind == "ag":  # pure data movement: bit-exact
        return torch.equal(a.view(torch.uint8) if dtype == BF16 else a, b.view(torch.uint8) if dtype == BF16 else b)
    if dtype == BF16:  # native may round each partial sum to bf16; the fallback rounds once
        return torch.allclose(a.float(), b.float(), rtol=2 ** -7 * world, atol=2 ** -6 * world)
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def run_way(fn, kind, out, inp):
    fn(out, inp)
    return inp if kind == "ar" else out


def check(group, fn, kind, dtype, world, rank, native):
    """None if `fn` returns the right result on small random data, else the reason (text)."""
    s, seed = 1237, 1000  # odd chunk size: catches chunking that assumes alignment
    ref = reference(kind, dtype, world, rank, s, seed)
    err, want = None, ref
    if native:  # against the fallback, as the Comm layer would see a switch (run first: the
        # native op raising on one rank only must not leave the ranks in different collectives)
        want = run_way(FALLBACK[group], kind, *buffers(kind, dtype, world, s, seed, rank))
        if not close(kind, dtype, want, ref, world):
            err = "FALLBACK WRONG (check the reference)"
    try:
        got = run_way(fn, kind, *buffers(kind, dtype, world, s, seed, rank))
        if err is None and not close(kind, dtype, got, want, world):
            d = (got.float() - want.float()).abs().max().item()
            err = f"WRONG RESULT (max |diff| {d:.3g} vs the {'fallback' if native else 'reference'})"
    except Exception as e:  # noqa: BLE001 - report whatever the backend raised
        err = f"RAISES {type(e).__name__}: " + " ".join(str(e).split())[:300]
    # Every rank must agree before anyone times it (a way one rank skips would hang the rest);
    # each learns the first failing rank's reason, so rank 0 prints it.
    errs = [None] * world
    dist.all_gather_object(errs, err)
    bad = [(r, e) for r, e in enumerate(errs) if e is not None]
    return None if not bad else bad[0][1] if bad[0][0] == 0 else f"[rank {bad[0][0]}] {bad[0][1]}"


def worker(rank, world, port, sizes_mb, reps, only_check):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))

    errors = {}
    for group, label, fn, kind, dtype, native in WAYS:
        err = check(group, fn, kind, dtype, world, rank, native)
        errors[(group, label)] = err
        if only_check and rank == 0:
            print(f"{group + ': ' + label:{NAME_W}s} {'ok' if err is None else err}", flush=True)
    if only_check:
        dist.destroy_process_group()
        return

    for mb in sizes_mb:
        s = int(mb * 1e6 / 4) // world
        if rank == 0:
            print(f"--- {mb:g} MB fp32 flat buffer ({world * s / 1e6:.2f}M elements; "
                  f"bf16 rows: {world * s * 2 / 1e6:.1f} MB) ---", flush=True)
        for group, label, fn, kind, dtype, native in WAYS:
            name = f"{group}: {label}"
            err = errors[(group, label)]
            if err is not None:
                if rank == 0:
                    print(f"{name:{NAME_W}s} {err}", flush=True)
                continue
            out, inp = buffers(kind, dtype, world, s)
            fn(out, inp)  # warm-up (and the first touch of anything the way allocates)
            dist.barrier()
            t, c = time.perf_counter(), cpu_s()
            for _ in range(reps):
                fn(out, inp)
            dist.barrier()
            if rank == 0:
                print(f"{name:{NAME_W}s} {(time.perf_counter() - t) / reps * 1e3:7.1f} ms  "
                      f"CPU {(cpu_s() - c) / reps * 1e3:6.1f} ms (rank 0)", flush=True)
            del out, inp
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mb", default="82", help="comma-separated fp32 buffer sizes in MB, e.g. 11,82")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype-check", action="store_true",
                    help="only check each way's result (native ops against the fallbacks), no timing")
    a = ap.parse_args()
    sizes = [float(x) for x in a.mb.split(",") if x.strip()]
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    what = "correctness checks only" if a.dtype_check else \
        f"{', '.join(f'{m:g}' for m in sizes)} MB fp32 flat buffer, {a.reps} reps"
    print(f"gloo_ops: world {a.world}, {what}, torch {torch.__version__}", flush=True)
    mp.spawn(worker, args=(a.world, port, sizes, a.reps, a.dtype_check), nprocs=a.world)


if __name__ == "__main__":
    main()
