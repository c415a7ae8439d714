#!/usr/bin/env python3
"""Times Gloo's CPU collectives the ways sharding/comm.cpp could issue them (Debian's
python3-torch: the same Gloo as LibTorch 1.13). Why the Comm layer's Gloo fallbacks are
what they are: an all-gather as one broadcast per rank into views of the output, a
reduce-scatter as an in-place all-reduce.

    /usr/bin/python3 scripts/bench/gloo_ops.py [--world 2] [--mb 82] [--reps 5]

MB is the size of the full flat buffer (the all-reduced tensor, the all-gather's output,
the reduce-scatter's input); the default 82 MB is half the small preset's fp32 parameters.
Prints, per way, milliseconds per op and the CPU (user + system) it cost rank 0.
"""
import argparse
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(rank, world, port, numel, reps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s = numel // world
    full = torch.ones(world * s)
    out = torch.zeros(world * s)  # preallocated and touched: no page faults in the timed loop
    mine = torch.ones(s)

    def allgather_list():  # Gloo's own all-gather into views of `out`
        dist.all_gather(list(out.split(s)), mine)

    def broadcasts():  # one broadcast per rank of its slice (the Comm fallback)
        works = [dist.broadcast(out[r * s:(r + 1) * s], r, async_op=True) for r in range(world)]
        for w in works:
            w.wait()

    def allreduce_inplace():  # reduce-scatter as all-reduce of a scratch buffer (the Comm fallback)
        dist.all_reduce(full)

    def allreduce_copy():  # ... of a fresh copy (the input kept intact)
        dist.all_reduce(full.clone())

    recv = torch.zeros(world * s)

    def alltoall_sum():  # reduce-scatter as all-to-all + local sum
        dist.all_to_all_single(recv, full)
        recv.view(world, s).sum(0)

    def sendrecv_sum():  # ... the same with one send and one receive per peer
        works = []
        for k in range(world):
            if k != rank:
                works.append(dist.isend(full[k * s:(k + 1) * s], k))
                works.append(dist.irecv(recv[k * s:(k + 1) * s], k))
        for w in works:
            w.wait()
        recv[rank * s:(rank + 1) * s].copy_(full[rank * s:(rank + 1) * s])
        recv.view(world, s).sum(0)

    ways = [("all-gather: Gloo allgather (list of views)", allgather_list),
            ("all-gather: one broadcast per rank", broadcasts),
            ("reduce-scatter: all-reduce in place", allreduce_inplace),
            ("reduce-scatter: all-reduce of a fresh copy", allreduce_copy),
            ("reduce-scatter: all-to-all + local sum", alltoall_sum),
            ("reduce-scatter: send/recv + local sum", sendrecv_sum)]
    for name, fn in ways:
        fn()
        dist.barrier()
        t, c = time.perf_counter(), cpu_s()
        for _ in range(reps):
            fn()
        dist.barrier()
        if rank == 0:
            print(f"{name:46s} {(time.perf_counter() - t) / reps * 1e3:7.1f} ms  "
                  f"CPU {(cpu_s() - c) / reps * 1e3:6.1f} ms (rank 0)", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mb", type=float, default=82.0)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    numel = int(a.mb * 1e6 / 4)
    print(f"gloo_ops: world {a.world}, {a.mb:.0f} MB fp32 flat buffer, {a.reps} reps, torch {torch.__version__}")
    mp.spawn(worker, args=(a.world, port, numel, a.reps), nprocs=a.world)


if __name__ == "__main__":
    main()
