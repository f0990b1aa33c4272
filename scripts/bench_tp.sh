#!/usr/bin/env bash
# Tensor parallelism over slow links: tp=2 and pp=2 × tp=2 over 1 Gbit/s,1 ms and 100 Mbit/s,10 ms links, the same
# steps for every tp codec, against the unlimited link and against tp=1 (the same pp) over the same link; then the
# memory each shard holds for --model base --heads 8 at tp=1, 2, 4 and pp=2 × tp=2. Used by people and the tp
# issue's closing note.
#
#   scripts/bench_tp.sh [LONGHAUL]      (default: build/bin/longhaul)
# Environment: STEPS (150), RATES ("1G,1ms 100M,10ms"), GRIDS ("tp2 pp2tp2"), CODECS (all below), BATCH (8),
#   MICROBATCHES (2), MODEL_FLAGS (default "--layers 4 --d-model 128 --heads 4 --seq 64"), MEMORY (1: run the
#   memory table; 0: skip it), MEMORY_STEPS (2), OUT (a fresh temp dir: each run's log and metrics).
# Prints, per grid, link and codec: tokens/s (mean over steps 2.., slowest worker), its ratio to the unlimited
# link and to tp=1, tp bytes per step (sent by all workers) and how many times fewer than `none`, validation loss
# at the last step and its gap to `none` (the unlimited run, which is `none` without a shaper).
set -euo pipefail

LH="${1:-build/bin/longhaul}"
STEPS="${STEPS:-150}"
RATES="${RATES:-1G,1ms 100M,10ms}"
GRIDS="${GRIDS:-tp2 pp2tp2}"
BATCH="${BATCH:-8}"
MICROBATCHES="${MICROBATCHES:-2}"
MEMORY="${MEMORY:-1}"
MEMORY_STEPS="${MEMORY_STEPS:-2}"
read -r -a MODEL <<<"${MODEL_FLAGS:---layers 4 --d-model 128 --heads 4 --seq 64}"
OUT="${OUT:-$(mktemp -d /tmp/lh_bench_tp.XXXXXX)}"
command -v jq >/dev/null || { echo "bench_tp.sh: needs jq (apt-get install jq)" >&2; exit 1; }
[ -x "$LH" ] || { echo "bench_tp.sh: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"

DEFAULT_CODECS=("none" "bf16" "int8" "int4" "lowrank:rank=8+int8")
if [ -n "${CODECS:-}" ]; then IFS=';' read -r -a RUNS <<<"$CODECS"; else RUNS=("${DEFAULT_CODECS[@]}"); fi

grid_flags() {  # grid -> flags; tp1 of the same pp is the baseline
  case "$1" in
    tp2) echo "--pp 1 --tp 2" ;;
    pp2tp2) echo "--pp 2 --tp 2" ;;
    tp1) echo "--pp 1 --workers 1" ;;
    pp2) echo "--pp 2 --workers 2" ;;
    *) echo "bench_tp.sh: unknown grid '$1' (tp2, pp2tp2)" >&2; exit 2 ;;
  esac
}
baseline_of() { case "$1" in tp2) echo tp1 ;; pp2tp2) echo pp2 ;; esac; }
stem_of() { printf '%s' "$*" | tr -c 'A-Za-z0-9.+=-' '_'; }

run() {  # file stem, flags...
  local stem="$1"; shift
  if ! "$LH" --log-level warn launch "$@" --steps "$STEPS" --batch "$BATCH" --microbatches "$MICROBATCHES" \
       "${MODEL[@]}" --eval-every 0 --seed 7 --metrics "$OUT/$stem.jsonl" >"$OUT/$stem.log" 2>&1; then
    echo "bench_tp.sh: run '$stem' failed; its log:" >&2; tail -20 "$OUT/$stem.log" >&2; exit 1
  fi
}

stats() {  # metrics file -> "tokens_per_s val_loss tp_wire_bytes_per_step tp_raw_bytes_per_step"
  jq -rs '
    (map(select(.val_loss != null)) | sort_by(.step) | last | .val_loss) as $val |
    (group_by(.step) | map(map(.tokens_per_s // empty) | min)) as $t |
    (if ($t | length) > 1 then $t[1:] else $t end) as $t2 |
    (map(.step) | max) as $steps |
    ([.[] | select(.step < $steps) | .links[]? | select(.dir == "send" and .role == "tp")]) as $g |
    "\($t2 | add / length) \($val) \(($g | map(.wire_bytes) | add // 0) / ([$steps - 1, 1] | max)) \(($g | map(.raw_bytes) | add // 0) / ([$steps - 1, 1] | max))"
  ' "$1"
}

echo "bench_tp: ${MODEL[*]}, batch $BATCH, $MICROBATCHES microbatches, $STEPS steps, links $RATES; output in $OUT" >&2
for grid in $GRIDS; do
  read -r -a G <<<"$(grid_flags "$grid")"
  base=$(baseline_of "$grid")
  read -r -a B <<<"$(grid_flags "$base")"
  echo "  $grid: unlimited" >&2
  run "$grid.unlimited" "${G[@]}" --compress-tp none
  read -r u_tps u_val u_tp _ < <(stats "$OUT/$grid.unlimited.jsonl")
  for rate in $RATES; do
    echo "  $base over $rate (baseline)" >&2
    run "$base.$(stem_of "$rate")" "${B[@]}" --link "$rate"
    read -r b_tps _ _ _ < <(stats "$OUT/$base.$(stem_of "$rate").jsonl")
    for codec in "${RUNS[@]}"; do
      echo "  $grid over $rate: $codec" >&2
      run "$grid.$(stem_of "$rate").$(stem_of "$codec")" "${G[@]}" --link "$rate" --compress-tp "$codec"
    done
    printf '\n%s over %s (unlimited: %.0f tokens/s, val loss %.4f; %s over the same link: %.0f tokens/s)\n' \
      "$grid" "$rate" "$u_tps" "$u_val" "$base" "$b_tps"
    printf '%-22s %10s %8s %8s %12s %8s %10s %8s\n' codec "tokens/s" "x unlim" "x tp=1" "tp KB/step" "x fewer" \
      "val loss" "gap"
    for codec in "${RUNS[@]}"; do
      read -r tps val tpb _ < <(stats "$OUT/$grid.$(stem_of "$rate").$(stem_of "$codec").jsonl")
      awk -v l="$codec" -v t="$tps" -v u="$u_tps" -v b="$b_tps" -v v="$val" -v nv="$u_val" -v g="$tpb" -v ng="$u_tp" \
        'BEGIN { fewer = (g > 0 && ng > 0) ? sprintf("%.1fx", ng / g) : "-"
                 printf "%-22s %10.0f %8.2f %8.2f %12.1f %8s %10.4f %7.2f%%\n", l, t, t / u, t / b, g / 1e3, fewer, v,
                        100 * (v - nv) / nv }'
    done
  done
done

if [ "$MEMORY" = 1 ]; then
  echo
  echo "memory, --model base --heads 8 (per worker: fp32 parameters + gradients + AdamW moments, and peak RSS)"
  printf '%-8s %6s %14s %10s %12s\n' grid rank "state MB" "x tp=1" "peak RSS MB"
  ref=""
  for g in "tp1|--workers 1" "tp2|--tp 2" "tp4|--tp 4" "pp2tp2|--pp 2 --tp 2"; do
    name="${g%%|*}"
    read -r -a F <<<"${g#*|}"
    log="$OUT/memory.$name.log"
    if ! "$LH" --log-level info launch "${F[@]}" --model base --heads 8 --steps "$MEMORY_STEPS" --batch 4 \
         --microbatches 1 --eval-every 0 --metrics "$OUT/memory.$name.jsonl" >"$log" 2>&1; then
      echo "bench_tp.sh: memory run $name failed; its log:" >&2; tail -20 "$log" >&2; exit 1
    fi
    for rank in $(grep -o 'rank [0-9]* (stage' "$log" | awk '{print $2}' | sort -n); do
      state=$(grep "rank $rank (stage" "$log" | sed -E 's/.*optimizer state ([0-9.]+) MB.*/\1/')
      rss=$(grep "rank $rank: peak resident memory" "$log" | sed -E 's/.*memory ([0-9.]+) MB.*/\1/')
      [ -z "$ref" ] && ref=$state
      awk -v n="$name" -v r="$rank" -v s="$state" -v f="$ref" -v m="$rss" \
        'BEGIN { printf "%-8s %6d %14.2f %10.3f %12s\n", n, r, s, s / f, m }'
    done
  done
  echo "target: each shard's state <= 1.1/tp of tp=1's"
fi
echo
echo "target: int4 on the tp role (>= 7x fewer tp bytes) with validation loss within 1% of none at equal steps."
