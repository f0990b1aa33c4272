"""One rank of a multi-process test (ranks.py starts them): `python3 rank_cases.py CASE`, with torchrun's environment.
Writes the case's return value as JSON to $CASE_OUT."""
import hashlib
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import longhaul.torch as lht

ARGS = json.loads(os.environ.get("CASE_ARGS", "{}"))
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])

FLOATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
INTS = {"int64": torch.int64, "int32": torch.int32}
SHAPES = [(0,), (1,), (7,), (1000,), (3, 5, 7), (70001,)]  # 70001 float32 = 280 KB: the ring path


def init(timeout=60):
    dist.init_process_group("longhaul", timeout=timedelta(seconds=timeout))


def inp(rank, idx, shape, dtype):
    g = torch.Generator().manual_seed(1000 * idx + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    return torch.randint(-1000, 1000, shape, generator=g, dtype=dtype)


def tol(dtype):
    return {torch.float32: 1e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}.get(dtype, 0)


def close_to(got, ref, dtype, mag=None):
    """got (dtype) is ref (float64) up to the dtype's precision relative to `mag`, the sum of the terms' magnitudes
    (a sum that cancels is as exact as its terms, not as its result); exact for integers."""
    if not dtype.is_floating_point:
        return torch.equal(got.to(torch.int64), ref.to(torch.int64))
    mag = ref.abs() if mag is None else mag
    return bool(((got.double() - ref).abs() <= tol(dtype) * mag + 1e-30).all())


def case_collectives():
    init()
    gloo = dist.new_group(backend="gloo")
    sub = dist.new_group(ranks=[0, 1])  # a second longhaul group on the same plane
    failures, checks = [], 0

    def check(ok, what):
        nonlocal checks
        checks += 1
        if not ok:
            failures.append(what)

    idx = 0
    for dname, dtype in {**FLOATS, **INTS}.items():
        for shape in SHAPES:
            idx += 1
            xs = [inp(r, idx, shape, dtype) for r in range(WORLD)]
            ref = sum(x.double() for x in xs)
            mag = sum(x.double().abs() for x in xs)
            # SUM, against the float64 reference and, where gloo has the dtype, against gloo
            t = xs[RANK].clone()
            dist.all_reduce(t)
            check(close_to(t, ref, dtype, mag), f"all_reduce SUM {dname}{shape} vs reference")
            if dtype is not torch.bfloat16:
                g = xs[RANK].clone()
                dist.all_reduce(g, group=gloo)
                if WORLD == 2 or not dtype.is_floating_point:
                    check(torch.equal(t, g), f"all_reduce SUM {dname}{shape} bit-equal to gloo")
                else:
                    check(close_to(t, g.double(), dtype, 2 * mag), f"all_reduce SUM {dname}{shape} vs gloo")
            if dtype.is_floating_point:
                t = xs[RANK].clone()
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                check(close_to(t, ref / WORLD, dtype, mag / WORLD), f"all_reduce AVG {dname}{shape}")
            for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
                if dtype is torch.bfloat16 or (op == dist.ReduceOp.PRODUCT and dtype.is_floating_point):
                    continue
                t, g = xs[RANK].clone(), xs[RANK].clone()
                dist.all_reduce(t, op=op)
                dist.all_reduce(g, group=gloo, op=op)
                check(torch.equal(t, g), f"all_reduce {op} {dname}{shape} vs gloo")
            # broadcast from the last rank
            t = xs[RANK].clone()
            dist.broadcast(t, src=WORLD - 1)
            check(torch.equal(t, xs[WORLD - 1]), f"broadcast {dname}{shape}")
            # all_gather and _allgather_base: every rank's exact bits
            outs = [torch.empty(shape, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(outs, xs[RANK])
            check(all(torch.equal(outs[r], xs[r]) for r in range(WORLD)), f"all_gather {dname}{shape}")
            flat = torch.empty((WORLD * xs[RANK].numel(),), dtype=dtype)
            dist._all_gather_base(flat, xs[RANK].reshape(-1))
            check(torch.equal(flat, torch.cat([x.reshape(-1) for x in xs])), f"_all_gather_base {dname}{shape}")
            # reduce_scatter: rank r gets the sum of every rank's r-th input, summed in rank order
            ins = [[inp(r, idx * 31 + j, shape, dtype) for j in range(WORLD)] for r in range(WORLD)]
            out = torch.empty(shape, dtype=dtype)
            dist.reduce_scatter(out, ins[RANK])
            want = sum(ins[r][RANK].double() for r in range(WORLD))
            want_mag = sum(ins[r][RANK].double().abs() for r in range(WORLD))
            check(close_to(out, want, dtype, want_mag), f"reduce_scatter {dname}{shape}")
            if dtype in (torch.float32, torch.int64):
                seq = ins[0][RANK].clone()
                for r in range(1, WORLD):
                    seq = seq + ins[r][RANK]
                check(torch.equal(out, seq), f"reduce_scatter {dname}{shape} is the sum in rank order")
            big = torch.cat([x.reshape(-1) for x in ins[RANK]])
            out = torch.empty((xs[RANK].numel(),), dtype=dtype)
            dist._reduce_scatter_base(out, big)
            check(close_to(out, want.reshape(-1), dtype, want_mag.reshape(-1)), f"_reduce_scatter_base {dname}{shape}")
            # a sub-group on the same plane
            if RANK < 2:
                t = xs[RANK].clone()
                dist.all_reduce(t, group=sub)
                check(close_to(t, xs[0].double() + xs[1].double(), dtype, xs[0].double().abs() + xs[1].double().abs()),
                      f"sub-group all_reduce {dname}{shape}")
    # point to point around the ring, with tags, while a barrier separates rounds
    for tag in (0, 7, 70000):
        send = inp(RANK, 9000 + tag, (513,), torch.float32)
        recv = torch.empty((513,), dtype=torch.float32)
        reqs = [dist.isend(send, (RANK + 1) % WORLD, tag=tag), dist.irecv(recv, (RANK - 1) % WORLD, tag=tag)]
        for r in reqs:
            r.wait()
        check(torch.equal(recv, inp((RANK - 1) % WORLD, 9000 + tag, (513,), torch.float32)), f"send/recv tag {tag}")
        dist.barrier()
    # the future DDP waits on holds the result
    t = torch.ones(5)
    fut = dist.all_reduce(t, async_op=True).get_future()
    check(torch.equal(fut.wait()[0], torch.full((5,), float(WORLD))), "get_future's value")
    dist.destroy_process_group()
    return {"failures": failures, "checks": checks}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def case_ddp():
    backend = ARGS.get("backend", "longhaul")
    steps = ARGS.get("steps", 20)
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    if backend == "longhaul":
        lht.set_codec(None, ARGS.get("codec", "none"))
    torch.manual_seed(0)
    net = Net()
    if RANK != 0:  # DDP's constructor broadcasts rank 0's parameters
        with torch.no_grad():
            for p in net.parameters():
                p.add_(1.0)
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.01)  # several buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    teacher = torch.nn.Linear(32, 10)
    torch.manual_seed(1)
    with torch.no_grad():
        teacher.weight.normal_()
    losses, hashes, raw, wire = [], [], 0, 0
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x = torch.randn(64, 32, generator=g)
        y = teacher(x).argmax(1).detach()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        h = hashlib.sha256()
        for p in model.parameters():
            h.update(p.detach().numpy().tobytes())
        hashes.append(h.hexdigest())
        if backend == "longhaul":
            line = lht.log_step(step, loss=loss.item())
            for link in line["links"]:
                if link["role"] == "grad" and link["dir"] == "send":
                    raw += link["raw_bytes"]
                    wire += link["wire_bytes"]
    out = {"losses": losses, "hashes": hashes, "raw": raw, "wire": wire}
    if backend == "longhaul":
        out["counters"] = lht.counters()
        out["codec"] = lht.codec()
    dist.destroy_process_group()
    return out


def case_bad_codec():
    init()
    errors = {}
    for spec in ("int9", "topk:ratio=2", "", "ef+ef"):
        try:
            lht.set_codec(None, spec)
            errors[spec] = None
        except ValueError as e:
            errors[spec] = str(e)
    dist.barrier()  # rank 0 holds the store: it must not leave while another rank still joins
    dist.destroy_process_group()
    return errors


def case_init():
    """Only joins (for the bad-secret and world-size tests); returns the error's text, or "ok"."""
    try:
        init(timeout=ARGS.get("timeout", 20))
    except Exception as e:  # noqa: BLE001 (the test reads the message)
        return {"error": f"{type(e).__name__}: {e}"}
    dist.barrier()
    dist.destroy_process_group()
    return {"error": None}


def case_peer_dies():
    init(timeout=ARGS.get("timeout", 30))
    t = torch.ones(100000)
    dist.all_reduce(t)
    if RANK == WORLD - 1:
        os._exit(3)  # no goodbye
    time.sleep(0.5)
    start = time.time()
    try:
        for _ in range(3):
            dist.all_reduce(t)
        return {"error": None, "seconds": time.time() - start}
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.time() - start}


def case_p2p_codec():
    """Rank 0 sends to rank 1 through a p2p codec; rank 1 checks the bits against longhaul.codecs run locally."""
    import longhaul.codecs as lhc

    init()
    spec = ARGS["codec"]
    lht.set_p2p_codec(None, spec)
    sent = [torch.randn(4097, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    ok = []
    if RANK == 0:
        for x in sent:
            dist.send(x, 1, tag=3)
    else:
        codec, tx, rx = lhc.Codec(spec), lhc.StreamState("act"), lhc.StreamState("act")
        for x in sent:
            got = torch.empty(4097)
            dist.recv(got, 0, tag=3)
            want = lhc.decode(codec.encode(x, tx), state=rx)
            ok.append(bool(torch.equal(got, want)))
    line = lht.log_step(0)
    # an int64 tensor cannot go through a codec: the send fails naming it
    err = None
    if RANK == 0:
        try:
            dist.send(torch.zeros(3, dtype=torch.int64), 1, tag=4)
        except RuntimeError as e:
            err = str(e)
    dist.barrier()
    dist.destroy_process_group()
    act = [l for l in line["links"] if l["role"] == "act" and l["dir"] == "send"]
    return {"ok": ok, "raw": sum(l["raw_bytes"] for l in act), "wire": sum(l["wire_bytes"] for l in act),
            "error": err}


def case_powersgd():
    init()
    pg = dist.distributed_c10d._get_default_group()
    # every rank a different rank-1 matrix: their average has rank WORLD, which rank-WORLD factors hold exactly
    def parts(r):
        g = torch.Generator().manual_seed(r)
        return torch.randn(64, 1, generator=g), torch.randn(1, 48, generator=g), torch.randn(48, generator=g)

    errs = []
    for it in range(3):
        u, v, bias = parts(RANK)
        buf = torch.cat([((u @ v) * (it + 1)).reshape(-1), bias])
        pg._powersgd(buf, 0, [[64, 48], [48]], WORLD, "none").wait()
        want_m = sum(parts(r)[0] @ parts(r)[1] for r in range(WORLD)) * (it + 1) / WORLD
        want_b = sum(parts(r)[2] for r in range(WORLD)) / WORLD
        errs.append([float((buf[:64 * 48].reshape(64, 48) - want_m).abs().max() / want_m.abs().max()),
                     float((buf[64 * 48:] - want_b).abs().max())])
    # and as a DDP comm hook: trains, bit-equal replicas
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=0.01)
    model.register_comm_hook(lht.PowerSGDState(rank=2), lht.powersgd_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    teacher = torch.nn.Linear(32, 10)
    losses, hashes = [], []
    for step in range(20):
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(100 * step + RANK))
        loss = torch.nn.functional.cross_entropy(model(x), teacher(x).argmax(1).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        hashes.append(hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
    line = lht.log_step(0)
    grad = [l for l in line["links"] if l["role"] == "grad" and l["dir"] == "send"]
    dist.barrier()
    dist.destroy_process_group()
    return {"errs": errs, "losses": losses, "hashes": hashes, "raw": sum(l["raw_bytes"] for l in grad),
            "wire": sum(l["wire_bytes"] for l in grad)}


def case_forged():
    """Rank 0 sends rank 1 a packet without a valid MAC, then the genuine one under the same tag."""
    init()
    pg = dist.distributed_c10d._get_default_group()
    x = torch.arange(1024, dtype=torch.float32)
    got = torch.zeros(1024)
    if RANK == 0:
        pg._forge_for_tests(1, 5)
        time.sleep(0.5)
        dist.send(x, 1, tag=5)
    else:
        dist.recv(got, 0, tag=5)
    counters = lht.counters()
    dist.barrier()
    dist.destroy_process_group()
    return {"equal": bool(torch.equal(got, x)), "auth_failures": counters["auth_failures"]}


def case_shaped():
    """With LH_LINK set, 1 MB from rank 0 to rank 1 takes the emulated link's time."""
    init()
    x = torch.zeros(250000)  # 1 MB
    dist.barrier()
    start = time.time()
    if RANK == 0:
        dist.send(x, 1)
    else:
        dist.recv(x, 0)
    elapsed = time.time() - start
    stats = lht.link_stats()
    dist.barrier()
    dist.destroy_process_group()
    return {"seconds": elapsed, "bandwidth": stats["bandwidth"]}


if __name__ == "__main__":
    import ranks

    ranks.serve(globals())
