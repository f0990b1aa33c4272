#!/usr/bin/python3
"""The codecs of `longhaul bench codecs` written as PyTorch CPU tensor ops, the way a researcher's Python
prototype writes them: the baseline scripts/bench_codecs_vs_torch.sh prints beside longhaul's own figures.

    /usr/bin/python3 scripts/bench_codecs_torch.py [--threads 2] [--sizes 1048576 4194304] [--repeats 9]

Prints one JSON object per codec and size: spec, numel, encode_gbps, decode_gbps (GB/s of raw fp32 bytes,
median of --repeats runs after one warm-up), the same units as `longhaul bench codecs --json`.
Same math as longhaul's codecs: block-wise absmax with one fp16 scale per 64 elements, int8/int4 over the
whole two's-complement range with the signed scale v / -2^(b-1), int2 ternary with scale absmax, nibbles and
bit pairs packed element 0 first; lowrank is PowerSGD's P = M·Q, orthonormalise P, Q = Mᵀ·P.
"""
import argparse
import json
import statistics
import time

import torch

BLOCK = 64


def blocks(x):
    return x.reshape(-1, BLOCK)


def quant_encode(x, bits):
    xb = blocks(x)
    if bits == 2:
        scale = xb.abs().amax(dim=1, keepdim=True)
    else:
        # the signed value of largest magnitude, mapped onto the extra negative level
        idx = xb.abs().argmax(dim=1, keepdim=True)
        scale = xb.gather(1, idx) / -(1 << (bits - 1))
    scale16 = scale.half()
    s = scale16.float()
    inv = torch.where(s != 0, 1.0 / s, torch.zeros_like(s))
    lo, hi = (-1, 1) if bits == 2 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    q = torch.round(xb * inv).clamp_(lo, hi)
    if bits == 8:
        return scale16, q.to(torch.int8)
    if bits == 4:
        u = (q + 8).to(torch.uint8).reshape(-1, 2)
        return scale16, u[:, 0] | (u[:, 1] << 4)
    u = (q + 1).to(torch.uint8).reshape(-1, 4)
    return scale16, u[:, 0] | (u[:, 1] << 2) | (u[:, 2] << 4) | (u[:, 3] << 6)


def quant_decode(enc, bits, shape):
    scale16, codes = enc
    s = scale16.float()
    if bits == 8:
        q = codes.float().reshape(-1, BLOCK)
    elif bits == 4:
        q = torch.stack(((codes & 15), (codes >> 4)), dim=1).float().sub_(8).reshape(-1, BLOCK)
    else:
        q = torch.stack([(codes >> (2 * t)) & 3 for t in range(4)], dim=1).float().sub_(1).reshape(-1, BLOCK)
    return (q * s).reshape(shape)


def orthonormalise(p):
    return torch.linalg.qr(p).Q


class PowerSGD:
    def __init__(self, m, rank):
        g = torch.Generator().manual_seed(0)
        self.q = torch.randn(m, rank, generator=g)

    def encode(self, x):
        p = orthonormalise(x @ self.q)
        self.q = x.t() @ p
        return p, self.q

    @staticmethod
    def decode(enc):
        p, q = enc
        return p @ q.t()


def codecs(x, rank):
    shape = x.shape
    ps = PowerSGD(shape[1], rank)
    return {
        "fp16": (lambda: x.half(), lambda e: e.float()),
        "bf16": (lambda: x.bfloat16(), lambda e: e.float()),
        "int8": (lambda: quant_encode(x, 8), lambda e: quant_decode(e, 8, shape)),
        "int4": (lambda: quant_encode(x, 4), lambda e: quant_decode(e, 4, shape)),
        "int2": (lambda: quant_encode(x, 2), lambda e: quant_decode(e, 2, shape)),
        f"lowrank:rank={rank}": (lambda: ps.encode(x), PowerSGD.decode),
    }


def median_seconds(f, repeats):
    f()
    t = []
    for _ in range(repeats):
        a = time.perf_counter()
        f()
        t.append(time.perf_counter() - a)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 22])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--rank", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    for n in a.sizes:
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(n // 1024, 1024, generator=g)
        raw = x.numel() * 4
        for spec, (enc, dec) in codecs(x, a.rank).items():
            e = enc()
            te = median_seconds(enc, a.repeats)
            td = median_seconds(lambda: dec(e), a.repeats)
            y = dec(e)
            rel = float(((y - x).norm() / x.norm()).item())
            print(json.dumps({"impl": "pytorch " + torch.__version__, "spec": spec, "numel": n, "threads": a.threads,
                              "encode_gbps": raw / te / 1e9, "decode_gbps": raw / td / 1e9, "rel_rms": rel}),
                  flush=True)


if __name__ == "__main__":
    main()
