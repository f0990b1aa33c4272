"""Ranks of longhaul.torch.DiLoCo's multi-process tests (test_diloco.py): `python3 diloco_cases.py CASE` with
torchrun's environment writes the case's return value as JSON to $CASE_OUT; run() starts the ranks as ranks.py does
for rank_cases.py."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))


def run(case, world, args=None, timeout=240):
    """Starts `world` processes of this file running `case`; returns {rank: {"rc", "out", "stderr"}} and raises
    ranks.RankFailure when one fails."""
    import ranks

    port = ranks.free_port()
    procs, results = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(world):
            e = dict(os.environ)
            e.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(world),
                      "LOCAL_RANK": str(r), "LH_JOB_KEY": ranks.KEY, "OMP_NUM_THREADS": "1", "UCX_NET_DEVICES": "lo",
                      "CASE_OUT": os.path.join(tmp, f"out{r}.json"), "CASE_ARGS": json.dumps(args or {})})
            procs[r] = subprocess.Popen([sys.executable, os.path.abspath(__file__), case], env=e,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r, p in procs.items():
            try:
                _, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs.values():
                    q.kill()
                _, err = p.communicate()
                err += f"\n(killed after {timeout} s)"
            out_path = os.path.join(tmp, f"out{r}.json")
            out = None
            if os.path.exists(out_path):
                with open(out_path) as f:
                    out = json.load(f)
            results[r] = {"rc": p.returncode, "out": out, "stderr": err}
    if any(x["rc"] != 0 for x in results.values()):
        raise ranks.RankFailure(results)
    return results


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


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}

if __name__ == "__main__":
    result = CASES[sys.argv[1]]()
    with open(os.environ["CASE_OUT"], "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)
