#!/usr/bin/env bash
# The mission's headline benchmark: the small GPT in 4 pipeline stages over 20 Mbit/s links, with none / int8 /
# subspace+int8 compression against an unlimited-link ceiling. Used by people and the closing report.
#
#   scripts/bench_wan.sh [LONGHAUL]      (default: build/bin/longhaul)
# Environment: STEPS (30), RATE (20M; "RATE,DELAY" works too), MODEL (small), STAGES (4), BATCH (16),
#   MICROBATCHES (4), SUBSPACE_K (32), SCHEDULE (1f1b), NETNS=1 (root: real tbf links instead of the
#   in-process shaper), OUT (a fresh temp dir: each run's log and metrics), MODEL_FLAGS (extra model flags,
#   e.g. "--d-model 192"), SEQ (128: the model's context length, for step times).
#   DELAYS="0 10 50 100" switches to the latency sweep (issue 16): for each schedule in SCHEDULES (default SCHEDULE;
#   e.g. "1f1b gpipe eager") a link-free run, then int8 on both directions over RATE with each one-way delay (ms, the
#   in-process shaper: tbf has no delay), printing the step time against the link-free step, against the
#   synchronous bound = link-free step + 2(S-1) x delay, and against a lower bound that also counts the bytes.
# Prints, per run: tokens/s (mean over steps 2.., slowest worker), ratio to the ceiling, final and validation
# loss, total wire MB, ratio raw/wire, and the wire bytes saved against the `none` run.
set -euo pipefail

LH="${1:-build/bin/longhaul}"
STEPS="${STEPS:-30}"
RATE="${RATE:-20M}"
MODEL="${MODEL:-small}"
STAGES="${STAGES:-4}"
BATCH="${BATCH:-16}"
MICROBATCHES="${MICROBATCHES:-4}"
SUBSPACE_K="${SUBSPACE_K:-32}"
SCHEDULE="${SCHEDULE:-1f1b}"
OUT="${OUT:-$(mktemp -d /tmp/lh_bench_wan.XXXXXX)}"
command -v jq >/dev/null || { echo "bench_wan.sh: needs jq (apt-get install jq)" >&2; exit 1; }
[ -x "$LH" ] || { echo "bench_wan.sh: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"

LINK=(--link "$RATE")
if [ "${NETNS:-0}" = 1 ]; then LINK=(--netns "$RATE"); fi

read -r -a model_flags <<<"${MODEL_FLAGS:-}"
set_common() {  # the flags of every run, with schedule $1
  common=(--log-level warn launch --workers "$STAGES" --pp "$STAGES" --model "$MODEL" "${model_flags[@]}" --steps "$STEPS"
          --batch "$BATCH" --microbatches "$MICROBATCHES" --schedule "$1" --eval-every 0 --seed 7)
}
set_common "$SCHEDULE"

run() {  # name, extra flags...
  local name="$1"; shift
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$LH" "${common[@]}" --metrics "$OUT/$name.jsonl" "$@" >"$OUT/$name.log" 2>&1; then
    # Seen on a heavily loaded machine: UCX reports a live peer's endpoint as timed out at start-up.
    echo "bench_wan.sh: run '$name' failed ($(grep -m1 'longhaul: error' "$OUT/$name.log" | cut -c1-160)); retrying once" >&2
    mv "$OUT/$name.log" "$OUT/$name.failed.log"
    t0=$(date +%s.%N)
    if ! "$LH" "${common[@]}" --metrics "$OUT/$name.jsonl" "$@" >"$OUT/$name.log" 2>&1; then
      echo "bench_wan.sh: run '$name' failed again; its log:" >&2; tail -20 "$OUT/$name.log" >&2; exit 1
    fi
  fi
  t1=$(date +%s.%N)
  echo "$name $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" >>"$OUT/wall.txt"
}

stats() {  # metrics file -> "tokens_per_s final_loss val_loss wire_bytes raw_bytes"
  jq -rs '
    (map(select(.loss != null)) | sort_by(.step) | last | .loss) as $final |
    (map(select(.val_loss != null)) | sort_by(.step) | last | .val_loss) as $val |
    (group_by(.step) | map(map(.tokens_per_s // empty) | min)) as $t |
    (if ($t | length) > 1 then $t[1:] else $t end) as $t2 |
    ([.[] | .links[]? | select((.dir // "send") == "send")]) as $ls |
    "\($t2 | add / length) \($final) \($val) \($ls | map(.wire_bytes) | add // 0) \($ls | map(.raw_bytes) | add // 0)"
  ' "$1"
}

: >"$OUT/wall.txt"
if [ -n "${DELAYS:-}" ]; then
  SEQ="${SEQ:-128}"
  SCHEDULES="${SCHEDULES:-$SCHEDULE}"
  rate="${RATE%%,*}"
  rate_bps=$(awk -v r="$rate" 'BEGIN { m = 1; u = substr(r, length(r)); if (u == "k") m = 1e3; if (u == "M") m = 1e6;
                                        if (u == "G") m = 1e9; if (m > 1) r = substr(r, 1, length(r) - 1); print r * m }')
  echo "bench_wan delay sweep: $MODEL ${MODEL_FLAGS:-} GPT, $STAGES stages ($SCHEDULES; $MICROBATCHES microbatches," \
       "batch $BATCH), $STEPS steps, int8 both ways over $rate with one-way delays: $DELAYS ms; output in $OUT" >&2
  for sch in $SCHEDULES; do
    set_common "$sch"
    run "linkfree.$sch" --compress-fwd int8 --compress-bwd int8
    for d in $DELAYS; do run "delay$d.$sch" --link "$rate,${d}ms" --compress-fwd int8 --compress-bwd int8; done
  done
  first=${SCHEDULES%% *}
  read -r f_tps _ _ _ _ < <(stats "$OUT/linkfree.$first.jsonl")
  f_step=$(awk -v t="$f_tps" -v b="$BATCH" -v s="$SEQ" 'BEGIN {printf "%.4f", b * s / t}')
  # From the link-free run of the first schedule: one microbatch's compute through every stage (the sum over stages
  # of compute per step / M) and one message's wire time each way on the shaped rate (int8 packets, mean over links).
  read -r mb_path x_fwd x_bwd < <(jq -rs --argjson M "$MICROBATCHES" --argjson S "$STAGES" --argjson bps "$rate_bps" '
    (map(.step) | max) as $last | map(select(.step > 1 and .step < $last)) as $r |
    ($r | map(.step) | unique | length) as $n |
    def per_msg(role): [$r[] | .links[]? | select(.role == role and .dir == "send") | .wire_bytes] | add / $n / (($S - 1) * $M) * 8 / $bps;
    "\(([$r[] | .compute_s] | add) / $n / $M) \(per_msg("act")) \(per_msg("act_grad"))"' "$OUT/linkfree.$first.jsonl")
  printf '\n%-18s %8s %8s %10s %8s %10s %8s %10s\n' run "step s" "x free" "bound s" "x bound" "bytes lb" "x lb" "loss"
  for sch in $SCHEDULES; do
    for name in linkfree $(for d in $DELAYS; do echo "delay$d"; done); do
      read -r tps loss _ _ _ < <(stats "$OUT/$name.$sch.jsonl")
      d=0
      [ "$name" != linkfree ] && d="${name#delay}"
      awk -v n="$name.$sch" -v t="$tps" -v b="$BATCH" -v s="$SEQ" -v f="$f_step" -v d="$d" -v S="$STAGES" \
          -v M="$MICROBATCHES" -v lo="$loss" -v p="$mb_path" -v xf="$x_fwd" -v xb="$x_bwd" -v free="$([ "$name" = linkfree ] && echo 1 || echo 0)" 'BEGIN {
        step = b * s / t; L = d / 1000; bound = f + 2 * (S - 1) * L
        lb = free ? f : p + 2 * (S - 1) * L + (M + S - 2) * xf + (S - 1) * xb
        if (lb < bound) lb = bound
        printf "%-18s %8.3f %8.2f %10.3f %8.2f %10.3f %8.2f %10.4f\n", n, step, step / f, bound, step / bound, lb, step / lb, lo }'
    done
  done
  echo
  echo "step s: mean over steps 2.. of the slowest worker's step. bound: the link-free step ($first) plus the 2(S-1)" \
       "one-way delays a synchronous pipeline step cannot avoid (bytes/rate not counted). bytes lb: a synchronous" \
       "step's lower bound with the bytes: the larger of bound and one microbatch's compute through all stages" \
       "($(awk -v p="$mb_path" 'BEGIN{printf "%.3f", p}') s) + 2(S-1) delays + (M+S-2) activation and (S-1) gradient" \
       "messages on the wire ($(awk -v x="$x_fwd" 'BEGIN{printf "%.4f", x}') s and $(awk -v x="$x_bwd" 'BEGIN{printf "%.4f", x}') s each at $rate):" \
       "the last microbatch waits behind M-1 others on the first link, then crosses every link down and back." \
       "Targets (issue 16): every synchronous schedule <= 1.25x its bound; an asynchronous one <= 2x the link-free step."
  exit 0
fi
echo "bench_wan: $MODEL GPT, $STAGES stages ($SCHEDULE, $MICROBATCHES microbatches, batch $BATCH), $STEPS steps," \
     "links ${LINK[*]}; output in $OUT" >&2
run ceiling
run none "${LINK[@]}"
run int8 "${LINK[@]}" --compress-fwd int8 --compress-bwd int8
run subspace_int8 "${LINK[@]}" --subspace-k "$SUBSPACE_K" --compress-fwd int8 --compress-bwd int8

read -r c_tps _ _ _ _ < <(stats "$OUT/ceiling.jsonl")
read -r _ _ _ n_wire _ < <(stats "$OUT/none.jsonl")
printf '\n%-22s %10s %8s %10s %10s %10s %8s %8s %7s\n' run "tokens/s" "x ceil" "loss" "val loss" "wire MB" "raw/wire" "saved" "wall s"
for name in ceiling none int8 subspace_int8; do
  read -r tps loss val wire raw < <(stats "$OUT/$name.jsonl")
  wall=$(awk -v n="$name" '$1 == n {print $2}' "$OUT/wall.txt")
  label="$name"
  [ "$name" = ceiling ] && label="ceiling (no limit)"
  [ "$name" = subspace_int8 ] && label="subspace k=$SUBSPACE_K+int8"
  awk -v l="$label" -v t="$tps" -v c="$c_tps" -v lo="$loss" -v v="$val" -v w="$wire" -v r="$raw" -v nw="$n_wire" \
      -v wl="$wall" 'BEGIN {
    ratio = (w > 0) ? sprintf("%.2fx", r / w) : "-"
    saved = (nw > 0) ? sprintf("%.1f%%", 100 * (1 - w / nw)) : "-"
    printf "%-22s %10.0f %8.2f %10.4f %10.4f %10.2f %8s %8s %7s\n", l, t, t / c, lo, v, w / 1e6, ratio, saved, wl }'
done
echo
echo "targets: compressed tokens/s >= 0.9x the ceiling; int8 loss within 2% of none at the same step." \
     "'saved' is wire bytes against the none run; the subspace run is a different (subspace) model."
