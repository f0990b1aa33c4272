#!/usr/bin/env bash
# A PyTorch GPT (~2M parameters, scripts/bench_torch_gpt.py) trained data parallel by 4 processes, each in its own
# network namespace whose egress is limited to RATE by tc tbf (scripts/wan.sh; root only), with gloo and with
# longhaul's compressed settings: tokens/s and validation loss at equal steps, one JSON line per setting.
# gloo cannot use longhaul's in-process shaper, so both go through the same namespaces; this machine has no netem,
# so the links have their rate but no added delay.
#
#   bash scripts/bench_torch_wan.sh [RATE=20M] [STEPS=40] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-20M}
STEPS=${2:-40}
BUILD=${3:-${LH_BUILD_DIR:-build}}
PY=${LH_PYTHON:-/usr/bin/python3}
N=4
[ "$(id -u)" -eq 0 ] || { echo "bench_torch_wan.sh: needs root (network namespaces)" >&2; exit 1; }
bash scripts/wan.sh up "$N" "$RATE" >/dev/null
trap 'bash scripts/wan.sh down' EXIT
MASTER=$(bash scripts/wan.sh addr 0)
KEY=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
run() {  # run SETTING-ARGS...: one training run on all namespaces
  local port=$((30000 + RANDOM % 20000)) pids=()
  for i in $(seq 0 $((N - 1))); do
    bash scripts/wan.sh exec "$i" env RANK="$i" WORLD_SIZE="$N" LOCAL_RANK=0 MASTER_ADDR="$MASTER" MASTER_PORT="$port" \
      PYTHONPATH="$PWD/$BUILD/python" LH_JOB_KEY="$KEY" OMP_NUM_THREADS=1 UCX_NET_DEVICES=eth0 GLOO_SOCKET_IFNAME=eth0 \
      "$PY" scripts/bench_torch_gpt.py --steps "$STEPS" "$@" 2> >(grep -v Warning >&2) &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
echo "# $N processes, each link ${RATE}bit/s (tbf), $STEPS steps"
run --backend gloo
run --backend longhaul --codec none
run --backend longhaul --codec ef+int4
run --backend longhaul --powersgd 4
run --backend longhaul --diloco 10 --codec ef+int4
