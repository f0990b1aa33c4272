#!/usr/bin/env bash
# Issue 37's liveness figure at full size: a checkpoint of `--model base --pp 4` (about 44 MB a worker) over a
# 20 Mbit/s link per worker (network namespaces, tc tbf: scripts/wan.sh). Each shard takes ~18 s on its link, well
# past the 5 s heartbeat timeout; it goes up in acknowledged parts the heartbeats pass, so the job checkpoints and
# finishes. CI runs the same at a smaller scale (the small model over 1 Mbit/s, tests/integration/test_launch_*.cpp). Root.
#
#   scripts/checkpoint_slow_link.sh [LONGHAUL]      (default: build/bin/longhaul)
# Environment: RATE (20M), MODEL (base), PP (4), STEPS (2), BATCH (4), SEQ (64), OUT (a fresh temp dir: log, metrics,
#   checkpoints). Prints the shard sizes, the seconds from the job's start to its end, whether any worker was
#   declared dead or the job rolled back, and exits 1 when the checkpoint did not commit.
set -euo pipefail

LH="${1:-build/bin/longhaul}"
RATE="${RATE:-20M}"
MODEL="${MODEL:-base}"
PP="${PP:-4}"
STEPS="${STEPS:-2}"
BATCH="${BATCH:-4}"
SEQ="${SEQ:-64}"
OUT="${OUT:-$(mktemp -d /tmp/lh_ckpt_slow.XXXXXX)}"
[ "$(id -u)" -eq 0 ] || { echo "checkpoint_slow_link.sh: needs root (namespaces, tc)" >&2; exit 1; }
[ -x "$LH" ] || { echo "checkpoint_slow_link.sh: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"
rm -rf "$OUT/ckpt"
start=$(date +%s.%N)
set +e
OMP_WAIT_POLICY=PASSIVE "$LH" --log-level warn launch --workers "$PP" --pp "$PP" --worker-threads 1 --netns "$RATE" \
  --model "$MODEL" --batch "$BATCH" --seq "$SEQ" --steps "$STEPS" --checkpoint-every "$STEPS" \
  --checkpoint-dir "$OUT/ckpt" --metrics "$OUT/metrics.jsonl" >"$OUT/launch.log" 2>&1
code=$?
set -e
end=$(date +%s.%N)
manifest="$OUT/ckpt/$(printf 'step_%08d' "$STEPS")/manifest.json"
echo "model $MODEL, pp $PP, $RATE per worker link, $STEPS steps, checkpoint at step $STEPS"
for f in "$OUT"/ckpt/step_*/rank_*.shard; do
  [ -f "$f" ] && printf '  %s: %.1f MB (%.1f s at %s)\n' "${f#"$OUT"/ckpt/}" "$(stat -c %s "$f" | awk '{print $1/1e6}')" \
    "$(stat -c %s "$f" | awk -v r="${RATE%M}" '{print $1*8/(r*1e6)}')" "$RATE"
done
printf 'launch exited %d after %.1f s\n' "$code" "$(awk -v a="$start" -v b="$end" 'BEGIN {print b - a}')"
echo "declared dead: $(grep -c 'declared dead' "$OUT/launch.log" || true); rollbacks: $(grep -c 'goes back to step' "$OUT/launch.log" || true)"
if [ "$code" -ne 0 ] || [ ! -f "$manifest" ]; then
  echo "the checkpoint did not commit; see $OUT/launch.log" >&2
  tail -20 "$OUT/launch.log" >&2
  exit 1
fi
echo "committed: $manifest"
