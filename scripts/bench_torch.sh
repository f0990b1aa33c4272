#!/usr/bin/env bash
# The PyTorch bridge against what a PyTorch user has today (docs/torch.md; the figures in docs/bench.md):
#   1. all-reduce bus bandwidth, the "longhaul" backend (none, and ef+int4) beside gloo in the same processes, on
#      loopback, 4 KiB - 64 MiB, at 2 and 4 processes (scripts/bench_torch_allreduce.py);
#   2. the codecs' encode/decode GB/s from Python beside `longhaul bench codecs` (scripts/bench_torch_codecs.py).
#
#   bash scripts/bench_torch.sh [BUILD_DIR]
# Needs the build's Python package (Debian's python3-torch); the job secret is made up for the run.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${LH_BUILD_DIR:-build}}
PY=${LH_PYTHON:-/usr/bin/python3}
[ -f "$BUILD/python/longhaul/__init__.py" ] || { echo "bench_torch.sh: no Python package in $BUILD/python (is python3-torch installed?)" >&2; exit 1; }
export PYTHONPATH="$PWD/$BUILD/python" OMP_NUM_THREADS=1 UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
LH_JOB_KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LH_JOB_KEY
port() { echo $((30000 + RANDOM % 20000)); }
for n in 2 4; do
  for codec in none ef+int4; do
    "$PY" -m longhaul.torchrun --nproc_per_node "$n" --master_port "$(port)" scripts/bench_torch_allreduce.py \
      --codec "$codec" 2>&1 | grep -v Warning || true
    echo
  done
done
"$PY" scripts/bench_torch_codecs.py "$BUILD/bin/longhaul"
