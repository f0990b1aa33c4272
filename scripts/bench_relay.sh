#!/usr/bin/env bash
# Issue 17's figures: what the relay costs against a direct link at the same rate, and how long the pre-flight takes.
# Root (network namespaces, tc tbf, nftables: scripts/wan.sh and scripts/nat.sh).
#
#   scripts/bench_relay.sh [LONGHAUL]      (default: build/bin/longhaul)
# Environment: RATE (100M), STEPS (20), MODEL_FLAGS ("--d-model 256 --layers 4 --seq 128"), BATCH (16), MICROBATCHES
#   (4), WORKERS8 ("8": the pre-flight runs; pp 4 × dp 2), OUT (a fresh temp dir: each run's log and metrics).
#
# 1. A 2-stage job whose two workers each sit behind a RATE link, twice:
#      direct:  launch --netns RATE                         (each worker's egress at RATE, one bridge)
#      relayed: launch --nat-sites 2 --site-rate RATE       (each worker in its own NAT'd site, site uplinks at RATE;
#                                                            the pair cannot connect and goes through the relay)
#    Printed: the pre-flight's round trip and send rate each way on link 0-1, and the job's tokens/s (mean over
#    steps 2.., slowest worker), with relayed / direct.
# 2. The pre-flight's time (start barrier to its end, as the coordinator logs it) for WORKERS8 workers: on loopback
#    (every pair direct) and in 2 NAT'd sites (the pairs across them relayed; this includes the connect timeout the
#    pairs across the sites wait out).
set -euo pipefail

LH="${1:-build/bin/longhaul}"
RATE="${RATE:-100M}"
STEPS="${STEPS:-20}"
BATCH="${BATCH:-16}"
MICROBATCHES="${MICROBATCHES:-4}"
WORKERS8="${WORKERS8:-8}"
OUT="${OUT:-$(mktemp -d /tmp/lh_bench_relay.XXXXXX)}"
[ "$(id -u)" -eq 0 ] || { echo "bench_relay.sh: needs root (namespaces, tc, nftables)" >&2; exit 1; }
command -v jq >/dev/null || { echo "bench_relay.sh: needs jq" >&2; exit 1; }
[ -x "$LH" ] || { echo "bench_relay.sh: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"
read -r -a model_flags <<<"${MODEL_FLAGS:---d-model 256 --layers 4 --seq 128}"

tokens_per_s() {  # metrics file -> mean tokens/s over steps 2.. (slowest worker per step)
  jq -rs '(group_by(.step) | map(map(.tokens_per_s // empty) | min)) as $t |
          (if ($t | length) > 1 then $t[1:] else $t end) | add / length' "$1"
}
# "rtt_ms mbps_0to1 mbps_1to0" from the coordinator's pre-flight line for link 0-1 in a log.
preflight_01() {
  local line rtt a b
  line=$(grep -m1 'pre-flight 0-1 (0-1)' "$1" || true)
  rtt=$(sed -n 's/.*rtt \([0-9.]*\) ms.*/\1/p' <<<"$line")
  a=$(sed -n 's/.*0→1 \([0-9.]*\) Mbit\/s.*/\1/p' <<<"$line")
  b=$(sed -n 's/.*1→0 \([0-9.]*\) Mbit\/s.*/\1/p' <<<"$line")
  echo "${rtt:-?} ${a:-?} ${b:-?}"
}
preflight_seconds() {
  sed -n 's/.*pre-flight of \([0-9]*\) pairs (\([0-9]*\) relayed) took \([0-9.]*\) s.*/\1 \2 \3/p' "$1" | head -1
}

run_job() {  # name, launch flags...
  local name="$1"; shift
  "$LH" --log-level info launch --workers 2 --pp 2 --worker-threads 1 "${model_flags[@]}" --steps "$STEPS" \
    --batch "$BATCH" --microbatches "$MICROBATCHES" --eval-every 0 --seed 7 --metrics "$OUT/$name.jsonl" "$@" \
    >"$OUT/$name.log" 2>&1 || { echo "bench_relay.sh: the $name run failed; see $OUT/$name.log" >&2; exit 1; }
}

echo "bench_relay.sh: 2 stages, ${model_flags[*]}, batch $BATCH, $STEPS steps, links $RATE; logs in $OUT"
run_job direct --netns "$RATE"
run_job relayed --nat-sites 2 --site-rate "$RATE"
grep -q 'pre-flight 0-1 (0-1): relayed' "$OUT/relayed.log" ||
  { echo "bench_relay.sh: link 0-1 was not relayed in the NAT run; see $OUT/relayed.log" >&2; exit 1; }
read -r d_rtt d_a d_b < <(preflight_01 "$OUT/direct.log")
read -r r_rtt r_a r_b < <(preflight_01 "$OUT/relayed.log")
d_tps=$(tokens_per_s "$OUT/direct.jsonl")
r_tps=$(tokens_per_s "$OUT/relayed.jsonl")
printf '\n%-8s %10s %14s %14s %12s\n' path "rtt ms" "0→1 Mbit/s" "1→0 Mbit/s" "tokens/s"
printf '%-8s %10s %14s %14s %12.0f\n' direct "$d_rtt" "$d_a" "$d_b" "$d_tps"
printf '%-8s %10s %14s %14s %12.0f\n' relayed "$r_rtt" "$r_a" "$r_b" "$r_tps"
awk -v d="$d_tps" -v r="$r_tps" -v dr="$d_rtt" -v rr="$r_rtt" 'BEGIN {
  printf "relayed / direct tokens/s: %.3f; round trip added by the relay: %.2f ms\n", r / d, rr - dr }'

echo
echo "pre-flight time, $WORKERS8 workers (pp 4 × dp $((WORKERS8 / 4))):"
for mode in loopback nat; do
  flags=()
  [ "$mode" = nat ] && flags=(--nat-sites 2)
  "$LH" --log-level info launch --workers "$WORKERS8" --pp 4 --dp $((WORKERS8 / 4)) --worker-threads 1 --layers 4 \
    --d-model 64 --seq 32 --batch 16 --steps 2 --eval-every 0 --metrics "$OUT/pf_$mode.jsonl" "${flags[@]}" \
    >"$OUT/pf_$mode.log" 2>&1 || { echo "bench_relay.sh: the $mode pre-flight run failed; see $OUT/pf_$mode.log" >&2; exit 1; }
  read -r pairs relayed secs < <(preflight_seconds "$OUT/pf_$mode.log")
  printf '  %-9s %3s pairs, %3s relayed: %s s\n' "$mode" "$pairs" "$relayed" "$secs"
done
