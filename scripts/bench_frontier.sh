#!/usr/bin/env bash
# The compression frontier (issue 15): a grid of codec chains on the pipeline's links, on two text corpora and two
# model shapes, several seeds each, against the uncompressed model with the same seed. Prints one table per
# (corpus, shape) with bytes per token, the ratio to `none`, the validation-loss gap and the Pareto front, then a
# summary per codec over all cells against the issue's target (ratio >= 50 and gap <= 2% in every cell).
#
#   scripts/bench_frontier.sh [LONGHAUL]      (default: build/bin/longhaul)
# Steps: 1000 by default. At 300 (the issue's table; STEPS=300, about a third of the time) the uncompressed model's
# loss on the C++ corpus still falls about 3% per 50 steps, and lossy chains look far better than they are (d_model
# 128): int4+zstd is +0.8% at 300 steps and +6.0% at 1000; k16/int4+zstd +3.3% and +17.6%. A run takes about 100 s
# at d_model 128 on 2 cores.
# Environment: STAGES (4: workers = pp = STAGES), STEPS (1000), BATCH (8), MICROBATCHES (4), SEEDS ("1 2 3"),
#   CODECS ("none int8 int4 int8+zstd int4+zstd spikes+int4+zstd k24/int8 k24/int4+zstd k16/int4+zstd
#     lowrank:rank=8+int8"):
#     whitespace-separated entries
#     [kK/]FWD[|BWD]: FWD is the codec spec of both directions unless |BWD gives the backward one (quote the
#     variable: `|` is the shell's pipe); a kK/ prefix adds --subspace-k K (a subspace model: a model change,
#     compared with the standard model's `none` run, as Protocol Models do). `none` always runs first per
#     (corpus, shape, seed) as the baseline, and is added when missing. An entry whose codec spec longhaul
#     rejects is reported once and skipped for the rest of the grid.
#   CORPORA ("fortunes cpp"): fortunes = the default corpus (no --data); cpp = the C++ standard library headers
#     (`find /usr/include/c++ -type f`, sorted, concatenated, first 4,000,000 bytes), written once to $OUT/cpp.txt;
#     anything else is the path of a text file. Every corpus must hold at least 1,000,000 bytes.
#   SHAPES ("small d192"): tiny|small|base = --model NAME; dNNN = --model small --d-model NNN; anything else is a
#     literal list of model flags with commas for spaces, e.g. "--layers,8" or "--model,small,--seq,64".
#   OUT (a fresh temp dir): per run <corpus>.<shape>.<entry>.s<seed>.{jsonl,log} (entry with / -> _ and | -> ~),
#     results.tsv (one line per run), wall.txt and frontier.md (the tables in markdown). Resumable: a run whose
#     metrics already hold the validation loss of step STEPS is not run again, so OUT=<same dir> continues a grid.
# A failed run is retried once (as bench_wan.sh does); one that fails twice is reported and missing in the tables,
# and the script exits 1 after printing them.
# Bytes per token: wire bytes sent over all STAGES-1 stage links (forward: role act; backward: role act_grad; the
# end-of-job validation pass travels as role other and is not counted) over the training tokens STEPS x BATCH x seq
# (seq from the run's log, else from the shape's flags).
set -euo pipefail

LH="${1:-build/bin/longhaul}"
STAGES="${STAGES:-4}"
STEPS="${STEPS:-1000}"
BATCH="${BATCH:-8}"
MICROBATCHES="${MICROBATCHES:-4}"
SEEDS="${SEEDS:-1 2 3}"
CODECS="${CODECS:-none int8 int4 int8+zstd int4+zstd spikes+int4+zstd k24/int8 k24/int4+zstd k16/int4+zstd lowrank:rank=8+int8}"
CORPORA="${CORPORA:-fortunes cpp}"
SHAPES="${SHAPES:-small d192}"
OUT="${OUT:-$(mktemp -d /tmp/lh_bench_frontier.XXXXXX)}"
FORTUNES_DIR=/usr/share/games/fortunes  # core/dataset.h kDefaultCorpusDir
MIN_BYTES=1000000
CPP_BYTES=4000000
me=bench_frontier.sh
command -v jq >/dev/null || { echo "$me: needs jq (apt-get install jq)" >&2; exit 1; }
[ -x "$LH" ] || { echo "$me: no longhaul binary at $LH" >&2; exit 1; }
mkdir -p "$OUT"
die() { echo "$me: $*" >&2; exit 1; }

# --- codec entries: none first, each entry once -----------------------------------------------------------------
read -r -a codec_list <<<"$CODECS"
ENTRIES=(none)
for e in "${codec_list[@]}"; do
  [[ " ${ENTRIES[*]} " == *" $e "* ]] && continue
  [[ "$e" =~ ^(k([0-9]+)/)?([^|]+)(\|([^|]+))?$ ]] || die "codec entry '$e' is not [kK/]FWD[|BWD]"
  ENTRIES+=("$e")
done
entry_flags() {  # entry -> eflags (the codec and subspace flags)
  [[ "$1" =~ ^(k([0-9]+)/)?([^|]+)(\|([^|]+))?$ ]]
  local k="${BASH_REMATCH[2]}" fwd="${BASH_REMATCH[3]}" bwd="${BASH_REMATCH[5]:-${BASH_REMATCH[3]}}"
  eflags=(--compress-fwd "$fwd" --compress-bwd "$bwd")
  [ -n "$k" ] && eflags+=(--subspace-k "$k")
  return 0
}
tag_of() { local t="${1//\//_}"; t="${t//|/\~}"; printf '%s' "$t"; }

# --- corpora ------------------------------------------------------------------------------------------------------
declare -A cpath csize ctag cdesc
read -r -a corpus_list <<<"$CORPORA"
for c in "${corpus_list[@]}"; do
  case "$c" in
    fortunes)
      # The bytes the binary reads: the fortune files (not .dat, not the .u8 links), '%' separator lines emptied.
      n=0
      if [ -d "$FORTUNES_DIR" ]; then
        n=$(find "$FORTUNES_DIR" -maxdepth 1 -type f ! -name '.*' ! -name '*.dat' ! -name '*.u8' -print0 |
              LC_ALL=C sort -z | xargs -0 -r cat | sed 's/^%$//' | wc -c)
      fi
      cpath[$c]=""; ctag[$c]=fortunes; cdesc[$c]="$FORTUNES_DIR"
      [ "$n" -gt 0 ] || die "corpus fortunes: no fortune text in $FORTUNES_DIR (install the packages with scripts/setup.sh)" ;;
    cpp)
      f="$OUT/cpp.txt"
      if [ ! -s "$f" ]; then
        [ -d /usr/include/c++ ] || die "corpus cpp: /usr/include/c++ is missing (apt-get install libstdc++-12-dev or g++)"
        # head closes the pipe after 4 MB: cat's SIGPIPE is expected, so pipefail is off for this pipeline only.
        ( set +o pipefail
          find /usr/include/c++ -type f -print0 | LC_ALL=C sort -z | xargs -0 cat 2>/dev/null | head -c "$CPP_BYTES"
        ) >"$f.tmp"
        mv "$f.tmp" "$f"
      fi
      n=$(wc -c <"$f")
      cpath[$c]="$f"; ctag[$c]=cpp; cdesc[$c]="C++ standard library headers, $f" ;;
    *)
      [ -f "$c" ] || die "corpus '$c' is neither fortunes, cpp nor a text file"
      n=$(wc -c <"$c")
      t=$(basename "$c"); t=$(printf '%s' "$t" | tr -c 'A-Za-z0-9._=+-' '_')
      cpath[$c]="$c"; ctag[$c]="$t"; cdesc[$c]="$c" ;;
  esac
  csize[$c]=$n
  [ "$n" -ge "$MIN_BYTES" ] ||
    die "corpus '$c' (${cdesc[$c]}) has $n bytes, under the $MIN_BYTES a frontier cell needs for a meaningful validation split"
done

# --- shapes -------------------------------------------------------------------------------------------------------
declare -A sflags_of stag
read -r -a shape_list <<<"$SHAPES"
for s in "${shape_list[@]}"; do
  case "$s" in
    tiny|small|base) sflags_of[$s]="--model $s" ;;
    d[0-9]*) [[ "$s" =~ ^d([0-9]+)$ ]] || die "shape '$s': dNNN takes digits only"
             sflags_of[$s]="--model small --d-model ${BASH_REMATCH[1]}" ;;
    *) sflags_of[$s]="${s//,/ }" ;;
  esac
  t=$(printf '%s' "$s" | sed 's/^-*//' | tr -c 'A-Za-z0-9._=+-' '_'); stag[$s]="$t"
done
seq_of_flags() {  # model flags (words) -> the context length they give (core/gpt.cpp presets, then --seq)
  local model=small seq="" prev=""
  for w in "$@"; do
    [ "$prev" = --model ] && model="$w"
    [ "$prev" = --seq ] && seq="$w"
    prev="$w"
  done
  if [ -z "$seq" ]; then case "$model" in tiny) seq=64 ;; base) seq=256 ;; *) seq=128 ;; esac; fi
  echo "$seq"
}

# --- runs ---------------------------------------------------------------------------------------------------------
stats() {  # metrics file -> "val fwd_wire fwd_raw bwd_wire bwd_raw"; val is null unless step STEPS has a val_loss
  jq -nrR --argjson steps "$STEPS" '
    [inputs | fromjson? | objects] as $r |
    ($r | map(select(.val_loss != null)) | sort_by(.step) | last) as $v |
    [$r[] | .links[]? | select(.dir == "send")] as $ls |
    def total(role; f): [$ls[] | select(.role == role) | .[f]] | add // 0;
    "\(if $v != null and $v.step == $steps then $v.val_loss else null end) \(total("act"; "wire_bytes"))" +
    " \(total("act"; "raw_bytes")) \(total("act_grad"; "wire_bytes")) \(total("act_grad"; "raw_bytes"))"' "$1"
}
done_already() { [ -s "$1" ] && [ "$(stats "$1" | cut -d' ' -f1)" != null ]; }

run_err=""
run() {  # name, flags... -> 0 ran, 1 failed twice, 2 codec spec rejected (run_err: longhaul's error line)
  local name="$1"; shift
  local log="$OUT/$name.log" t0 t1
  t0=$(date +%s.%N)
  if ! "$LH" --log-level warn launch "$@" --metrics "$OUT/$name.jsonl" >"$log" 2>&1; then
    # longhaul's error line without its [file:line] trail
    run_err=$(grep -m1 'longhaul: error' "$log" | sed 's/ \[[^]]*:[0-9]*\]//g' | cut -c1-240 || true)
    [ -n "$run_err" ] || run_err=$(tail -1 "$log" | cut -c1-240)
    if grep -q 'codec spec' "$log"; then rm -f "$OUT/$name.key"; return 2; fi
    # Seen on a heavily loaded machine: UCX reports a live peer's endpoint as timed out at start-up.
    echo "$me: run '$name' failed ($run_err); retrying once" >&2
    mv "$log" "$OUT/$name.failed.log"
    t0=$(date +%s.%N)
    if ! "$LH" --log-level warn launch "$@" --metrics "$OUT/$name.jsonl" >"$log" 2>&1; then
      echo "$me: run '$name' failed again; marked missing. Its log ends:" >&2
      tail -5 "$log" | sed 's/^/    /' >&2
      rm -f "$OUT/$name.key"
      return 1
    fi
  fi
  t1=$(date +%s.%N)
  rm -f "$OUT/$name.key"  # the job secret the coordinator wrote next to the metrics
  echo "$name $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')" >>"$OUT/wall.txt"
  return 0
}

read -r -a seed_list <<<"$SEEDS"
total=$(( ${#corpus_list[@]} * ${#shape_list[@]} * ${#seed_list[@]} * ${#ENTRIES[@]} ))
echo "$me: $total runs (${#corpus_list[@]} corpora x ${#shape_list[@]} shapes x ${#seed_list[@]} seeds x" \
     "${#ENTRIES[@]} codecs), $STEPS steps each; output in $OUT" >&2
declare -A rejected
n_run=0 n_done=0 n_failed=0 n_rejected=0 i=0
grid_t0=$(date +%s.%N)
for c in "${corpus_list[@]}"; do
  data=()
  [ -n "${cpath[$c]}" ] && data=(--data "${cpath[$c]}")
  for s in "${shape_list[@]}"; do
    read -r -a shape_flags <<<"${sflags_of[$s]}"
    for seed in "${seed_list[@]}"; do
      for e in "${ENTRIES[@]}"; do   # none first: the baseline of this (corpus, shape, seed)
        i=$((i + 1))
        name="${ctag[$c]}.${stag[$s]}.$(tag_of "$e").s$seed"
        if [ -n "${rejected[$e]:-}" ]; then continue; fi
        if done_already "$OUT/$name.jsonl"; then n_done=$((n_done + 1)); continue; fi
        entry_flags "$e"
        t0=$(date +%s)
        rc=0
        run "$name" --workers "$STAGES" --pp "$STAGES" "${shape_flags[@]}" "${data[@]}" --steps "$STEPS" \
            --batch "$BATCH" --microbatches "$MICROBATCHES" --eval-every 0 --seed "$seed" "${eflags[@]}" || rc=$?
        case $rc in
          0) n_run=$((n_run + 1)); echo "$me: [$i/$total] $name: $(( $(date +%s) - t0 )) s" >&2 ;;
          1) n_failed=$((n_failed + 1)) ;;
          2) rejected[$e]="${run_err:-rejected}"; n_rejected=$((n_rejected + 1))
             echo "$me: codec entry '$e' rejected by longhaul ($run_err); skipped for the rest of the grid" >&2 ;;
        esac
      done
    done
  done
done
grid_wall=$(awk -v a="$grid_t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.0f", b-a}')

# --- results: one line per run ------------------------------------------------------------------------------------
declare -A sdesc_of
results="$OUT/results.tsv"
printf 'corpus\tshape\tentry\tseed\tstatus\tval_loss\tfwd_wire\tfwd_raw\tbwd_wire\tbwd_raw\ttokens\n' >"$results"
cells="$OUT/cells.tsv"
: >"$cells"
for c in "${corpus_list[@]}"; do
  for s in "${shape_list[@]}"; do
    read -r -a shape_flags <<<"${sflags_of[$s]}"
    for e in "${ENTRIES[@]}"; do
      for seed in "${seed_list[@]}"; do
        name="${ctag[$c]}.${stag[$s]}.$(tag_of "$e").s$seed"
        f="$OUT/$name.jsonl" log="$OUT/$name.log"
        # The model as the run describes it ("layers=4 d_model=128 heads=4 seq=128 vocab=256 head=untied").
        desc=""
        [ -f "$log" ] && desc=$(sed -n 's/^longhaul launch: \(layers=[^,]*\), .*/\1/p' "$log" | head -1)
        if [ -n "$desc" ] && [ "$e" = none ] && [ -z "${sdesc_of[$s]:-}" ]; then sdesc_of[$s]="$desc"; fi
        seq=$(printf '%s\n' "$desc" | sed -n 's/.* seq=\([0-9]*\).*/\1/p')
        [ -n "$seq" ] || seq=$(seq_of_flags "${shape_flags[@]}")
        tokens=$((STEPS * BATCH * seq))
        status=missing val=null fw=0 fr=0 bw=0 br=0
        if [ -s "$f" ]; then read -r val fw fr bw br < <(stats "$f"); fi
        if [ "$val" != null ]; then status=ok; elif [ -n "${rejected[$e]:-}" ]; then status=rejected; fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$c" "$s" "$e" "$seed" "$status" "$val" "$fw" "$fr" \
          "$bw" "$br" "$tokens" >>"$results"
      done
    done
    desc="${sdesc_of[$s]:-${sflags_of[$s]}}"
    printf '%s\t%s\t%s\n' "$c" "$s" "$desc" >>"$cells"
  done
done

# --- tables -------------------------------------------------------------------------------------------------------
tables() {  # text|md
  awk -F'\t' -v fmt="$1" -v entries="${ENTRIES[*]}" -v steps="$STEPS" -v batch="$BATCH" -v stages="$STAGES" '
    function abs(x) { return x < 0 ? -x : x }
    function row(cols, n,   k, s, w) {  # cols[1..n]; text: first column left-aligned, others right-aligned
      if (fmt == "md") {
        s = "|"
        for (k = 1; k <= n; k++) s = s " " cols[k] " |"
        print s; return
      }
      s = sprintf("%-" wname "s", cols[1])
      for (k = 2; k <= n; k++) { w = W[k]; s = s sprintf(" %" w "s", cols[k]) }
      sub(/ +$/, "", s); print s
    }
    function header(n,   k, s) {
      row(H, n)
      if (fmt == "md") { s = "|---|"; for (k = 2; k <= n; k++) s = s "---:|"; print s }
    }
    function label(e) {
      if (fmt != "md") return e
      gsub(/\|/, "\\|", e); return "`" e "`"
    }
    function sg(x) { return sprintf("%+.2f", x) }
    FNR == NR { nc++; cc[nc] = $1; cs[nc] = $2; ct[nc] = $3; next }
    FNR == 1 { next }  # results.tsv header
    {
      k = $1 SUBSEP $2 SUBSEP $3
      if ($5 == "rejected") rej[$3] = 1
      if ($5 != "ok") next
      n[k]++; sf[k] += $7 / $11; sb[k] += $9 / $11; sv[k] += $6
      val[k, $4] = $6; seeds[k] = seeds[k] " " $4
    }
    END {
      ne = split(entries, E, " ")
      wname = 5
      for (j = 1; j <= ne; j++) if (length(E[j]) > wname) wname = length(E[j])
      H[1] = "codec"; H[2] = "B/tok fwd"; H[3] = "B/tok bwd"; H[4] = "ratio"; H[5] = "val loss"; H[6] = "gap %"
      H[7] = "gap min..max"; H[8] = "n"; H[9] = "pareto"
      W[2] = 10; W[3] = 10; W[4] = 8; W[5] = 9; W[6] = 7; W[7] = 14; W[8] = 3; W[9] = 6
      for (i = 1; i <= nc; i++) {
        kn = cc[i] SUBSEP cs[i] SUBSEP "none"
        nw = n[kn] > 0 ? (sf[kn] + sb[kn]) / n[kn] : 0
        for (j = 1; j <= ne; j++) {
          k = cc[i] SUBSEP cs[i] SUBSEP E[j]
          ok[j] = n[k] > 0; def[j] = 0; NG[j] = 0
          if (!ok[j]) continue
          F[j] = sf[k] / n[k]; B[j] = sb[k] / n[k]; V[j] = sv[k] / n[k]
          R[j] = (nw > 0 && F[j] + B[j] > 0) ? nw / (F[j] + B[j]) : -1
          ng = 0; gs = 0
          m = split(seeds[k], S, " ")
          for (t = 1; t <= m; t++) {
            if (!((kn, S[t]) in val)) continue
            g = 100 * (val[k, S[t]] - val[kn, S[t]]) / val[kn, S[t]]
            if (ng == 0 || g < GMIN[j]) GMIN[j] = g
            if (ng == 0 || g > GMAX[j]) GMAX[j] = g
            ng++; gs += g
          }
          NG[j] = ng
          if (ng > 0) G[j] = gs / ng
          def[j] = (R[j] > 0 && ng > 0)
        }
        for (j = 1; j <= ne; j++) {
          P[j] = def[j]
          for (l = 1; l <= ne && P[j]; l++)
            if (l != j && def[l] && R[l] >= R[j] && G[l] <= G[j] && (R[l] > R[j] || G[l] < G[j])) P[j] = 0
        }
        title = cc[i] " / " cs[i]
        sub_ = ct[i] "; " steps " steps x batch " batch " per run; B/tok summed over the " (stages - 1) " stage links"
        if (fmt == "md") { print "### " title; print ""; print sub_; print "" }
        else { print title "  (" sub_ ")" }
        header(9)
        for (j = 1; j <= ne; j++) {
          e = E[j]; C[1] = label(e)
          if (!ok[j]) {
            C[2] = (e in rej) ? "rejected" : "missing"
            for (t = 3; t <= 9; t++) C[t] = "-"
            C[8] = 0; row(C, 9); continue
          }
          C[2] = sprintf("%.1f", F[j]); C[3] = sprintf("%.1f", B[j])
          C[4] = R[j] > 0 ? sprintf("%.2f", R[j]) : "-"
          C[5] = sprintf("%.4f", V[j])
          C[6] = NG[j] ? sg(G[j]) : "-"
          C[7] = NG[j] ? sg(GMIN[j]) ".." sg(GMAX[j]) : "-"
          C[8] = NG[j] ? NG[j] : n[cc[i] SUBSEP cs[i] SUBSEP e] " (no none)"
          C[9] = P[j] ? "*" : ""
          row(C, 9)
          if (def[j]) {
            cells[e]++; sr[e] += R[j]; sgap[e] += G[j]
            if (!(e in worst) || G[j] > worst[e]) worst[e] = G[j]
            if (R[j] < 50) lowr[e] = 1
            if (G[j] > 2) highg[e] = 1
          }
        }
        print ""
      }
      print (fmt == "md" ? "### summary over " : "summary over ") nc " cells (corpus x shape); target (issue 15): ratio >= 50 and gap <= 2% in every cell"
      if (fmt == "md") print ""
      H[1] = "codec"; H[2] = "mean ratio"; H[3] = "mean gap %"; H[4] = "worst gap %"; H[5] = "cells"; H[6] = "target"
      W[2] = 10; W[3] = 10; W[4] = 11; W[5] = 6; W[6] = 20
      header(6)
      for (j = 1; j <= ne; j++) {
        e = E[j]; C[1] = label(e); c = cells[e] + 0
        if (c == 0) {
          C[2] = (e in rej) ? "rejected" : "missing"; C[3] = "-"; C[4] = "-"; C[5] = "0/" nc; C[6] = "-"
          row(C, 6); continue
        }
        C[2] = sprintf("%.2f", sr[e] / c); C[3] = sg(sgap[e] / c); C[4] = sg(worst[e]); C[5] = c "/" nc
        why = ""
        if (lowr[e]) why = "ratio"
        if (highg[e]) why = why (why == "" ? "" : ", ") "gap"
        if (c < nc) why = why (why == "" ? "" : ", ") "missing cells"
        C[6] = why == "" ? "yes" : "no (" why ")"
        row(C, 6)
      }
    }' "$cells" "$results"
}

settings() {  # text|md
  local b="" c s list="" shapes=""
  [ "$1" = md ] && b="- "
  for c in "${corpus_list[@]}"; do list+="${list:+, }$c (${csize[$c]} bytes: ${cdesc[$c]})"; done
  for s in "${shape_list[@]}"; do shapes+="${shapes:+, }$s = ${sflags_of[$s]} (${sdesc_of[$s]:-not run})"; done
  echo "${b}bench_frontier: $STAGES pipeline stages ($MICROBATCHES microbatches), $STEPS steps, batch $BATCH," \
       "seeds ${seed_list[*]}; validation loss at the last step; $LH; output in $OUT"
  echo "${b}corpora: $list"
  echo "${b}shapes: $shapes"
  echo "${b}codecs: ${ENTRIES[*]}"
  echo "${b}grid wall time: ${grid_wall} s ($n_run runs now, $n_done already done in OUT, $n_failed failed twice," \
       "$n_rejected codec entries rejected by longhaul)"
}
notes() {
  echo "B/tok: wire bytes per training token (steps x batch x seq), forward activations (act) and backward" \
       "activation gradients (act_grad), as sent, summed over all stage links; the final validation pass is not" \
       "counted. ratio: none's fwd+bwd B/tok over the row's (kK/ rows: a subspace model, --subspace-k K, against" \
       "the standard model's none). gap: mean over seeds of 100 x (val - val of none, same seed) / val of none;" \
       "n: seeds with both runs. pareto *: no other row has ratio >= and gap <=, one of them strictly."
}

{ settings text; echo; tables text; echo; notes; } 
{ echo "## The compression frontier (issue 15)"; echo; settings md; echo; tables md; echo; notes; } >"$OUT/frontier.md"
echo "$me: tables also in $OUT/frontier.md; per-run numbers in $results" >&2
[ "$n_failed" -eq 0 ] || die "$n_failed run(s) failed twice and are missing from the tables (their logs are in $OUT)"
