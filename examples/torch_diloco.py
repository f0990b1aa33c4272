"""A small character-level model trained with longhaul.torch.DiLoCo: each replica takes H local AdamW steps on its own
samples, then the replicas average their pseudo-gradients (compressed with --codec) and take one outer Nesterov step.

    export LH_JOB_KEY=$(python3 -c 'import secrets; print(secrets.token_hex(32))') PYTHONPATH=build/python
    python3 -m longhaul.torchrun --nproc_per_node 2 examples/torch_diloco.py --codec ef+int4 --H 20
    python3 examples/torch_diloco.py            # a world of one, no torchrun

(longhaul.torchrun is torchrun with the fix Debian's torch 1.13 needs under Python 3.11; a working torchrun does too.)

The text comes from a fixed random order-2 Markov chain over 16 characters (the same on every rank), so the best
possible loss is known: the chain's entropy, printed at the start.
"""
import argparse
import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import longhaul.torch as lht

VOCAB, CONTEXT = 16, 4


def markov_chain(seed=0, sharpness=2.0):
    """P(next | previous two characters): peaked rows, so there is something to learn."""
    g = torch.Generator().manual_seed(seed)
    logits = sharpness * torch.randn(VOCAB, VOCAB, VOCAB, generator=g)
    return torch.softmax(logits, dim=-1)


def entropy(chain):
    """The chain's entropy rate in nats, under its stationary distribution of character pairs (power iteration)."""
    pair = torch.full((VOCAB, VOCAB), 1.0 / VOCAB ** 2, dtype=torch.float64)
    p = chain.double()
    for _ in range(200):
        pair = torch.einsum("ab,abc->bc", pair, p)
    return float(-(pair.unsqueeze(-1) * p * p.clamp_min(1e-30).log()).sum())


def sample_text(chain, n, g):
    text = torch.empty(n, dtype=torch.long)
    text[:2] = torch.randint(0, VOCAB, (2,), generator=g)
    for i in range(2, n):
        text[i] = torch.multinomial(chain[text[i - 2], text[i - 1]], 1, generator=g)
    return text


def batches(text, batch, g):
    """Endless (context, next character) batches drawn from `text`."""
    while True:
        start = torch.randint(0, len(text) - CONTEXT - 1, (batch,), generator=g)
        idx = start.unsqueeze(1) + torch.arange(CONTEXT + 1)
        window = text[idx]
        yield window[:, :CONTEXT], window[:, CONTEXT]


class CharMLP(torch.nn.Module):
    def __init__(self, dim=24, hidden=256):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(CONTEXT * dim, hidden), torch.nn.GELU(),
                                       torch.nn.Linear(hidden, VOCAB))

    def forward(self, ctx):
        return self.mlp(self.embed(ctx).flatten(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--codec", default="ef+int4", help="codec chain of the pseudo-gradients (none, int8, ef+int4, ...)")
    ap.add_argument("--H", type=int, default=20, help="inner steps per round")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--lr", type=float, default=3e-3, help="the inner AdamW's learning rate")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()

    torch.set_num_threads(1)
    distributed = "RANK" in os.environ  # started by torchrun
    if distributed:
        dist.init_process_group("longhaul", timeout=timedelta(seconds=60))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)

    chain = markov_chain()
    text = sample_text(chain, 20000, torch.Generator().manual_seed(1))  # the same corpus everywhere
    data = batches(text, args.batch, torch.Generator().manual_seed(100 + rank))  # each rank its own samples
    torch.manual_seed(0)
    model = CharMLP()
    if distributed:  # DiLoCo needs the replicas to start alike
        with torch.no_grad():
            for p in model.parameters():
                dist.broadcast(p, 0)
    sync = f"diloco:H={args.H},outer_lr={args.outer_lr},outer_momentum={args.outer_momentum}"
    opt = lht.DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=args.lr), sync=sync, codec=args.codec)
    n = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"{world} replica(s), {n} parameters, sync {opt.sync}, codec {opt.codec}")
        print(f"loss to beat: uniform {math.log(VOCAB):.3f}, the chain's entropy {entropy(chain):.3f} nats")

    t0 = time.time()
    for r in range(args.rounds):
        total = 0.0
        for _ in range(args.H):
            ctx, nxt = next(data)
            loss = torch.nn.functional.cross_entropy(model(ctx), nxt)
            opt.zero_grad()
            loss.backward()
            opt.step()  # every H-th call averages the pseudo-gradient and takes the outer step
            total += loss.item()
        if rank == 0:
            print(f"round {r + 1:3d}  step {opt.steps:5d}  rank 0's loss {total / args.H:.4f}  "
                  f"pseudo-gradient bytes received {opt.bytes_received / 1e3:8.1f} KB  ({time.time() - t0:.1f} s)")

    if rank == 0 and world > 1:
        # Every-step DDP all-reduces the float32 gradients every step: per step, the same all-reduce that one round
        # of DiLoCo with codec none makes, whose bytes are raw_bytes_received per round.
        ddp = opt.raw_bytes_received / opt.rounds * opt.steps
        print(f"received {opt.bytes_received / 1e3:.1f} KB in {opt.rounds} rounds; every-step DDP in float32 would "
              f"have moved {ddp / 1e3:.1f} KB in {opt.steps} steps: {ddp / max(opt.bytes_received, 1):.0f}x more")
    if distributed:
        dist.barrier()  # rank 0 holds the store: it leaves last
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
