"""Two pipeline stages of a PyTorch model in two processes: activations go forward and their gradients come back
through longhaul's point-to-point transfers, compressed by a codec.

    export PYTHONPATH=$PWD/build/python LH_JOB_KEY_FILE=$PWD/job.key
    python3 -m longhaul.torchrun --nproc_per_node 2 examples/torch_pipeline.py --codec int8
    python3 -m longhaul.torchrun --nproc_per_node 2 examples/torch_pipeline.py --codec none --check

Rank 0 holds the first half of the model and the inputs, rank 1 the second half and the labels. --check also trains
the whole model in rank 0's process on the same data and prints how far the pipeline's losses are from it (with
`none` they are the same computation, split in two).
"""
import argparse

import torch
import torch.distributed as dist

import longhaul.torch


def make_model():
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU())
    second = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    return first, second


def batch(step, size):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, 32, generator=g)
    w = torch.randn(32, 10, generator=torch.Generator().manual_seed(12345))
    return x, (x @ w).argmax(1)


def reference(steps, size, lr):
    """The same model and data in one process."""
    first, second = make_model()
    opt = torch.optim.SGD(list(first.parameters()) + list(second.parameters()), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batch(step, size)
        loss = torch.nn.functional.cross_entropy(second(first(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--codec", default="none", help="codec of the activations and their gradients (none, int8, ...)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--check", action="store_true", help="compare the losses with the model run in one process")
    args = ap.parse_args()

    dist.init_process_group("longhaul")
    rank = dist.get_rank()
    assert dist.get_world_size() == 2, "two stages: run it with --nproc_per_node 2"
    longhaul.torch.set_p2p_codec(None, args.codec)
    first, second = make_model()
    stage = first if rank == 0 else second
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, y = batch(step, args.batch)
        opt.zero_grad()
        if rank == 0:
            h = stage(x)
            dist.send(h.detach().contiguous(), 1, tag=2 * step)  # activations forward
            g = torch.empty_like(h)
            dist.recv(g, 1, tag=2 * step + 1)  # their gradient back
            h.backward(g)
        else:
            h = torch.empty(args.batch, 128)
            dist.recv(h, 0, tag=2 * step)
            h.requires_grad_()
            loss = torch.nn.functional.cross_entropy(stage(h), y)
            loss.backward()
            dist.send(h.grad.contiguous(), 0, tag=2 * step + 1)
            losses.append(loss.item())
        opt.step()
    line = longhaul.torch.log_step(args.steps)
    t = torch.tensor(losses if rank == 1 else [0.0] * args.steps, dtype=torch.float64)
    dist.broadcast(t, 1)
    if rank == 0:
        sent = [link for link in line["links"] if link["dir"] == "send" and link["role"] == "act"]
        raw, wire = sum(link["raw_bytes"] for link in sent), sum(link["wire_bytes"] for link in sent)
        print(f"pipeline ({args.codec}): loss {t[0]:.4f} -> {t[-1]:.4f}; activations sent raw {raw / 1e6:.2f} MB, "
              f"wire {wire / 1e6:.2f} MB ({raw / max(wire, 1):.2f}x less)", flush=True)
        if args.check:
            ref = torch.tensor(reference(args.steps, args.batch, args.lr), dtype=torch.float64)
            diff = ((t - ref).abs() / ref.abs()).max().item()
            print(f"largest relative difference from one process: {diff:.3g}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
