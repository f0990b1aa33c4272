#!/usr/bin/env bash
# Data parallelism over slow links: dp=4 (and pp=2 × dp=2) over 20 Mbit/s, 50 ms links, the same steps for every
# gradient codec, against an unlimited-link run of the same grid. Used by people and the dp issue's closing note.
#
#   scripts/bench_dp.sh [LONGHAUL]      (default: build/bin/longhaul)
# Environment: STEPS (100), RATE ("20M,50ms"), GRIDS ("dp4 pp2dp2"), CODECS (all below), BATCH (256),
#   MICROBATCHES (2), MODEL flags in MODEL_FLAGS (default "--layers 4 --d-model 128 --heads 4 --seq 64"),
#   OUT (a fresh temp dir: each run's log and metrics).
# Why a global batch of 256 (4,096 tokens per replica and step): a step's exchange cannot finish before its last
# bucket (the first block and the embedding, produced last by backward) has crossed one 50 ms hop, so an
# every-step exchange costs at least ~0.1 s a step whatever the codec. Compute per gradient byte grows with the
# tokens a replica computes per step, not with the model (both scale with the parameters); at batch 16 a step
# computes for 0.1 s and no every-step codec within 2% of `none`'s loss got above 0.5x. BATCH=16 gives that regime.
# Prints, per grid and codec: tokens/s (mean over steps 2.., slowest worker) and its ratio to the unlimited run, the
# same ratio over the steps after the learning-rate warmup (WARMUP, 20: `--sync delayed` runs its warmup every-step,
# so this is its steady state; the unlimited run's mean over the same steps is the base),
# validation loss at the last step and its gap to `none`, gradient bytes per step (sent by all workers) and how
# many times fewer than `none` (both measured on the unlimited run, which is `none` without a shaper).
set -euo pipefail

LH="${1:-build/bin/longhaul}"
STEPS="${STEPS:-100}"
RATE="${RATE:-20M,50ms}"
GRIDS="${GRIDS:-dp4 pp2dp2}"
BATCH="${BATCH:-256}"
MICROBATCHES="${MICROBATCHES:-2}"
WARMUP="${WARMUP:-20}"
read -r -a MODEL <<<"${MODEL_FLAGS:---layers 4 --d-model 128 --heads 4 --seq 64}"
OUT="${OUT:-$(mktemp -d /tmp/lh_bench_dp.XXXXXX)}"
command -v jq >/dev/null || { echo "bench_dp.sh: needs jq (apt-get install jq)" >&2; exit 1; }
[ -x "$LH" ] || { echo "bench_dp.sh: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"

# name|flags (the name is also the table's label)
DEFAULT_CODECS=(
  "none|--compress-grad none"
  "int8|--compress-grad int8"
  "ef+int4|--compress-grad ef+int4"
  "ef+int2|--compress-grad ef+int2"
  "ef+topk:0.01+int4|--compress-grad ef+topk:ratio=0.01+int4"
  "powersgd:rank=4|--compress-grad powersgd:rank=4"
  "ef+int4 delayed D=1|--compress-grad ef+int4 --sync delayed:D=1"
  "ef+int4 delayed D=2|--compress-grad ef+int4 --sync delayed:D=2"
  "diloco H=50+int4|--compress-grad int4 --sync diloco:H=50,outer_lr=0.7,outer_momentum=0.9"
)
if [ -n "${CODECS:-}" ]; then IFS=';' read -r -a RUNS <<<"$CODECS"; else RUNS=("${DEFAULT_CODECS[@]}"); fi

grid_flags() {
  case "$1" in
    dp4) echo "--workers 4 --pp 1 --dp 4" ;;
    pp2dp2) echo "--workers 4 --pp 2 --dp 2" ;;
    *) echo "bench_dp.sh: unknown grid '$1' (dp4, pp2dp2)" >&2; exit 2 ;;
  esac
}

run() {  # file stem, flags...
  local stem="$1"; shift
  if ! "$LH" --log-level warn launch "$@" --steps "$STEPS" --batch "$BATCH" --microbatches "$MICROBATCHES" \
       "${MODEL[@]}" --warmup "$WARMUP" --eval-every 0 --seed 7 --metrics "$OUT/$stem.jsonl" \
       >"$OUT/$stem.log" 2>&1; then
    echo "bench_dp.sh: run '$stem' failed; its log:" >&2; tail -20 "$OUT/$stem.log" >&2; exit 1
  fi
}

# metrics file -> "tokens_per_s val_loss grad_wire_bytes_per_step grad_raw_bytes_per_step steady_tokens_per_s"
stats() {
  jq -rs --argjson w "$WARMUP" '
    (map(select(.val_loss != null)) | sort_by(.step) | last | .val_loss) as $val |
    (group_by(.step) | map({step: .[0].step, tps: (map(.tokens_per_s // empty) | min)})) as $t |
    (if ($t | length) > 1 then $t[1:] else $t end | map(.tps)) as $t2 |
    ($t | map(select(.step > $w and .step > 1) | .tps)) as $ts |
    (map(.step) | max) as $steps |
    ([.[] | .links[]? | select(.dir == "send" and .role == "grad")]) as $g |
    ($g | map(.wire_bytes) | add // 0) as $wire | ($g | map(.raw_bytes) | add // 0) as $raw |
    (if $ts == [] then $t2 else $ts end) as $steady |
    "\($t2 | add / length) \($val) \($wire / $steps) \($raw / $steps) \($steady | add / length)"
  ' "$1"
}

echo "bench_dp: ${MODEL[*]}, batch $BATCH, warmup $WARMUP, $MICROBATCHES microbatches per replica, $STEPS steps," \
     "links $RATE; output in $OUT" >&2
for grid in $GRIDS; do
  read -r -a G <<<"$(grid_flags "$grid")"
  echo "  $grid: unlimited" >&2
  run "$grid.unlimited" "${G[@]}" --compress-grad none
  for entry in "${RUNS[@]}"; do
    name="${entry%%|*}"
    read -r -a F <<<"${entry#*|}"
    stem="$grid.$(printf '%s' "$name" | tr -c 'A-Za-z0-9.+=-' '_')"
    echo "  $grid: $name" >&2
    run "$stem" "${G[@]}" --link "$RATE" "${F[@]}"
  done

  # The unlimited run is `none` without a shaper: the same losses and gradient bytes as the shaped `none` run, so it
  # is the reference for the loss gap and the byte ratio (and a CODECS list without none still gets both).
  read -r u_tps u_val u_grad _ u_steady < <(stats "$OUT/$grid.unlimited.jsonl")
  n_val=$u_val n_grad=$u_grad
  printf '\n%s over %s (unlimited: %.0f tokens/s, val loss %.4f)\n' "$grid" "$RATE" "$u_tps" "$u_val"
  printf '%-20s %10s %8s %8s %10s %8s %12s %10s\n' codec "tokens/s" "x unlim" "x steady" "val loss" "gap" \
    "grad KB/step" "x fewer"
  for entry in "${RUNS[@]}"; do
    name="${entry%%|*}"
    stem="$grid.$(printf '%s' "$name" | tr -c 'A-Za-z0-9.+=-' '_')"
    read -r tps val grad _ steady < <(stats "$OUT/$stem.jsonl")
    awk -v l="$name" -v t="$tps" -v u="$u_tps" -v s="$steady" -v us="$u_steady" -v v="$val" -v nv="$n_val" \
        -v g="$grad" -v ng="$n_grad" 'BEGIN {
      fewer = (g > 0 && ng > 0) ? sprintf("%.1fx", ng / g) : "-"
      printf "%-20s %10.0f %8.2f %8.2f %10.4f %7.2f%% %12.1f %10s\n", l, t, t / u, s / us, v, 100 * (v - nv) / nv,
        g / 1e3, fewer }'
  done
done
echo
echo "targets: one per-step codec at >= 0.9x the unlimited tokens/s with val loss within 2% of none;" \
     "diloco+int4 >= 200x fewer gradient bytes than per-step none within 2%."
