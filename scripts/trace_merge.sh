#!/usr/bin/env bash
# Merges the per-worker timelines a job writes with LH_TRACE=DIR (DIR/trace.rank<R>.jsonl, Chrome trace events) into
# DIR/trace.json, which chrome://tracing or Perfetto opens with one row per worker, and prints where each worker's
# time went per step (mean over the steps after the first): compute (F, B), waiting for a neighbour (RA, RG),
# encoding and posting sends (SA, SG), the end-of-step waits (wait_sends, norm), the update and evaluation.
#
#   LH_TRACE=/tmp/tr longhaul launch ...   then   scripts/trace_merge.sh /tmp/tr
set -euo pipefail
DIR="${1:?usage: trace_merge.sh DIR}"
command -v jq >/dev/null || { echo "trace_merge.sh: needs jq (apt-get install jq)" >&2; exit 1; }
shopt -s nullglob
files=("$DIR"/trace.rank*.jsonl)
[ ${#files[@]} -gt 0 ] || { echo "trace_merge.sh: no trace.rank*.jsonl in $DIR" >&2; exit 1; }
jq -s '{traceEvents: .}' "${files[@]}" >"$DIR/trace.json"
echo "trace_merge.sh: $DIR/trace.json (${#files[@]} workers)" >&2
jq -rs '
  def kind: .name | sub("[0-9]+$"; "");
  (map(.args.step) | max) as $last |
  map(select(.args.step > 1 and .args.step < $last)) as $ev |
  ($ev | map(.args.step) | unique | length) as $n |
  ($ev | map(kind) | unique) as $kinds |
  "rank " + ($kinds | map(. as $k | "\($k)" | .[0:11]) | map(("            " + .)[-12:]) | join("")) + "   (ms per step, mean of \($n) steps)",
  ($ev | group_by(.pid)[] | . as $r |
    ("\($r[0].pid)" | ("    " + .)[-4:]) + " " +
    ($kinds | map(. as $k | ([$r[] | select(kind == $k) | .dur] | add // 0) / 1000 / $n |
      (. * 10 | round / 10 | tostring) | ("            " + .)[-12:]) | join("")))
' "${files[@]}"
