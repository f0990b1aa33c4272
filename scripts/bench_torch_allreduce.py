"""One rank of scripts/bench_torch.sh's all-reduce benchmark: the same tensors all-reduced through the "longhaul"
backend (the default group) and a gloo group over the same ranks, in the same processes, alternating per size.
Rank 0 prints one line per size: size, longhaul and gloo bus bandwidth (GB/s, 2(n-1)/n x bytes / time), the ratio.

    python3 -m longhaul.torchrun --nproc_per_node N scripts/bench_torch_allreduce.py [--codec none] [--sizes ...]
"""
import argparse
import time

import torch
import torch.distributed as dist

import longhaul.torch


def timed(t, group, iters):
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    dist.barrier(group=group)
    return (time.perf_counter() - start) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="none")
    ap.add_argument("--sizes", default="4K,64K,256K,1M,4M,16M,64M", help="bytes (K, M suffixes)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per size; the best of each is kept")
    args = ap.parse_args()
    dist.init_process_group("longhaul")
    longhaul.torch.set_codec(None, args.codec)
    gloo = dist.new_group(backend="gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"all-reduce float32 SUM, {n} processes, longhaul codec {args.codec}")
        print(f"{'bytes':>10} {'longhaul GB/s':>14} {'gloo GB/s':>10} {'ratio':>7}")
    for text in args.sizes.split(","):
        mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
        size = int(text.rstrip("KM")) * mult
        t = torch.randn(size // 4)
        iters = max(3, min(200, (64 << 20) // max(size, 1) // 4))
        timed(t, None, 2)
        timed(t, gloo, 2)
        best_lh = best_gl = float("inf")
        for _ in range(args.rounds):
            best_lh = min(best_lh, timed(t, None, iters))
            best_gl = min(best_gl, timed(t, gloo, iters))
        bus = 2 * (n - 1) / n * size / 1e9
        if rank == 0:
            print(f"{text:>10} {bus / best_lh:14.3f} {bus / best_gl:10.3f} {best_gl / best_lh:6.2f}x", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
