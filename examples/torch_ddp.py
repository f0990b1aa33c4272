"""A small PyTorch model trained with DistributedDataParallel, on gloo or on longhaul (compressed or not).

    build/bin/longhaul keygen job.key && export LH_JOB_KEY_FILE=$PWD/job.key
    export PYTHONPATH=$PWD/build/python
    torchrun --nproc_per_node 2 examples/torch_ddp.py --backend gloo
    torchrun --nproc_per_node 2 examples/torch_ddp.py --codec ef+int4
    torchrun --nproc_per_node 2 examples/torch_ddp.py --powersgd 4
    LH_LINK=20M,50ms torchrun --nproc_per_node 2 examples/torch_ddp.py --codec ef+int4   # over an emulated slow link

The model predicts the next byte of the fortunes text (Debian's `fortunes` package; generated text without it) from
the 32 before it. The two lines a DDP script changes for longhaul are marked "longhaul:".
"""
import argparse
import glob
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import longhaul.torch  # longhaul: registers the "longhaul" backend


def corpus():
    text = b""
    for path in sorted(glob.glob("/usr/share/games/fortunes/*"))[:40]:
        if not path.endswith((".dat", ".u8")) and os.path.isfile(path):
            with open(path, "rb") as f:
                text += f.read()
    if len(text) < 100_000:  # no fortunes: a generated text with some structure to learn
        g = torch.Generator().manual_seed(0)
        words = [bytes(torch.randint(97, 123, (int(n),), generator=g).tolist()) for n in torch.randint(2, 8, (300,), generator=g)]
        text = b" ".join(words[int(i)] for i in torch.randint(0, 300, (200_000,), generator=g))
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


class ByteModel(torch.nn.Module):
    def __init__(self, context=32, dim=64, hidden=512):
        super().__init__()
        self.emb = torch.nn.Embedding(256, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(context * dim, hidden), torch.nn.GELU(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 256))

    def forward(self, x):
        return self.mlp(self.emb(x).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="longhaul", choices=["longhaul", "gloo"])
    ap.add_argument("--codec", default="none", help="longhaul codec chain of the gradients (none, int8, ef+int4, ...)")
    ap.add_argument("--powersgd", type=int, default=0, help="PowerSGD rank (a DDP comm hook) instead of a codec")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--metrics", default="", help="write longhaul's per-link JSONL here (`longhaul report FILE`)")
    args = ap.parse_args()

    dist.init_process_group(args.backend)  # longhaul: "longhaul" instead of "gloo"
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "longhaul" and args.codec != "none":
        longhaul.torch.set_codec(None, args.codec)

    data = corpus()
    split = int(len(data) * 0.9)
    torch.manual_seed(0)
    model = DistributedDataParallel(ByteModel(args.context))
    if args.powersgd:
        if args.backend != "longhaul":
            raise SystemExit("--powersgd runs longhaul's PowerSGD: use --backend longhaul")
        model.register_comm_hook(longhaul.torch.PowerSGDState(rank=args.powersgd), longhaul.torch.powersgd_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(1 + rank)

    def batch(lo, hi, gen):
        idx = torch.randint(lo, hi - args.context - 1, (args.batch,), generator=gen)
        x = torch.stack([data[i:i + args.context] for i in idx.tolist()])
        return x, data[idx + args.context]

    start, raw, wire = time.time(), 0, 0
    for step in range(args.steps):
        x, y = batch(0, split, g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.backend == "longhaul":
            line = longhaul.torch.log_step(step, loss=loss.item(), path=args.metrics or None)
            for link in line["links"]:
                if link["role"] == "grad" and link["dir"] == "send":
                    raw, wire = raw + link["raw_bytes"], wire + link["wire_bytes"]
        if rank == 0 and (step % 25 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)

    with torch.no_grad():
        vx, vy = batch(split, len(data), torch.Generator().manual_seed(99))
        val = torch.nn.functional.cross_entropy(model(vx), vy)
        dist.all_reduce(val)
    if rank == 0:
        took = time.time() - start
        tokens = args.steps * args.batch * world
        what = args.backend + ("" if args.backend == "gloo" else
                               f" powersgd:rank={args.powersgd}" if args.powersgd else f" {args.codec}")
        print(f"{what}: {world} processes, {args.steps} steps in {took:.1f} s ({tokens / took:.0f} samples/s), "
              f"val loss {val.item() / world:.4f}", flush=True)
        if wire:
            print(f"gradient bytes sent by rank 0: raw {raw / 1e6:.2f} MB, wire {wire / 1e6:.2f} MB "
                  f"({raw / wire:.2f}x less)", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
