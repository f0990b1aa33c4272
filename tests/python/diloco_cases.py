"""Ranks of longhaul.torch.DiLoCo's multi-process tests (test_diloco.py): `python3 diloco_cases.py CASE` with
torchrun's environment writes the case's return value as JSON to $CASE_OUT; run() starts the ranks as ranks.py does
for rank_cases.py."""
import hashlib
import json
import os
import time
from datetime import timedelta

def run(case, world, args=None, timeout=240):
    """Starts `world` processes of this file running `case` (ranks.run); raises ranks.RankFailure when one fails."""
    import ranks

    return ranks.run(case, world, args=args, timeout=timeout, script=os.path.basename(__file__))


def params_hash(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def case_train():
    """Each rank trains the same student on its own samples of one teacher's task with DiLoCo (AdamW inside) for
    `rounds` rounds of H steps. Returns per round the parameters' hash, the mean loss and the largest distance
    between the parameters and a float64 reference of the outer step made from every rank's θ; and the pseudo-gradient
    bytes this rank sent and received in all (longhaul.torch.log_step's grad links) and DiLoCo's own count."""
    import torch
    import torch.distributed as dist

    import longhaul.torch as lht

    args = json.loads(os.environ.get("CASE_ARGS", "{}"))
    rank = int(os.environ["RANK"])
    H, rounds, codec = args.get("H", 5), args.get("rounds", 8), args.get("codec", "none")
    lr, mu = 0.7, 0.9
    dist.init_process_group("longhaul", timeout=timedelta(seconds=60))
    world = dist.get_world_size()
    torch.manual_seed(0)  # the same start on every rank
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    teacher = torch.nn.Linear(64, 10)
    with torch.no_grad():
        teacher.weight.normal_()
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    opt = lht.DiLoCo(model, inner, sync=f"diloco:H={H},outer_lr={lr},outer_momentum={mu}", codec=codec)

    # The reference: gather every rank's θ right after the inner step of each H-th step (before the outer step).
    ref = {"sync": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double(), "m": None, "err": []}
    inner_step = inner.step

    def step_and_gather(*a, **kw):
        out = inner_step(*a, **kw)
        if (opt.steps + 1) % H == 0:
            theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            everyone = [torch.empty_like(theta) for _ in range(world)]
            dist.all_gather(everyone, theta)
            d = sum(ref["sync"] - t.double() for t in everyone) / world
            ref["m"] = d if ref["m"] is None else mu * ref["m"] + d
            ref["sync"] = ref["sync"] - lr * (d + mu * ref["m"])
        return out

    inner.step = step_and_gather
    out = {"hashes": [], "losses": [], "ref_err": [], "stream": opt.stream,
           "params": sum(p.numel() for p in model.parameters())}
    total = {(d, k): 0 for d in ("send", "recv") for k in ("raw_bytes", "wire_bytes", "messages")}

    def meter(line):
        for link in line["links"]:
            if link["role"] == "grad":
                for k in ("raw_bytes", "wire_bytes", "messages"):
                    total[(link["dir"], k)] += link[k]

    step = 0
    for r in range(rounds):
        losses = []
        for _ in range(H):
            g = torch.Generator().manual_seed(1000 * step + rank)  # every rank its own samples
            x = torch.randn(32, 64, generator=g)
            y = teacher(x).argmax(1)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
        assert opt.rounds == r + 1
        out["hashes"].append(params_hash(model))
        out["losses"].append(sum(losses) / len(losses))
        meter(lht.log_step(r, loss=out["losses"][-1]))
        theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
        out["ref_err"].append(float((theta - ref["sync"]).abs().max()))
    # A send is metered when UCX reports it done, which may come after its all-reduce returned: wait for the last
    # ones (every rank sends its peer as many messages as it receives from it).
    dist.barrier()
    deadline = time.time() + 10
    while total[("send", "messages")] < total[("recv", "messages")] and time.time() < deadline:
        time.sleep(0.01)
        meter(lht.log_step(rounds))
    out["sent"] = {"raw": total[("send", "raw_bytes")], "wire": total[("send", "wire_bytes")],
                   "messages": total[("send", "messages")]}
    out["received"] = {"raw": total[("recv", "raw_bytes")], "wire": total[("recv", "wire_bytes")],
                       "messages": total[("recv", "messages")]}
    out["bytes_received"], out["raw_bytes_received"] = opt.bytes_received, opt.raw_bytes_received
    dist.barrier()  # rank 0 holds the store: it must not leave while another rank still talks
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    import ranks

    ranks.serve(globals())
