"""scripts/bench_torch.sh's codec part: encode and decode GB/s (of float32 input) from Python through longhaul.codecs,
beside `longhaul bench codecs` on the same specs, sizes and one thread: what the binding costs.

    python3 scripts/bench_torch_codecs.py LONGHAUL_BINARY [--specs int8;int4;none] [--sizes 262144,4194304]
"""
import argparse
import json
import subprocess
import time

import torch

import longhaul.codecs as lhc


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--specs", default="int8;int4;fp16;none")
    ap.add_argument("--sizes", default="262144,4194304", help="elements (1 MiB and 16 MiB of float32)")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cpp = {}
    out = subprocess.run([args.binary, "--threads", "1", "bench", "codecs", "--json", "--specs", args.specs,
                          "--sizes", *args.sizes.split(","), "--repeats", str(args.repeats)], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            numel = 1
            for d in json.loads(r["shape"]):
                numel *= d
            cpp[(r["spec"], numel)] = r
    print(f"{'spec':<8} {'MiB':>5} {'py enc GB/s':>12} {'C++ enc':>8} {'py/C++':>7} {'py dec GB/s':>12} {'C++ dec':>8} "
          f"{'py/C++':>7}")
    for spec in args.specs.split(";"):
        codec = lhc.Codec(spec)
        for n in (int(s) for s in args.sizes.split(",")):
            x = torch.randn(n)
            state = lhc.StreamState("grad")
            pkt = codec.encode(x, state)
            out_t = torch.empty(n)
            enc = n * 4 / best(lambda: codec.encode(x, state), args.repeats) / 1e9
            dec = n * 4 / best(lambda: lhc.decode(pkt, out=out_t), args.repeats) / 1e9
            c = cpp.get((spec, n))
            ce, cd = (c["encode_gbps"], c["decode_gbps"]) if c else (float("nan"), float("nan"))
            print(f"{spec:<8} {n * 4 / 2**20:5.0f} {enc:12.2f} {ce:8.2f} {enc / ce:7.2f} {dec:12.2f} {cd:8.2f} "
                  f"{dec / cd:7.2f}", flush=True)


if __name__ == "__main__":
    main()
