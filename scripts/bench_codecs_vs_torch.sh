#!/usr/bin/env bash
# longhaul's CPU codecs beside the same codecs written as PyTorch CPU tensor ops (scripts/bench_codecs_torch.py),
# same machine, same threads, same tensors, run back to back per size: the table issue 16 asks for.
#
#   scripts/bench_codecs_vs_torch.sh [LONGHAUL]        (default: build/bin/longhaul)
# Environment: THREADS (2), SIZES ("1048576 4194304": 4 MiB and 16 MiB of fp32), REPEATS (15), ROUNDS (3:
#   PyTorch and longhaul alternate this many times per size, as a shared machine's bandwidth drifts from minute
#   to minute; longhaul's figure is the median over the rounds, PyTorch's its best round), ISA ("all": every instruction set this CPU runs,
#   so the portable path is measured beside the dispatched ones), BEFORE (another longhaul binary, e.g. an older
#   build, whose rows are printed as isa "before" in the same rounds).
# PyTorch allocates every result afresh, and glibc's adaptive mmap threshold then makes some runs pay a page
# fault per 4 KiB (up to 20x slower here, by chance of ordering). Its process runs with malloc tunables that
# keep freed memory for reuse, and its best round is kept: the baseline is PyTorch at its fastest.
# Needs Debian's python3-torch (installed here with apt-get when missing and running as root); the longhaul
# build does not depend on it.
# Prints per codec and size: PyTorch encode/decode GB/s, longhaul's per ISA, the ratios to PyTorch and to a
# memcpy on THREADS threads, and the targets (int8/int4/int2/lowrank >= 2x PyTorch, fp16/bf16 >= 1x,
# streaming codecs >= 0.5x memcpy).
set -euo pipefail

LH="${1:-build/bin/longhaul}"
THREADS="${THREADS:-2}"
SIZES="${SIZES:-1048576 4194304}"
REPEATS="${REPEATS:-15}"
ISA="${ISA:-all}"
ROUNDS="${ROUNDS:-3}"
PY=/usr/bin/python3
[ -x "$LH" ] || { echo "bench_codecs_vs_torch.sh: no longhaul binary at $LH" >&2; exit 1; }
if ! "$PY" -c 'import torch' 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-torch >/dev/null
  else
    echo "bench_codecs_vs_torch.sh: needs python3-torch (apt-get install python3-torch)" >&2
    exit 1
  fi
fi
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d /tmp/lh_codecs_vs_torch.XXXXXX)"
specs="fp16;bf16;int8;int4;int2;lowrank:rank=8"
for round in $(seq "$ROUNDS"); do
  for n in $SIZES; do
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296 \
      OMP_NUM_THREADS="$THREADS" "$PY" "$here/bench_codecs_torch.py" --threads "$THREADS" --sizes "$n" \
      --repeats "$REPEATS" >>"$out/torch.jsonl"
    OMP_NUM_THREADS="$THREADS" "$LH" bench codecs --json --isa "$ISA" --sizes "$n" --specs "$specs" \
      --repeats "$REPEATS" >>"$out/longhaul.jsonl"
    if [ -n "${BEFORE:-}" ]; then
      OMP_NUM_THREADS="$THREADS" "$BEFORE" bench codecs --json --sizes "$n" --specs "$specs" \
        --repeats "$REPEATS" >>"$out/before.jsonl"
    fi
  done
done
"$PY" - "$out" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
out = sys.argv[1]
FIELDS = ("encode_gbps", "decode_gbps", "encode_vs_memcpy", "decode_vs_memcpy")

def merged(records, key, pick):
    groups = {}
    for r in records:
        groups.setdefault(key(r), []).append(r)
    merged = {}
    for k, rs in groups.items():
        m = dict(rs[0])
        for f in FIELDS:
            if f in m:
                m[f] = pick(r[f] for r in rs)
        merged[k] = m
    return merged

torch = merged(map(json.loads, open(f"{out}/torch.jsonl")), lambda r: (r["spec"], r["numel"]), max)
import os
lines = [json.loads(l) for l in open(f"{out}/longhaul.jsonl")]
if os.path.exists(f"{out}/before.jsonl"):
    lines += [dict(json.loads(l), isa="before") for l in open(f"{out}/before.jsonl")]
order = {"before": 0, "baseline": 1, "avx2": 2, "avx512": 3}
lines.sort(key=lambda r: (int(eval(r["shape"].replace("[", "").replace("]", "").replace(", ", "*"))), r["spec"],
                          order.get(r["isa"], 9)))
rows = list(merged(lines, lambda r: (r["shape"], r["spec"], r["isa"]), lambda v: statistics.median(list(v))).values())
target = {"fp16": 1.0, "bf16": 1.0}
streaming = {"fp16", "bf16", "int8", "int4", "int2"}
print(f"{sys.argv[2]} rounds (longhaul: median, PyTorch: best); threads {rows[0]['threads']}; GB/s of raw fp32 bytes; x = longhaul / PyTorch; mc = longhaul / memcpy on "
      f"{rows[0]['threads']} threads; ok = meets its target")
print(f"{'spec':16s} {'MiB':>4s} {'isa':8s} {'torch enc':>9s} {'lh enc':>7s} {'x':>6s} {'mc':>5s}   "
      f"{'torch dec':>9s} {'lh dec':>7s} {'x':>6s} {'mc':>5s}  target")
for r in rows:
    n = int(eval(r["shape"].replace("[", "").replace("]", "").replace(", ", "*")))
    t = torch[(r["spec"], n)]
    xt = target.get(r["spec"], 2.0)
    xe, xd = r["encode_gbps"] / t["encode_gbps"], r["decode_gbps"] / t["decode_gbps"]
    me, md = r["encode_vs_memcpy"], r["decode_vs_memcpy"]
    ok = xe >= xt and xd >= xt and (r["spec"] not in streaming or (me >= 0.5 and md >= 0.5))
    goal = f">={xt:g}x torch" + (", >=0.5 mc" if r["spec"] in streaming else "")
    print(f"{r['spec']:16s} {n * 4 >> 20:4d} {r['isa']:8s} {t['encode_gbps']:9.2f} {r['encode_gbps']:7.2f} "
          f"{xe:6.2f} {me:5.2f}   {t['decode_gbps']:9.2f} {r['decode_gbps']:7.2f} {xd:6.2f} {md:5.2f}  "
          f"{goal} {'ok' if ok else 'MISSED'}")
PYEOF
echo "raw results: $out"
