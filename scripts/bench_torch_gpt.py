"""One rank of scripts/bench_torch_wan.sh: a PyTorch GPT of about 2M parameters on the fortunes text, data parallel
over every rank, with gloo or longhaul (a codec, PowerSGD, or DiLoCo). Rank 0 prints one JSON line: tokens/s of the
timed steps (after 3 warm-up steps), the validation loss after the last step, the gradient bytes rank 0 sent.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python3 scripts/bench_torch_gpt.py --backend gloo|longhaul
        [--codec SPEC] [--powersgd R] [--diloco H] --steps N
"""
import argparse
import glob
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import longhaul.torch


def corpus():
    text = b""
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if not path.endswith((".dat", ".u8")) and os.path.isfile(path):
            with open(path, "rb") as f:
                text += f.read()
    if len(text) < 100_000:
        text = bytes(range(32, 127)) * 5000
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, layers=4, d=192, heads=4, seq=64):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(256, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, 256)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, x):
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for b in self.blocks:
            h = b(h, self.mask)
        return self.head(self.ln(h))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="longhaul")
    ap.add_argument("--codec", default="none")
    ap.add_argument("--powersgd", type=int, default=0)
    ap.add_argument("--diloco", type=int, default=0, help="DiLoCo's H (inner steps per round); 0: every-step DDP")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = GPT(seq=args.seq)
    data = corpus()
    split = int(len(data) * 0.95)
    if args.diloco:
        model = net
        inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
        opt = longhaul.torch.DiLoCo(model, inner, sync=f"diloco:H={args.diloco},outer_lr=0.7,outer_momentum=0.9",
                                    codec=args.codec)
    else:
        if args.backend == "longhaul" and args.codec != "none":
            longhaul.torch.set_codec(None, args.codec)
        model = DistributedDataParallel(net)
        if args.powersgd:
            model.register_comm_hook(longhaul.torch.PowerSGDState(rank=args.powersgd), longhaul.torch.powersgd_hook)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1 + rank)

    def batch(lo, hi, gen, n):
        idx = torch.randint(lo, hi - args.seq - 1, (n,), generator=gen)
        x = torch.stack([data[i:i + args.seq] for i in idx.tolist()])
        y = torch.stack([data[i + 1:i + 1 + args.seq] for i in idx.tolist()])
        return x, y

    sent = 0
    start = None
    for step in range(args.steps):
        if step == 3:
            dist.barrier()
            start = time.perf_counter()
        x, y = batch(0, split, g, args.batch)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.backend == "longhaul":
            for link in longhaul.torch.log_step(step)["links"]:
                if link["dir"] == "send" and link["role"] == "grad":
                    sent += link["wire_bytes"]
    dist.barrier()
    took = time.perf_counter() - start
    with torch.no_grad():
        vx, vy = batch(split, len(data), torch.Generator().manual_seed(7), 64)
        val = torch.nn.functional.cross_entropy(net(vx).flatten(0, 1), vy.flatten())
    if rank == 0:
        params = sum(p.numel() for p in net.parameters())
        tokens = (args.steps - 3) * args.batch * args.seq * world
        print(json.dumps({"backend": args.backend, "codec": args.codec, "powersgd": args.powersgd,
                          "diloco": args.diloco, "world": world, "params": params, "steps": args.steps,
                          "tokens_per_s": tokens / took, "seconds": took, "val_loss": val.item(),
                          "grad_bytes_sent_rank0": sent, "ppl": math.exp(val.item())}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
