#!/usr/bin/env bash
# Adaptive compression against codecs chosen by hand: a 4-stage job over uneven links (default 0-1 100 Mbit/s,
# 1-2 20 Mbit/s, 2-3 5 Mbit/s, both ways), the same steps and seed for every run: `auto` on both directions, and
# fixed per-link choices (the same codec everywhere, and choices by hand per link). Used by people and the uneven-
# links issue's note (target: auto ≥ 0.9× the tokens/s of the best fixed choice, validation loss within 1% of it).
#
#   scripts/bench_auto.sh [LONGHAUL]      (default: build/bin/longhaul)
# Environment: STEPS (60), LINKS ("0-1=100M 1-2=20M 2-3=5M"), MODEL_FLAGS ("--layers 4 --d-model 256 --heads 4
#   --seq 32"), BATCH (8), MICROBATCHES (4), AUTO_EVERY (5), FIXED (';'-separated runs, each "fwd01 fwd12 fwd23"
#   codecs used both ways; default below), OUT (a fresh temp dir: each run's log and metrics).
# Prints per run: tokens/s (mean over steps 3.., slowest worker), its ratio to the best fixed run, the validation
# loss at the last step and its gap to the best fixed run's, and auto's decisions.
set -euo pipefail

LH="${1:-build/bin/longhaul}"
STEPS="${STEPS:-60}"
LINKS="${LINKS:-0-1=100M 1-2=20M 2-3=5M}"
BATCH="${BATCH:-8}"
MICROBATCHES="${MICROBATCHES:-4}"
AUTO_EVERY="${AUTO_EVERY:-5}"
read -r -a MODEL <<<"${MODEL_FLAGS:---layers 4 --d-model 256 --heads 4 --seq 32}"
OUT="${OUT:-$(mktemp -d /tmp/lh_bench_auto.XXXXXX)}"
command -v jq >/dev/null || { echo "bench_auto.sh: needs jq (apt-get install jq)" >&2; exit 1; }
[ -x "$LH" ] || { echo "bench_auto.sh: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"
DEFAULT_FIXED="none none none;bf16 bf16 bf16;int8 int8 int8;int4 int4 int4;none int8 int4;none bf16 int4;bf16 int8 int4;none int4 int4"
IFS=';' read -r -a FIXED_RUNS <<<"${FIXED:-$DEFAULT_FIXED}"

link_flags=(--link 10G)
for l in $LINKS; do link_flags+=(--link "$l"); done
read -r -a LINK_NAMES <<<"$(for l in $LINKS; do echo -n "${l%%=*} "; done)"

run_job() {  # name, extra flags...
  local name=$1
  shift
  "$LH" --log-level warn launch --workers 4 --pp 4 --worker-threads 1 --ucx-tls tcp "${MODEL[@]}" --batch "$BATCH" \
    --microbatches "$MICROBATCHES" --steps "$STEPS" --warmup 5 --seed 7 --eval-every 0 "${link_flags[@]}" \
    --metrics "$OUT/$name.jsonl" "$@" >"$OUT/$name.log" 2>&1 || {
    echo "bench_auto.sh: run $name failed; see $OUT/$name.log" >&2
    exit 1
  }
}
tokens() { jq -s '[group_by(.step)[] | select(.[0].step > 2) | map(.tokens_per_s) | min] | add / length' "$1"; }
val_loss() { jq -s '[.[] | select(.val_loss != null)] | max_by(.step) | .val_loss' "$1"; }

echo "bench_auto: ${MODEL[*]}, batch $BATCH, $MICROBATCHES microbatches, $STEPS steps, links: $LINKS; output in $OUT" >&2
names=()
for i in "${!FIXED_RUNS[@]}"; do
  read -r -a codecs <<<"${FIXED_RUNS[$i]}"
  flags=()
  for j in "${!LINK_NAMES[@]}"; do flags+=(--compress-link "${LINK_NAMES[$j]}:fwd=${codecs[$j]}" --compress-link "${LINK_NAMES[$j]}:bwd=${codecs[$j]}"); done
  name="fixed$i"
  echo "  running $name: ${FIXED_RUNS[$i]}" >&2
  run_job "$name" "${flags[@]}"
  names+=("$name")
done
echo "  running auto" >&2
run_job auto --compress-fwd auto --compress-bwd auto --auto-every "$AUTO_EVERY"

best="" best_tps=0
for n in "${names[@]}"; do
  t=$(tokens "$OUT/$n.jsonl")
  if awk -v a="$t" -v b="$best_tps" 'BEGIN { exit !(a > b) }'; then best=$n best_tps=$t; fi
done
best_val=$(val_loss "$OUT/$best.jsonl")
printf "%-26s %12s %10s %10s %10s\n" "codecs (0-1 1-2 2-3)" "tokens/s" "of best" "val loss" "gap"
show() {  # name, label
  local t v
  t=$(tokens "$OUT/$1.jsonl")
  v=$(val_loss "$OUT/$1.jsonl")
  printf "%-26s %12.1f %9.3fx %10.4f %9.2f%%\n" "$2" "$t" "$(awk -v a="$t" -v b="$best_tps" 'BEGIN { print a / b }')" "$v" \
    "$(awk -v a="$v" -v b="$best_val" 'BEGIN { print 100 * (a - b) / b }')"
}
for i in "${!names[@]}"; do show "${names[$i]}" "${FIXED_RUNS[$i]}$([ "${names[$i]}" = "$best" ] && echo " (best)")"; done
show auto "auto"
echo "auto's decisions:"
"$LH" report "$OUT/auto.jsonl" | grep '^auto, after step' | sed 's/^/  /'
